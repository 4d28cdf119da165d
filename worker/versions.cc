#include "worker/versions.h"

#include <sstream>

#include "absl/strings/ascii.h"
#include "common/version.h"
#include "worker/process_runner.h"

namespace remat::worker {

std::map<std::string, std::string> ParseKeyValueLines(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key(absl::StripAsciiWhitespace(line.substr(0, eq)));
    std::string value(absl::StripAsciiWhitespace(line.substr(eq + 1)));
    if (!key.empty()) out[key] = value;
  }
  return out;
}

std::map<std::string, std::string> ProbeVersions(const std::string& trial_binary) {
  std::map<std::string, std::string> versions;
  std::string out;
  if (!trial_binary.empty() && CaptureOutput({trial_binary, "--version"}, 120, &out)) {
    versions = ParseKeyValueLines(out);
  }
  versions["remat"] = common::kVersion;
  return versions;
}

}  // namespace remat::worker
