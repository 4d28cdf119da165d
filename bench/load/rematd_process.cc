#include "bench/load/rematd_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <utility>

namespace remat::bench {

RematdProcess RematdProcess::Start(const std::string& rematd, const std::string& db,
                                   const std::string& log,
                                   const std::vector<std::string>& extra_args) {
  RematdProcess r;
  std::vector<std::string> args = {rematd, "--listen", "127.0.0.1:0", "--db", db};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  const bool wait_for_metrics =
      std::find(extra_args.begin(), extra_args.end(), "--metrics-listen") != extra_args.end();
  int out[2];
  if (pipe(out) != 0) return r;
  r.pid = fork();
  if (r.pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    const int err = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(err, 2);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(rematd.c_str(), argv.data());
    _exit(127);
  }
  close(out[1]);
  FILE* f = fdopen(out[0], "r");
  char line[512];
  const std::string marker = "rematd listening on ";
  const std::string metrics = "rematd metrics on port ";
  while (fgets(line, sizeof(line), f) != nullptr) {
    const std::string s(line);
    if (auto at = s.find(marker); at != std::string::npos) {
      r.address = s.substr(at + marker.size());
      while (!r.address.empty() && (r.address.back() == '\n' || r.address.back() == '\r')) {
        r.address.pop_back();
      }
      if (!wait_for_metrics) break;
    } else if (auto m = s.find(metrics); m != std::string::npos) {
      r.metrics_port = std::atoi(s.c_str() + m + metrics.size());
      break;
    }
  }
  // The pipe stays open: rematd writes nothing more to it, and a closed pipe would not matter.
  return r;
}

double RematdProcess::CpuSeconds() const {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double RematdProcess::StatusMiB(const std::string& key) const {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) / 1024.0;
  }
  return 0;
}

int RematdProcess::Stop(int signal_number) {
  if (pid <= 0) return -1;
  kill(pid, signal_number);
  int status = 0;
  waitpid(pid, &status, 0);
  pid = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string ScrapeMetrics(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[8192];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return out;
}

double ServerQuantileMs(const std::string& page, const std::string& method, double q) {
  std::map<double, double> summed;  // le -> cumulative count over every code
  std::istringstream lines(page);
  std::string line;
  const std::string want = "method=\"" + method + "\"";
  while (std::getline(lines, line)) {
    if (line.rfind("remat_rpc_duration_seconds_bucket{", 0) != 0) continue;
    if (line.find(want) == std::string::npos) continue;
    auto le = line.find("le=\"");
    if (le == std::string::npos) continue;
    const std::string bound = line.substr(le + 4, line.find('"', le + 4) - le - 4);
    const double count = std::stod(line.substr(line.rfind(' ') + 1));
    summed[bound == "+Inf" ? 1e9 : std::stod(bound)] += count;
  }
  std::vector<std::pair<double, double>> buckets(summed.begin(), summed.end());
  if (buckets.empty() || buckets.back().second == 0) return -1;
  std::sort(buckets.begin(), buckets.end());
  const double total = buckets.back().second;
  for (const auto& [le, count] : buckets) {
    if (count >= q * total) return le * 1000;
  }
  return -1;
}

}  // namespace remat::bench
