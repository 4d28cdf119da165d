// Prints a watched search's progress: one line per finished trial and a progress line (a
// redrawn bar on a terminal, plain lines otherwise). Used by `remat watch` and `remat search`.
// Thread-safety: not thread-safe; call Update from the thread that reads the stream.
#pragma once

#include <ostream>
#include <set>
#include <string>

#include "remat/v1/remat.pb.h"

namespace remat::cli {

class ProgressPrinter {
 public:
  ProgressPrinter(std::ostream& out, bool tty, std::string memory_metric)
      : out_(out), tty_(tty), memory_metric_(std::move(memory_metric)) {}
  void Update(const remat::v1::SearchProgress& progress);
  // Ends a redrawn bar with a newline.
  void Finish();

 private:
  std::ostream& out_;
  const bool tty_;
  const std::string memory_metric_;
  std::set<std::string> trials_seen_;
  std::string last_line_;
  bool bar_shown_ = false;
};

}  // namespace remat::cli
