// RematClient: the user's side of remat.v1.RematService (submit, get, watch, cancel, list).
//
// Every unary call has a deadline (ClientOptions::timeout_s). Watch has none (a search may run
// for hours) but reconnects when the stream breaks. Errors come back as absl::Status with gRPC's
// code; DescribeError turns one into the one-line message the CLI prints and ExitCode into the
// exit code (2 for bad input: INVALID_ARGUMENT, NOT_FOUND; 1 otherwise).
// Thread-safety: one RematClient may be used from several threads.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "remat/v1/remat.pb.h"

namespace remat::cli {

namespace v1 = ::remat::v1;

struct ClientOptions {
  std::string coordinator;  // HOST:PORT
  std::string token;        // user bearer token ("authorization: Bearer <token>"); "" none
  // Instead of a token: a fresh MUNGE credential for each call ("authorization: Munge <cred>"),
  // made by munge through this socket ("" = munge's default). Needs munge on this host and a
  // coordinator started with --munge-socket (common/munge.h).
  bool munge = false;
  std::string munge_socket;
  bool tls = false;         // TLS; tls_ca_pem "" means the system's roots
  std::string tls_ca_pem;
  double timeout_s = 30;  // deadline of each unary call
};

class RematClient {
 public:
  static std::unique_ptr<RematClient> Connect(const ClientOptions& options);
  virtual ~RematClient() = default;

  virtual absl::StatusOr<std::string> Submit(const v1::SubmitSearchRequest& request) = 0;
  virtual absl::StatusOr<v1::Search> Get(const std::string& id) = 0;
  virtual absl::StatusOr<v1::SearchState> Cancel(const std::string& id) = 0;
  virtual absl::StatusOr<v1::ListSearchesResponse> List(int limit) = 0;
  // Calls `on_update` for each progress message until one has a final state (returns OK), the
  // stream fails for good, or `stop` (when set) returns true.
  virtual absl::Status Watch(const std::string& id,
                             const std::function<void(const v1::SearchProgress&)>& on_update,
                             const std::function<bool()>& stop = nullptr) = 0;
};

bool IsFinal(v1::SearchState state);

// "cannot reach coordinator at HOST:PORT: ...", "coordinator at HOST:PORT refused the
// request: ...", or the server's message for bad input. Without the "error: " prefix.
std::string DescribeError(const absl::Status& status, const ClientOptions& options);
int ExitCode(const absl::Status& status);

}  // namespace remat::cli
