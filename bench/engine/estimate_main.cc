// remat-bench-estimate --spec FILE.yaml [--policies P1;P2;...] : the search core's memory model for a
// spec, as one JSON object: every valid policy, each layer's activation bytes under no recompute
// (search::EstimateLayerActivations) and, per requested policy, search::EstimateMemory.

#include <iostream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "search/memory_model.h"
#include "search/policy.h"
#include "search/rules.h"
#include "specfile/spec_file.h"

int main(int argc, char** argv) {
  std::string spec_path, policies;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--spec") spec_path = argv[i + 1];
    if (a == "--policies") policies = argv[i + 1];
  }
  if (spec_path.empty()) {
    std::cerr << "error: usage: remat-bench-estimate --spec FILE.yaml [--policies 'P1;P2']\n";
    return 2;
  }
  auto spec = remat::spec::LoadSpecFile(spec_path);
  if (!spec.ok()) {
    std::cerr << "error: " << spec.status().message() << "\n";
    return 2;
  }
  nlohmann::json out;
  out["valid_policies"] = nlohmann::json::array();
  for (const auto& p : remat::search::EnumerateValidPolicies(*spec)) {
    out["valid_policies"].push_back(p.ToString());
  }
  out["layers"] = nlohmann::json::array();
  for (int i = 0; i < spec->model.num_layers; ++i) {
    out["layers"].push_back(remat::search::EstimateLayerActivations(*spec, i).Total());
  }
  out["estimates"] = nlohmann::json::object();
  std::stringstream list(policies);
  std::string text;
  while (std::getline(list, text, ';')) {
    if (text.empty()) continue;
    auto policy = remat::search::ParsePolicy(text);
    if (!policy.ok()) {
      std::cerr << "error: --policies: " << policy.status().message() << "\n";
      return 2;
    }
    const auto e = remat::search::EstimateMemory(*spec, *policy);
    out["estimates"][policy->ToString()] = {{"static_bytes", e.static_bytes},
                                            {"activation_bytes", e.activation_bytes},
                                            {"layer_activation_bytes", e.layer_activation_bytes},
                                            {"transient_bytes", e.transient_bytes},
                                            {"peak_bytes", e.peak_bytes}};
  }
  std::cout << out.dump() << std::endl;
  return 0;
}
