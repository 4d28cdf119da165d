#include "worker/result_spool.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace remat::worker {

namespace fs = std::filesystem;

namespace {
// Trial ids come from the coordinator; keep only characters that are safe in a file name.
std::string SafeName(const std::string& s) {
  std::string out;
  for (char c : s) {
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  }
  return out;
}
}  // namespace

absl::Status ResultSpool::Init() {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return absl::InternalError("cannot create spool folder " + dir_ + ": " + ec.message());
  return absl::OkStatus();
}

std::string ResultSpool::PathOf(const v1::ReportTrialRequest& report) const {
  return (fs::path(dir_) /
          (SafeName(report.trial_id()) + "." + std::to_string(report.attempt()) + ".report"))
      .string();
}

absl::Status ResultSpool::Put(const v1::ReportTrialRequest& report) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string path = PathOf(report);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out || !report.SerializeToOstream(&out)) {
      return absl::InternalError("cannot write " + tmp);
    }
    out.flush();
    if (!out) return absl::InternalError("cannot write " + tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return absl::InternalError("cannot rename " + tmp + ": " + ec.message());
  return absl::OkStatus();
}

void ResultSpool::Remove(const v1::ReportTrialRequest& report) {
  std::lock_guard<std::mutex> lock(mu_);
  std::error_code ec;
  fs::remove(PathOf(report), ec);
}

std::vector<v1::ReportTrialRequest> ResultSpool::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<fs::file_time_type, std::string>> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() != ".report") continue;
    std::error_code tec;
    files.emplace_back(fs::last_write_time(it->path(), tec), it->path().string());
  }
  std::sort(files.begin(), files.end());
  std::vector<v1::ReportTrialRequest> out;
  for (const auto& [time, path] : files) {
    std::ifstream in(path, std::ios::binary);
    v1::ReportTrialRequest report;
    if (in && report.ParseFromIstream(&in)) out.push_back(std::move(report));
  }
  return out;
}

}  // namespace remat::worker
