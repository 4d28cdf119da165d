// ResultSpool: trial reports kept on disk until the coordinator has taken them.
//
// Every finished trial is written here before it is reported and removed once the coordinator
// answered (accepted or a duplicate). Results the worker could not deliver (coordinator away,
// worker restarted) stay and are re-sent later; ReportTrial is idempotent, so a report sent
// twice is harmless. One file per trial attempt, <trial_id>.<attempt>.report, written
// atomically (temp file + rename).
// Thread-safety: all methods may be called concurrently. Put returns an error when the file
// cannot be written (the caller still tries to deliver the report directly).
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "remat/v1/remat.pb.h"

namespace remat::worker {

namespace v1 = ::remat::v1;

class ResultSpool {
 public:
  explicit ResultSpool(std::string dir) : dir_(std::move(dir)) {}

  absl::Status Init();  // creates the folder
  absl::Status Put(const v1::ReportTrialRequest& report);
  void Remove(const v1::ReportTrialRequest& report);
  // Every spooled report, oldest first; unreadable files are skipped (and left for a human).
  std::vector<v1::ReportTrialRequest> List() const;
  size_t Size() const { return List().size(); }

 private:
  std::string PathOf(const v1::ReportTrialRequest& report) const;

  const std::string dir_;
  mutable std::mutex mu_;
};

}  // namespace remat::worker
