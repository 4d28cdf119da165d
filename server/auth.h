// Bearer-token authentication for the two kinds of callers: users (RematService) and workers
// (WorkerService), with separate token files.
//
// Token files: one token per line, '#' starts a comment, blank lines are ignored.
//   users:   "TOKEN USER [admin]"  (the user owns the searches it submits; "admin" also lists,
//                                   watches and cancels every user's searches)
//   workers: "TOKEN [NAME]"        (NAME defaults to "worker"; used in logs)
// Callers send the metadata "authorization: Bearer TOKEN". With MUNGE enabled (SetMunge; rematd
// --munge-socket), a user may instead send "authorization: Munge CREDENTIAL": a credential the
// cluster's munged made for the caller's uid (remat --munge); the user is the name of that uid,
// the same name a token line would give, never an admin (admins hold tokens). Each credential
// decodes once (munged refuses replays) and within its TTL.
//
// With a kind's file unset, that kind needs no token (the local default). With it set, a call
// without a valid token is UNAUTHENTICATED, and a valid token of the other kind is
// PERMISSION_DENIED.
//
// Thread-safety: Check and Reload may be called from any thread at any time; a call checked
// while Reload runs sees either the old tokens or the new ones, never a mix. Load, the copy and
// the test seams (AddUserToken, AddWorkerToken) are for setup, before calls are served.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "common/munge.h"

namespace remat::server {

enum class Role { kUser, kWorker };

// Who is calling. Without user auth everyone is the anonymous user "", who sees every search.
struct Principal {
  std::string name;
  bool sees_all = true;  // false: only searches owned by `name`
  // An operator ("admin" in the user token file): sees_all for a named user. The RPC layer
  // writes an audit line for each call an admin makes on searches (grpc_service.cc).
  bool admin = false;
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
  static Principal Admin(std::string name) {
    Principal p;
    p.name = std::move(name);
    p.admin = true;
    return p;
  }
};

class Authenticator {
 public:
  // No auth for either kind.
  Authenticator();

  // Reads the token files ("" = that kind needs no token). InvalidArgument naming the file and
  // line for a malformed line (a third field other than "admin" included), a file without
  // tokens or an unreadable file, and for a token that is in both files.
  static absl::StatusOr<Authenticator> Load(const std::string& user_tokens_file,
                                            const std::string& worker_tokens_file);

  // Accept MUNGE credentials from users (see above): user auth is then on, with or without a
  // token file. Setup only.
  void SetMunge(common::MungeOptions munge);
  bool munge_enabled() const { return munge_enabled_; }

  // Reads the files Load read again and, when they are valid, swaps them in as one (calls in
  // flight finish with the tokens they were checked against). On any error the tokens in use
  // stay as they were and the error (as from Load) is returned. Files Load was not given stay
  // unset: reloading never turns auth on or off.
  absl::Status Reload();

  // `authorization` is the metadata value ("" when absent). Returns the caller for `role`, or
  // UNAUTHENTICATED / PERMISSION_DENIED.
  absl::StatusOr<Principal> Check(Role role, std::string_view authorization) const;

  bool users_enabled() const {
    return !user_tokens_file_.empty() || users_seeded_ || munge_enabled_;
  }
  bool workers_enabled() const { return !worker_tokens_file_.empty() || workers_seeded_; }
  // Tokens in use now, per kind (logs).
  size_t user_token_count() const;
  size_t worker_token_count() const;

  // Test seam: set tokens without files.
  void AddUserToken(const std::string& token, const std::string& user, bool admin = false);
  void AddWorkerToken(const std::string& token, const std::string& name);

  struct UserEntry {
    std::string name;
    bool admin = false;
  };
  struct Tokens {
    std::unordered_map<std::string, UserEntry> users;       // token -> user
    std::unordered_map<std::string, std::string> workers;  // token -> worker name
  };

 private:
  std::shared_ptr<const Tokens> Snapshot() const;

  std::string user_tokens_file_;
  std::string worker_tokens_file_;
  bool users_seeded_ = false;
  bool munge_enabled_ = false;
  common::MungeOptions munge_;
  bool workers_seeded_ = false;
  // Replaced as a whole by Reload; read with std::atomic_load so Check never locks.
  std::shared_ptr<const Tokens> tokens_;
};

}  // namespace remat::server
