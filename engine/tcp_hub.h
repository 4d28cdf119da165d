// The hub of the TCP collectives: a thread in rank 0 that every rank, rank 0 included, connects to.
// It accepts one connection per rank (each says hello with its rank and world size), then serves
// requests: a collective completes when every member's request has arrived, computed in member
// order (so results are deterministic) and answered to each member; point-to-point sends wait in
// a mailbox for their receive. A rank that never joins within the timeout, or disconnects without
// saying goodbye, makes the hub send an error to every rank. Internal to remat_engine_collectives.
#pragma once

#include <memory>

namespace remat::engine::tcp {

class Hub {
 public:
  virtual ~Hub() = default;
  // Asks the hub to finish once every rank has said goodbye (or after the grace period).
  virtual void RequestStop() = 0;
  // Waits for the hub's thread to end.
  virtual void Join() = 0;
};

// Starts the hub's thread on `listen_fd` (bound and listening; the hub owns and closes it).
std::unique_ptr<Hub> StartHub(int listen_fd, int world_size, double timeout_s);

}  // namespace remat::engine::tcp
