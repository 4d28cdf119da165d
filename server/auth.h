// Bearer-token authentication for the two kinds of callers: users (RematService) and workers
// (WorkerService), with separate token files.
//
// Token files: one token per line, '#' starts a comment, blank lines are ignored.
//   users:   "TOKEN USER"      (the user owns the searches it submits)
//   workers: "TOKEN [NAME]"    (NAME defaults to "worker"; used in logs)
// Callers send the metadata "authorization: Bearer TOKEN".
//
// With a kind's file unset, that kind needs no token (the local default). With it set, a call
// without a valid token is UNAUTHENTICATED, and a valid token of the other kind is
// PERMISSION_DENIED. Thread-safety: immutable after Load; Check may be called from any thread.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>

#include "absl/status/statusor.h"

namespace remat::server {

enum class Role { kUser, kWorker };

// Who is calling. Without user auth everyone is the anonymous user "", who sees every search.
struct Principal {
  std::string name;
  bool sees_all = true;  // false: only searches owned by `name`
  // Workers: which token called, as "sha256:" and the first 16 hex digits of the token's
  // SHA-256 (stable across restarts and token-file edits, and not the secret itself); "" without
  // worker tokens. A worker id is bound to the credential that registered it (Scheduler).
  std::string credential;

  static Principal Anonymous() { return Principal{}; }
  static Principal User(std::string name) {
    Principal p;
    p.name = std::move(name);
    p.sees_all = false;
    return p;
  }
};

class Authenticator {
 public:
  // No auth for either kind.
  Authenticator() = default;

  // Reads the token files ("" = that kind needs no token). InvalidArgument naming the file and
  // line for a malformed line, a file without tokens or an unreadable file.
  static absl::StatusOr<Authenticator> Load(const std::string& user_tokens_file,
                                            const std::string& worker_tokens_file);

  // `authorization` is the metadata value ("" when absent). Returns the caller for `role`, or
  // UNAUTHENTICATED / PERMISSION_DENIED.
  absl::StatusOr<Principal> Check(Role role, std::string_view authorization) const;

  bool users_enabled() const { return users_enabled_; }
  bool workers_enabled() const { return workers_enabled_; }

  // Test seam: set tokens without files.
  void AddUserToken(const std::string& token, const std::string& user);
  void AddWorkerToken(const std::string& token, const std::string& name);

 private:
  bool users_enabled_ = false;
  bool workers_enabled_ = false;
  std::unordered_map<std::string, std::string> user_tokens_;    // token -> user
  std::unordered_map<std::string, std::string> worker_tokens_;  // token -> worker name
};

}  // namespace remat::server
