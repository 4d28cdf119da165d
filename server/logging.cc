#include "server/logging.h"

#include <mutex>

namespace remat::server {

std::shared_ptr<spdlog::logger> ComponentLogger(const std::string& component) {
  static std::mutex mu;
  const std::string name = "rematd." + component;
  std::lock_guard<std::mutex> lock(mu);
  if (auto existing = spdlog::get(name)) return existing;
  auto base = spdlog::default_logger();
  auto logger = std::make_shared<spdlog::logger>(name, base->sinks().begin(), base->sinks().end());
  logger->set_level(base->level());
  logger->flush_on(spdlog::level::warn);
  spdlog::register_logger(logger);
  return logger;
}

}  // namespace remat::server
