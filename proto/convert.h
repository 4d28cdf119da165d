// Conversion between the remat.v1 messages and the search/ domain types. The one place where
// proto and domain meet; every other component calls these. Thread-safety: pure functions.
#pragma once

#include "remat/v1/remat.pb.h"
#include "search/frontier.h"
#include "search/spec.h"
#include "search/status.h"
#include "search/trial.h"

namespace remat::proto {

// Reads a spec message; unset optional fields take Megatron Core's defaults. Returns
// InvalidArgument naming the field for an unknown enum string ("model.normalization: ...").
// Does not run search::ValidateSpec.
search::StatusOr<search::SearchSpec> FromProto(const v1::SearchSpec& msg);
// Writes every field, defaults included, so the receiver sees exactly what was resolved.
v1::SearchSpec ToProto(const search::SearchSpec& spec);

// Trial results. FromProto fails on an unparsable policy or a non-final status.
search::StatusOr<search::TrialResult> FromProto(const v1::TrialResult& msg);
v1::TrialResult ToProto(const search::TrialResult& result);

v1::TrialStatus ToProto(search::TrialStatus status);

// The recommendation and why (search/frontier.h RecommendPolicy).
v1::RecommendationDetail ToProto(const search::Recommendation& recommendation);
// nullopt for UNSPECIFIED / PENDING / RUNNING (not final).
std::optional<search::TrialStatus> FromProto(v1::TrialStatus status);

// The contract's word for a status ("ok", "oom", ...; "pending" / "running" before it is final).
const char* TrialStatusName(v1::TrialStatus status);

}  // namespace remat::proto
