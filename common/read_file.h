// Reading a whole file: the one implementation the mains and the libraries that read files (spec
// files, command templates, metrics files, TLS material) share. Standard library only.
#pragma once

#include <optional>
#include <string>

namespace remat::common {

// The whole file, bytes as they are; nullopt when it cannot be opened or read. Callers turn
// nullopt into their own error naming the flag or field.
std::optional<std::string> ReadFile(const std::string& path);

}  // namespace remat::common
