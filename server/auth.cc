#include "server/auth.h"

#include <openssl/sha.h>

#include <fstream>
#include <functional>
#include <memory>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace remat::server {
namespace {

// Reads a token file: "TOKEN NAME" lines, or for users "TOKEN USER [admin]". Calls `add` for
// each token; `users` makes USER mandatory and allows the admin field.
absl::Status ReadTokenFile(
    const std::string& flag, const std::string& path, bool users, const std::string& default_name,
    const std::function<bool(const std::string&, const std::string&, bool)>& add) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::string line;
  int number = 0;
  int tokens = 0;
  while (std::getline(in, line)) {
    ++number;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::vector<std::string> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    const size_t max_fields = users ? 3 : 2;
    if (fields.size() > max_fields || (users && fields.size() < 2) ||
        (fields.size() == 3 && fields[2] != "admin")) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": ", path, ":", number, ": expected \"TOKEN ", users ? "USER [admin]" : "[NAME]",
          "\""));
    }
    const bool admin = fields.size() == 3;
    if (!add(fields[0], fields.size() >= 2 ? fields[1] : default_name, admin)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": ", path, ":", number, ": duplicate token"));
    }
    ++tokens;
  }
  if (tokens == 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " holds no tokens"));
  }
  return absl::OkStatus();
}

// Both files read into one set of tokens.
absl::StatusOr<std::shared_ptr<const Authenticator::Tokens>> ReadTokens(
    const std::string& user_tokens_file, const std::string& worker_tokens_file) {
  auto tokens = std::make_shared<Authenticator::Tokens>();
  if (!user_tokens_file.empty()) {
    absl::Status st = ReadTokenFile(
        "user-tokens", user_tokens_file, /*users=*/true, "",
        [&](const std::string& token, const std::string& name, bool admin) {
          return tokens->users.emplace(token, Authenticator::UserEntry{name, admin}).second;
        });
    if (!st.ok()) return st;
  }
  if (!worker_tokens_file.empty()) {
    absl::Status st = ReadTokenFile(
        "worker-tokens", worker_tokens_file, /*users=*/false, "worker",
        [&](const std::string& token, const std::string& name, bool) {
          return tokens->workers.emplace(token, name).second;
        });
    if (!st.ok()) return st;
  }
  for (const auto& [token, user] : tokens->users) {
    if (tokens->workers.count(token) != 0) {
      return absl::InvalidArgumentError(
          "worker-tokens: a token is also a user token; use separate tokens");
    }
  }
  return std::shared_ptr<const Authenticator::Tokens>(std::move(tokens));
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

// The rest of "SCHEME VALUE" when `authorization` uses `scheme` ("bearer ", "munge ";
// case-insensitive), or "".
std::string_view SchemeValue(std::string_view authorization, std::string_view scheme) {
  authorization = Strip(authorization);
  if (authorization.size() <= scheme.size()) return {};
  for (size_t i = 0; i < scheme.size(); ++i) {
    if (absl::ascii_tolower(static_cast<unsigned char>(authorization[i])) != scheme[i]) return {};
  }
  return Strip(authorization.substr(scheme.size()));
}

std::string_view BearerToken(std::string_view authorization) {
  return SchemeValue(authorization, "bearer ");
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

Authenticator::Authenticator() : tokens_(std::make_shared<const Tokens>()) {}

absl::StatusOr<Authenticator> Authenticator::Load(const std::string& user_tokens_file,
                                                  const std::string& worker_tokens_file) {
  Authenticator auth;
  auth.user_tokens_file_ = user_tokens_file;
  auth.worker_tokens_file_ = worker_tokens_file;
  auto tokens = ReadTokens(user_tokens_file, worker_tokens_file);
  if (!tokens.ok()) return tokens.status();
  auth.tokens_ = std::move(*tokens);
  return auth;
}

absl::Status Authenticator::Reload() {
  auto tokens = ReadTokens(user_tokens_file_, worker_tokens_file_);
  if (!tokens.ok()) return tokens.status();
  std::atomic_store(&tokens_, std::move(*tokens));
  return absl::OkStatus();
}

std::shared_ptr<const Authenticator::Tokens> Authenticator::Snapshot() const {
  return std::atomic_load(&tokens_);
}

size_t Authenticator::user_token_count() const { return Snapshot()->users.size(); }
size_t Authenticator::worker_token_count() const { return Snapshot()->workers.size(); }

absl::StatusOr<Principal> Authenticator::Check(Role role, std::string_view authorization) const {
  const bool enabled = role == Role::kUser ? users_enabled() : workers_enabled();
  if (!enabled) return Principal::Anonymous();
  if (const std::string_view credential = SchemeValue(authorization, "munge ");
      !credential.empty()) {
    if (role != Role::kUser || !munge_enabled_) {
      return absl::UnauthenticatedError(
          role == Role::kUser ? "MUNGE credentials are not accepted here (rematd --munge-socket)"
                              : "workers authenticate with tokens, not MUNGE credentials");
    }
    std::string error;
    const std::string user = common::MungeDecodeUser(munge_, std::string(credential), &error);
    if (user.empty()) return absl::UnauthenticatedError("MUNGE credential refused: " + error);
    return Principal::User(user);
  }
  const std::string token(BearerToken(authorization));
  if (token.empty()) {
    return absl::UnauthenticatedError("missing bearer token (metadata authorization: Bearer TOKEN)");
  }
  const std::shared_ptr<const Tokens> tokens = Snapshot();
  if (role == Role::kUser) {
    if (auto it = tokens->users.find(token); it != tokens->users.end()) {
      return it->second.admin ? Principal::Admin(it->second.name)
                              : Principal::User(it->second.name);
    }
    if (tokens->workers.count(token) != 0) {
      return absl::PermissionDeniedError("a worker token cannot call the user API");
    }
  } else {
    if (auto it = tokens->workers.find(token); it != tokens->workers.end()) {
      Principal worker;
      worker.name = it->second;
      worker.credential = CredentialOf(token);
      return worker;
    }
    if (tokens->users.count(token) != 0) {
      return absl::PermissionDeniedError("a user token cannot call the worker API");
    }
  }
  return absl::UnauthenticatedError("invalid bearer token");
}

void Authenticator::SetMunge(common::MungeOptions munge) {
  munge_enabled_ = true;
  munge_ = std::move(munge);
}

void Authenticator::AddUserToken(const std::string& token, const std::string& user, bool admin) {
  users_seeded_ = true;
  auto tokens = std::make_shared<Tokens>(*Snapshot());
  tokens->users[token] = UserEntry{user, admin};
  std::atomic_store(&tokens_, std::shared_ptr<const Tokens>(std::move(tokens)));
}

void Authenticator::AddWorkerToken(const std::string& token, const std::string& name) {
  workers_seeded_ = true;
  auto tokens = std::make_shared<Tokens>(*Snapshot());
  tokens->workers[token] = name;
  std::atomic_store(&tokens_, std::shared_ptr<const Tokens>(std::move(tokens)));
}

}  // namespace remat::server
