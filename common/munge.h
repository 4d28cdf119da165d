// MUNGE credentials through the munge and unmunge programs (the munge package, on every node of
// a Slurm cluster): a user's identity without a secret of theirs on file. `remat --munge`
// encodes a fresh credential for each call as the user who runs it; rematd (--munge-socket)
// decodes it through the cluster's munged, which vouches for the uid and refuses a credential
// that is expired (its TTL, 5 minutes by default), replayed, or made with another key. No
// libmunge build dependency: the programs are called, with a deadline.
// Standard library and POSIX only.
//
// Thread-safety: both functions may be called from any thread (each runs its own process,
// started with posix_spawn: safe in a multithreaded program).
#pragma once

#include <string>

namespace remat::common {

struct MungeOptions {
  std::string socket;                  // munged's socket; "" = munge's default
  std::string munge = "munge";         // the programs (looked up in PATH)
  std::string unmunge = "unmunge";
  double timeout_s = 5;
};

// A new credential (an empty payload) for the calling process's uid; "" and *error set when
// munge fails (munged not running, wrong socket, no program).
std::string MungeEncode(const MungeOptions& options, std::string* error);

// Who made `credential`: the user name munged reports for its uid (the number when the name is
// unknown on this host). "" and *error set (munged's reason: expired, replayed, invalid...)
// when it does not decode.
std::string MungeDecodeUser(const MungeOptions& options, const std::string& credential,
                            std::string* error);

}  // namespace remat::common
