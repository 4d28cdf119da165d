#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "search/frontier.h"
#include "search/rules.h"
#include "worker/process_runner.h"

extern char** environ;

namespace remat::integration {
namespace {

namespace fs = std::filesystem;

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

uint64_t Fnv(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ (seed * 1099511628211ull);
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

bool CanConnect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

// ---- Daemon ------------------------------------------------------------------------------------

Daemon::Daemon(std::string name, std::vector<std::string> argv, std::string log_path)
    : name_(std::move(name)), log_path_(std::move(log_path)) {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path_.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  std::vector<char*> c_argv;
  for (auto& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  if (posix_spawn(&pid_, c_argv[0], &actions, &attr, c_argv.data(), environ) != 0) pid_ = -1;
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
}

Daemon::~Daemon() {
  if (running()) {
    Kill(SIGKILL);
    Wait(10);
  }
}

bool Daemon::running() {
  if (pid_ <= 0 || reaped_) return false;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    status_ = status;
    return false;
  }
  return true;
}

void Daemon::Kill(int sig) {
  if (pid_ > 0 && !reaped_) killpg(pid_, sig);
}

int Daemon::Wait(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (running()) {
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (pid_ <= 0) return -1;
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

// ---- Cluster -----------------------------------------------------------------------------------

Cluster::Cluster() {
  for (const char* v : {"REMAT_TOKEN", "REMAT_COORDINATOR", "REMAT_WORKER_TOKEN"}) unsetenv(v);
  std::string templ = (fs::temp_directory_path() / "remat-it-XXXXXX").string();
  dir_ = mkdtemp(templ.data());
  port_ = FreePort();
}

Cluster::~Cluster() {
  daemons_.clear();  // kills what still runs
  std::error_code ec;
  if (!::testing::Test::HasFailure()) fs::remove_all(dir_, ec);
}

Daemon* Cluster::StartCoordinator(std::vector<std::string> extra_args) {
  std::vector<std::string> argv = {
      REMATD_BIN,    "--listen", address(),         "--db", dir_ + "/remat.db",
      "--log-level", "info",     "--lease-timeout", "1",    "--heartbeat-interval",
      "0.2"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  const std::string name = "rematd-" + std::to_string(next_id_++);
  daemons_.push_back(std::make_unique<Daemon>(name, argv, dir_ + "/" + name + ".log"));
  Daemon* d = daemons_.back().get();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!CanConnect(port_)) {
    if (!d->running() || std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "rematd did not start listening on " << address() << "\n" << LogTails();
      return d;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return d;
}

Daemon* Cluster::StartWorker(int slots, std::vector<std::string> extra_args) {
  const std::string name = "worker-" + std::to_string(next_id_++);
  std::vector<std::string> argv = {REMAT_WORKER_BIN,  "--coordinator",       address(),
                                   "--plain-slots",   std::to_string(slots), "--work-dir",
                                   dir_ + "/" + name, "--log-level",         "info"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  daemons_.push_back(std::make_unique<Daemon>(name, argv, dir_ + "/" + name + ".log"));
  return daemons_.back().get();
}

CommandResult Cluster::Remat(std::vector<std::string> args, bool with_coordinator) {
  std::vector<std::string> argv = {REMAT_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  if (with_coordinator) {
    argv.push_back("--coordinator");
    argv.push_back(address());
    argv.push_back("--timeout");
    argv.push_back("10");
  }
  return Run(std::move(argv));
}

CommandResult Cluster::Run(std::vector<std::string> argv, double timeout_s) {
  worker::ChildSpec spec;
  spec.argv = std::move(argv);
  const std::string id = std::to_string(next_id_++);
  spec.stdout_path = dir_ + "/remat-" + id + ".out";
  spec.stderr_path = dir_ + "/remat-" + id + ".err";
  worker::GroupLimits limits;
  limits.timeout_s = timeout_s;
  worker::GroupOutcome o = worker::RunProcessGroup({spec}, limits, nullptr);
  CommandResult r;
  r.exit_code = o.children[0].exited ? o.children[0].exit_code : 128 + o.children[0].signal;
  r.out = ReadText(spec.stdout_path);
  r.err = ReadText(spec.stderr_path);
  return r;
}

std::string Cluster::WriteReplaySpec(const std::string& name, const nlohmann::json& table,
                                     const std::string& strategy, double budget_gib) {
  const std::string table_path = dir_ + "/" + name + "-table.json";
  std::ofstream(table_path) << table.dump(1);
  const std::string spec_path = dir_ + "/" + name + ".yaml";
  std::ofstream(spec_path) << "name: " << name << R"(
model:
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
  seq_length: 128
  vocab_size: 512
train:
  micro_batch_size: 1
search:
  memory_budget_gib: )" << budget_gib
                           << R"(
  strategy: )" << strategy << R"(
  max_trials: 40
  backend: replay
  replay_table: )" << name << "-table.json\n";
  return spec_path;
}

std::string Cluster::Submit(const std::string& spec_path, std::vector<std::string> extra_args) {
  std::vector<std::string> args = {"submit", spec_path};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  CommandResult r = Remat(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::string id = r.out;
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  size_t nl = id.rfind('\n');
  return nl == std::string::npos ? id : id.substr(nl + 1);
}

nlohmann::json Cluster::Get(const std::string& id, std::vector<std::string> extra_args) {
  std::vector<std::string> args = {"get", id, "--json"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  CommandResult r = Remat(args);
  if (r.exit_code != 0) return nlohmann::json();
  return nlohmann::json::parse(r.out, nullptr, false);
}

nlohmann::json Cluster::WaitFor(const std::string& id,
                                const std::function<bool(const nlohmann::json&)>& pred,
                                double timeout_s, std::vector<std::string> extra_args) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  nlohmann::json j;
  while (std::chrono::steady_clock::now() < deadline) {
    j = Get(id, extra_args);
    if (j.is_object() && pred(j)) return j;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ADD_FAILURE() << "search " << id << " did not reach the expected state in " << timeout_s
                << " s; last: " << j.dump() << "\n"
                << LogTails();
  return j;
}

nlohmann::json Cluster::WaitFinal(const std::string& id, double timeout_s,
                                  std::vector<std::string> extra_args) {
  return WaitFor(
      id,
      [](const nlohmann::json& j) {
        const std::string s = j.value("state", "");
        return s == "succeeded" || s == "failed" || s == "cancelled";
      },
      timeout_s, extra_args);
}

std::string Cluster::LogTails() const {
  std::string out;
  for (const auto& d : daemons_) {
    out += "---- " + d->name() + " (" + d->log_path() + "), last lines:\n";
    out += worker::FileTail(d->log_path(), 25, 6000) + "\n";
  }
  return out;
}

// ---- tables ------------------------------------------------------------------------------------

search::SearchSpec TestModel() {
  search::SearchSpec spec;
  spec.model.num_layers = 2;
  spec.model.hidden_size = 64;
  spec.model.num_attention_heads = 4;
  spec.model.seq_length = 128;
  spec.model.vocab_size = 512;
  return spec;
}

nlohmann::json MakeReplayTable(int seed, double wall_s, int missing) {
  nlohmann::json trials = nlohmann::json::object();
  int i = 0;
  for (const search::Policy& p : search::EnumerateValidPolicies(TestModel())) {
    const std::string name = p.ToString();
    ++i;
    if (i > 1 && i <= 1 + missing) continue;
    const uint64_t h = Fnv(name, static_cast<uint64_t>(seed));
    const uint64_t reserved = (2ull << 30) + h % (9ull << 30);  // 2 .. 11 GiB: some over budget
    const uint64_t allocated = reserved - (h >> 40) % (256ull << 20);
    nlohmann::json entry;
    const bool oom = (h >> 20) % 6 == 0 && !p.IsNone();
    entry["status"] = oom ? "oom" : "ok";
    if (!oom) entry["step_time_s"] = 0.1 + static_cast<double>((h >> 30) % 1000) / 2000.0;
    entry["wall_s"] = wall_s;
    entry["ranks"] = nlohmann::json::array(
        {{{"rank", 0}, {"peak_allocated_bytes", allocated}, {"peak_reserved_bytes", reserved}}});
    trials[name] = entry;
  }
  return {{"trials", trials}};
}

std::vector<std::string> ExpectedFrontier(const nlohmann::json& table,
                                          const std::vector<std::string>& ran, double budget_gib) {
  std::vector<search::TrialResult> results;
  for (const std::string& name : ran) {
    if (!table["trials"].contains(name)) continue;
    const auto& e = table["trials"][name];
    search::TrialResult r;
    r.policy = *search::ParsePolicy(name);
    r.status = e["status"] == "ok" ? search::TrialStatus::kOk : search::TrialStatus::kOom;
    search::RankResult rank;
    rank.peak_allocated_bytes = e["ranks"][0]["peak_allocated_bytes"].get<uint64_t>();
    rank.peak_reserved_bytes = e["ranks"][0]["peak_reserved_bytes"].get<uint64_t>();
    r.ranks.push_back(rank);
    if (e.contains("step_time_s")) {
      r.step_time_s = e["step_time_s"].get<double>();
      r.tokens_per_s = search::TokensPerSecond(TestModel(), r.step_time_s);
    }
    results.push_back(r);
  }
  std::vector<std::string> out;
  for (const auto& p :
       search::ComputeFrontier(results, search::MemoryMetric::kReserved,
                               static_cast<uint64_t>(budget_gib * 1024.0 * 1024.0 * 1024.0))) {
    out.push_back(p.policy.ToString());
  }
  return out;
}

// ---- sockets -----------------------------------------------------------------------------------

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  send(fd, request.data(), request.size(), 0);
  std::string response;
  char buf[8192];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, static_cast<size_t>(n));
  close(fd);
  size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

}  // namespace remat::integration
