#include "search/equivalence.h"

#include <map>

#include "search/rules.h"

namespace remat::search {

ClassOf EquivalenceClassOf(const SearchSpec& spec, const Policy& policy) {
  ClassOf out{policy, ""};
  if (!policy.IsFull()) {
    // moe_layer_recompute is off under cuda_graph_impl 'local' (MoETransformerLayer handles the
    // recompute there): no equivalence is claimed then.
    if (policy.Has(Label::kMoe) && spec.model.cuda_graph_impl != "local" &&
        (policy.Has(Label::kMoeAct) || policy.Has(Label::kSharedExperts))) {
      Policy rep = policy.Without(Label::kMoeAct).Without(Label::kSharedExperts);
      if (ValidatePolicy(spec, rep).ok()) {
        out.reason = "keeps what " + rep.ToString() +
                     " keeps: moe checkpoints the whole MoE layer (router, experts, shared "
                     "experts; Megatron Core MoELayer.forward), so moe_act and shared_experts "
                     "beside it save nothing more";
        out.representative = std::move(rep);
      }
    }
    return out;
  }
  const int layers = LayersPerStage(spec);
  if (policy.method == RecomputeMethod::kBlock && layers >= 1 && policy.num_layers >= layers) {
    Policy rep = Policy::Full(RecomputeMethod::kUniform, 1);
    if (ValidatePolicy(spec, rep).ok()) {
      out.reason = "keeps what full:uniform:1 keeps: block checkpoints each of its first " +
                   std::to_string(policy.num_layers) + " layers, and a model chunk has at most " +
                   std::to_string(layers) +
                   " (Megatron Core checkpointed_forward: both checkpoint every layer alone)";
      out.representative = std::move(rep);
    }
  }
  return out;
}

std::vector<PolicyClass> EquivalenceClasses(const SearchSpec& spec) {
  std::vector<PolicyClass> out;
  std::map<std::string, size_t> index;
  const auto all = EnumerateValidPolicies(spec);
  // Representatives first, in enumeration order, so a class is listed where its simplest member
  // is, whichever member the enumeration meets first.
  for (const Policy& p : all) {
    if (!IsRepresentative(spec, p)) continue;
    index[p.ToString()] = out.size();
    out.push_back(PolicyClass{p, {}});
  }
  for (const Policy& p : all) {
    ClassOf c = EquivalenceClassOf(spec, p);
    if (c.reason.empty()) continue;
    auto it = index.find(c.representative.ToString());
    if (it == index.end()) {  // the representative is not enumerated: the policy is its own class
      index[p.ToString()] = out.size();
      out.push_back(PolicyClass{p, {}});
      continue;
    }
    out[it->second].others.push_back(ClassOf{p, std::move(c.reason)});
  }
  return out;
}

bool IsRepresentative(const SearchSpec& spec, const Policy& policy) {
  return EquivalenceClassOf(spec, policy).reason.empty();
}

}  // namespace remat::search
