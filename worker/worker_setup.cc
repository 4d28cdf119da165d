#include "worker/worker_setup.h"

#include <unistd.h>

#include <filesystem>

#include "common/version.h"
#include "worker/megatron_executor.h"
#include "worker/versions.h"

namespace remat::worker {
namespace {

namespace fs = std::filesystem;

// remat-trial, as an absolute path (trials start in their own folders); "" when not offered.
absl::Status SetUpBuiltin(const BackendFlags& flags, const std::string& program_dir,
                          const std::string& program, std::string* trial_binary,
                          std::string* warning) {
  trial_binary->clear();
  if (flags.builtin == BackendFlags::Builtin::kOff) return absl::OkStatus();
  if (!flags.trial_binary.empty()) {
    if (access(flags.trial_binary.c_str(), X_OK) != 0) {
      return absl::InvalidArgumentError("--trial-binary: " + flags.trial_binary +
                                        " is not an executable file");
    }
    *trial_binary = fs::absolute(flags.trial_binary).string();
    return absl::OkStatus();
  }
  const std::string beside = (fs::path(program_dir) / "remat-trial").string();
  if (access(beside.c_str(), X_OK) == 0) {
    *trial_binary = beside;
  } else if (flags.builtin == BackendFlags::Builtin::kRequired) {
    return absl::FailedPreconditionError("remat-trial not found at " + beside +
                                         " (build it: cmake --build build --target remat-trial)");
  } else {
    *warning = "no remat-trial beside " + program + " (" + beside + "): builtin backend off";
  }
  return absl::OkStatus();
}

absl::Status SetUpMegatron(const BackendFlags& flags, const std::string& program_dir,
                           const std::string& program, WorkerDaemonOptions* options) {
  std::string megatron_path = flags.megatron_path;
  if (!megatron_path.empty()) {
    if (!fs::is_directory(fs::path(megatron_path) / "megatron" / "core")) {
      return absl::InvalidArgumentError("--megatron-path: no megatron/core package in " +
                                        megatron_path);
    }
    megatron_path = fs::absolute(megatron_path).string();  // ranks start in trial folders
  }
  std::string driver = flags.megatron_driver;
  if (driver.empty()) {
    driver = FindMegatronDriver(program_dir);
    if (driver.empty()) {
      return absl::FailedPreconditionError("the megatron driver is neither beside " + program +
                                           " (megatron_driver/) nor installed "
                                           "(../share/remat/megatron_driver/)");
    }
  }
  if (access(driver.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError("--megatron-driver: cannot read " + driver);
  }
  options->megatron_driver = fs::absolute(driver).string();
  options->megatron_python = flags.python;
  options->megatron_path = megatron_path;
  options->versions["megatron_core"] = MegatronCoreVersion(megatron_path);
  return absl::OkStatus();
}

}  // namespace

absl::Status SetUpBackends(const BackendFlags& flags, const std::string& program_dir,
                           const std::string& program, WorkerDaemonOptions* options,
                           std::string* warning) {
  warning->clear();
  if (absl::Status s = SetUpBuiltin(flags, program_dir, program, &options->trial_binary, warning);
      !s.ok()) {
    return s;
  }
  // The versions are part of the results-cache key; remat-trial's (torch, CUDA, device) only
  // where the engine runs trials.
  options->versions = options->trial_binary.empty()
                          ? std::map<std::string, std::string>{{"remat", common::kVersion}}
                          : ProbeVersions(options->trial_binary);
  if (!flags.command_templates.empty()) {
    auto templates = LoadCommandTemplatesFile(flags.command_templates);
    if (!templates.ok()) return templates.status();
    options->command_templates = *templates;
  }
  if (flags.megatron) return SetUpMegatron(flags, program_dir, program, options);
  return absl::OkStatus();
}

}  // namespace remat::worker
