// Named spdlog loggers for the coordinator's components ("rematd.scheduler", "rematd.rpc", ...).
// main() configures the default logger once (sinks, level, pattern); each component logger
// shares the default logger's sinks and level. Every line about a job carries "search=ID" and,
// when about a trial, "trial=ID". Thread-safety: safe from any thread (spdlog's registry).
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace remat::server {

// The logger "rematd.<component>", created on first use.
std::shared_ptr<spdlog::logger> ComponentLogger(const std::string& component);

}  // namespace remat::server
