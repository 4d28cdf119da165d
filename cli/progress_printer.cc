#include "cli/progress_printer.h"

#include "cli/render.h"

namespace remat::cli {

void ProgressPrinter::Update(const remat::v1::SearchProgress& p) {
  std::string trial_line;
  if (p.has_last_trial() && !p.last_trial().id().empty() &&
      trials_seen_.insert(p.last_trial().id()).second) {
    trial_line = TrialLine(p.last_trial(), memory_metric_);
  }
  const std::string line = ProgressLine(p, tty_);
  if (tty_) {
    if (!trial_line.empty()) out_ << "\r\x1b[K" << trial_line << "\n";
    out_ << "\r\x1b[K" << line << std::flush;
    bar_shown_ = true;
  } else {
    if (!trial_line.empty()) out_ << trial_line << "\n";
    // The elapsed time changes every update; print when anything else does.
    remat::v1::SearchProgress key = p;
    key.set_elapsed_s(0);
    key.set_eta_s(0);
    key.clear_last_trial();
    const std::string k = key.SerializeAsString();
    if (k != last_line_) {
      out_ << line << "\n" << std::flush;
      last_line_ = k;
    }
  }
}

void ProgressPrinter::Finish() {
  if (tty_ && bar_shown_) out_ << "\n" << std::flush;
  bar_shown_ = false;
}

}  // namespace remat::cli
