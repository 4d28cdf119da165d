// Depth proxies: predicting a deep model's per-rank peak from the same model cut to two depths.
//
// A 70B-class model does not fit one GPU, but its layers are alike: with everything else the
// same, a trial's peak memory and step time are affine in the number of layers (per pipeline
// stage) once the depth is past the policy's own structure (block N, uniform group size).
// Measuring the model at two depths d1 < d2 separates the per-layer cost from the fixed cost
// (embedding, output layer, logits, the optimizer's share of both), and the line gives the
// full-depth figures per rank. With MoE layer patterns the layers between d1 and d2 must be of
// the kind that fills the rest of the model (e.g. a leading dense layer sits inside d1).
//
// Enabled by `search.proxy_layers: [d1, d2]` in the spec. Thread-safety: pure functions.
#pragma once

#include <string>

#include "search/policy.h"
#include "search/spec.h"
#include "search/status.h"
#include "search/trial.h"

namespace remat::search {

// The spec's proxy depths themselves are checked by ValidateSpec (search/spec.h): a rule of the
// spec, so the spec does not depend on this file.

// Empty when `policy` can be measured at both proxy depths and extrapolated: full:block:N needs
// N < d1 (per stage); full:uniform:N needs d1 and d2 per stage to be multiples of N.
std::string ProxyPolicyProblem(const SearchSpec& spec, const Policy& policy);

// The spec cut to `layers` layers (num_layers and an explicit MoE pattern shortened), with no
// proxy depths of its own. A proxy run also lifts the memory cap: search::DepthRunSpec
// (search/proxy_driver.h) is the spec it runs.
SearchSpec AtDepth(const SearchSpec& spec, int layers);

// The full-depth result predicted from the two proxy results (same policy, ranks in the same
// order). Per rank, allocated, reserved and static bytes and the step time are extended along the
// line through (d1, shallow) and (d2, deep); throughput and model TFLOP/s follow the predicted
// step time. A proxy that did not finish ok gives that status. The result is marked predicted
// and says from which depths; its status is ok even when the predicted peak is over the budget
// (the frontier excludes it, as for a measured trial).
TrialResult PredictFullDepth(const SearchSpec& full, const TrialResult& shallow,
                             const TrialResult& deep);

}  // namespace remat::search
