// The worker's edge with the wire: a leased v1::TrialAssignment is converted into domain types
// ONCE, when it arrives (ToAssignment); executors, the rank combiner and the metrics reader read
// only the domain Assignment and produce search::TrialResult; the result becomes a wire message
// again only in MakeReport, the one place that stamps the trial's policy onto it.
// Thread-safety: plain values and pure functions.
#pragma once

#include <optional>
#include <string>

#include "remat/v1/remat.pb.h"
#include "search/policy.h"
#include "search/spec.h"
#include "search/trial.h"

namespace remat::worker {

namespace v1 = ::remat::v1;

struct Assignment {
  // Identity: always set, also when `error` is.
  std::string search_id;
  std::string trial_id;
  int attempt = 0;
  int world_size = 1;        // ranks of the trial; at least 1
  std::string policy_name;   // the policy string as the coordinator sent it: what reports carry
  std::string owner;         // the user whose search it is ("" without user auth)

  // Set when the assignment could not be read (only a foreign coordinator sends one: rematd
  // validates spec and policy before it queues a trial): the field and why, e.g.
  // "model.normalization: ...". The trial is then reported failed without running.
  std::string error;

  search::Policy policy;    // parsed from policy_name
  search::SearchSpec spec;  // every omitted field resolved to its default (search/spec.h)

  // Backend replay: the table's entry for this policy (nullopt: the policy is not in the table)
  // and how long the replayed trial takes.
  std::optional<search::TrialResult> replay;
  double replay_wall_s = 0;
};

// Reads the assignment (spec through proto::FromProto, the policy through search::ParsePolicy).
Assignment ToAssignment(const v1::TrialAssignment& msg);

// A measurement in a wire message whose policy another message names (a rank's result file, a
// replay entry): its policy is not read, and a status that is not final (unspecified, pending,
// running) reads as failed.
search::TrialResult ResultFromWire(const v1::TrialResult& msg);

// A rank's result file (what remat-trial wrote at --result) into `*out`. False when it is not
// a regular file of at most limits::kMaxResultFileBytes (a FIFO, a device, a directory: never
// waited on), cannot be parsed, or has no status. Strings that are not valid UTF-8 (a message
// quoting a trial's bytes) are made valid (search/text.h BoundedUtf8) rather than costing the
// whole result.
bool ReadResultFile(const std::string& path, v1::TrialResult* out);

// A result with only a status and a message.
search::TrialResult StatusResult(search::TrialStatus status, std::string message);

// The report of `result` for the coordinator, from `worker_id`: trial id and attempt of the
// assignment, and the result under the assignment's policy_name. The one place a result gets its
// policy: nothing upstream sets or reads the domain result's policy. The message is made valid
// UTF-8 and cut to search::limits::kMaxTrialMessageBytes (search/text.h BoundedUtf8).
v1::ReportTrialRequest MakeReport(const std::string& worker_id, const Assignment& assignment,
                                  const search::TrialResult& result);

// The hand-off to remat-trial, a wire edge of its own: creates `dir`/rendezvous and writes one
// TrialRequest per rank to RequestPath(dir, r) (the spec with every field resolved, the policy,
// rank, world size, rendezvous folder, collective timeout). Returns "" or what failed, one line.
std::string WriteTrialRequests(const Assignment& assignment, const std::string& dir,
                               double collective_timeout_s);
std::string RequestPath(const std::string& dir, int rank);

}  // namespace remat::worker
