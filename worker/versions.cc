#include "worker/versions.h"

#include <filesystem>
#include <regex>
#include <sstream>

#include "absl/strings/ascii.h"
#include "common/read_file.h"
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

std::string MegatronCoreVersion(const std::string& megatron_path) {
  if (megatron_path.empty()) return "installed";
  const std::filesystem::path root(megatron_path);
  auto info = common::ReadFile((root / "megatron" / "core" / "package_info.py").string());
  if (!info) return "unknown";
  std::string version;
  for (const char* key : {"MAJOR", "MINOR", "PATCH"}) {
    std::smatch m;
    const std::regex re(std::string("\\n") + key + "\\s*=\\s*(\\d+)");
    if (!std::regex_search(*info, m, re)) return "unknown";
    version += (version.empty() ? "" : ".") + m[1].str();
  }
  if (auto commit = common::ReadFile((root / "REMAT_COMMIT").string())) {
    version += " commit " + std::string(absl::StripAsciiWhitespace(*commit));
  }
  return version;
}

}  // namespace remat::worker
