#include "server/auth.h"

#include <openssl/sha.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace remat::server {
namespace {

// Reads "TOKEN NAME" lines; `need_name` makes NAME mandatory.
absl::Status ReadTokenFile(const std::string& flag, const std::string& path, bool need_name,
                           const std::string& default_name,
                           std::unordered_map<std::string, std::string>* out) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::vector<std::string> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    if (fields.size() > 2 || (need_name && fields.size() != 2)) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": ", path, ":", number, ": expected \"TOKEN ", need_name ? "USER" : "[NAME]",
          "\""));
    }
    if (out->count(fields[0]) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": ", path, ":", number, ": duplicate token"));
    }
    (*out)[fields[0]] = fields.size() == 2 ? fields[1] : default_name;
  }
  if (out->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " holds no tokens"));
  }
  return absl::OkStatus();
}

std::string_view Strip(std::string_view s) {
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.front()))) {
    s.remove_prefix(1);
  }
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.back()))) {
    s.remove_suffix(1);
  }
  return s;
}

// The token of "Bearer TOKEN" (scheme case-insensitive), or "".
std::string_view BearerToken(std::string_view authorization) {
  authorization = Strip(authorization);
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size()) return {};
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (absl::ascii_tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return {};
  }
  return Strip(authorization.substr(kScheme.size()));
}

std::string CredentialOf(const std::string& token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  static const char kHex[] = "0123456789abcdef";
  std::string out = "sha256:";
  for (int i = 0; i < 8; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

}  // namespace

absl::StatusOr<Authenticator> Authenticator::Load(const std::string& user_tokens_file,
                                                  const std::string& worker_tokens_file) {
  Authenticator auth;
  if (!user_tokens_file.empty()) {
    auth.users_enabled_ = true;
    absl::Status st = ReadTokenFile("user-tokens", user_tokens_file, /*need_name=*/true, "",
                                    &auth.user_tokens_);
    if (!st.ok()) return st;
  }
  if (!worker_tokens_file.empty()) {
    auth.workers_enabled_ = true;
    absl::Status st = ReadTokenFile("worker-tokens", worker_tokens_file, /*need_name=*/false,
                                    "worker", &auth.worker_tokens_);
    if (!st.ok()) return st;
  }
  for (const auto& [token, name] : auth.user_tokens_) {
    if (auth.worker_tokens_.count(token) != 0) {
      return absl::InvalidArgumentError(
          "worker-tokens: a token is also a user token; use separate tokens");
    }
  }
  return auth;
}

absl::StatusOr<Principal> Authenticator::Check(Role role, std::string_view authorization) const {
  const bool enabled = role == Role::kUser ? users_enabled_ : workers_enabled_;
  if (!enabled) return Principal::Anonymous();
  const std::string token(BearerToken(authorization));
  if (token.empty()) {
    return absl::UnauthenticatedError("missing bearer token (metadata authorization: Bearer TOKEN)");
  }
  const auto& mine = role == Role::kUser ? user_tokens_ : worker_tokens_;
  const auto& theirs = role == Role::kUser ? worker_tokens_ : user_tokens_;
  if (auto it = mine.find(token); it != mine.end()) {
    if (role == Role::kUser) return Principal::User(it->second);
    Principal worker;
    worker.name = it->second;
    worker.credential = CredentialOf(token);
    return worker;
  }
  if (theirs.count(token) != 0) {
    return absl::PermissionDeniedError(role == Role::kUser
                                           ? "a worker token cannot call the user API"
                                           : "a user token cannot call the worker API");
  }
  return absl::UnauthenticatedError("invalid bearer token");
}

void Authenticator::AddUserToken(const std::string& token, const std::string& user) {
  users_enabled_ = true;
  user_tokens_[token] = user;
}

void Authenticator::AddWorkerToken(const std::string& token, const std::string& name) {
  workers_enabled_ = true;
  worker_tokens_[token] = name;
}

}  // namespace remat::server
