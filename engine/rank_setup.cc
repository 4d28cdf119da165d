#include "engine/rank_setup.h"

#include <string>
#include <vector>

#include "engine/fp8_linear.h"
#include "engine/model.h"
#include "search/pipeline_layout.h"
#include "search/rank_layout.h"
#include "search/rules.h"

namespace remat::engine {

using search::TrialStatus;

void CheckRunnable(const TrialOptions& o, bool stand_in) {
  const search::SearchSpec& spec = o.spec;
  search::Status policy_ok = search::ValidatePolicy(spec, o.policy);
  if (!policy_ok.ok()) throw TrialStop{TrialStatus::kInvalid, policy_ok.message()};
  std::string unsupported = UnsupportedReason(spec, o.policy);
  if (!unsupported.empty()) throw TrialStop{TrialStatus::kInvalid, unsupported};
  if (o.world_size != spec.parallel.WorldSize() || o.rank < 0 || o.rank >= o.world_size) {
    throw TrialStop{TrialStatus::kInvalid, "world size " + std::to_string(o.world_size) +
                                               " / rank " + std::to_string(o.rank) +
                                               " do not match the spec's layout (TP x PP x DP = " +
                                               std::to_string(spec.parallel.WorldSize()) + ")"};
  }
  if (o.world_size > 1 && o.rendezvous_dir.empty() && !stand_in) {
    throw TrialStop{TrialStatus::kInvalid, "a multi-rank trial needs a rendezvous directory"};
  }
  if (spec.search.measure_steps < 1) {
    throw TrialStop{TrialStatus::kInvalid, "search.measure_steps must be at least 1"};
  }
}

void CheckTransport(const search::SearchSpec& spec, const at::Device& device) {
  if (std::string fp8 = Fp8Unsupported(spec, device); !fp8.empty()) {
    throw TrialStop{TrialStatus::kInvalid, fp8};
  }
  if (device.is_cuda() && spec.parallel.pipeline_model_parallel_size == 2 &&
      spec.parallel.VirtualChunks() > 1) {
    // Both activations and gradients travel between the same two ranks; NCCL matches them in
    // posting order only, which the interleaved schedule does not keep (Megatron-LM refuses
    // this layout without overlapped communication too).
    throw TrialStop{TrialStatus::kInvalid,
                    "parallel.virtual_pipeline_model_parallel_size with "
                    "pipeline_model_parallel_size 2 is not supported by the builtin engine on "
                    "NCCL"};
  }
}

std::unique_ptr<Collectives> MakeCollectives(const TrialOptions& o, bool stand_in,
                                             const at::Device& device,
                                             StandInCollectives** stand_ins) {
  const search::SearchSpec& spec = o.spec;
  CollectivesOptions copts;
  copts.rank = o.rank;
  copts.world_size = o.world_size;
  copts.rendezvous_dir = o.rendezvous_dir;
  copts.timeout_s = o.collective_timeout_s;
  copts.nccl_point_to_point = o.nccl_point_to_point;
  std::unique_ptr<Collectives> comm;
  if (stand_in) {
    std::unique_ptr<StandInCollectives> s =
        NewStandInCollectives(o.rank, o.world_size, device.is_cuda() ? device.index() : -1,
                              spec.train.seed * 1000003 + static_cast<uint64_t>(o.rank));
    *stand_ins = s.get();
    comm = std::move(s);
  } else if (o.world_size == 1) {
    comm = NewSingleRankCollectives();
  } else if (device.is_cuda()) {
#ifdef REMAT_WITH_CUDA
    comm = NewNcclCollectives(copts);
#endif
  } else {
    comm = NewTcpCollectives(copts);
  }

  return comm;
}

Runtime MakeRuntime(const TrialOptions& o, Collectives* comm, StandInCollectives* stand_ins,
                    const at::Device& device) {
  const search::SearchSpec& spec = o.spec;
  Runtime rt;
  rt.comm = comm;
  rt.device = device;
  const int pp = spec.parallel.pipeline_model_parallel_size;
  const search::ParallelGroups groups = search::GroupsOf(spec.parallel);
  auto name = [&](const Group& g, const char* n) {
    if (stand_ins != nullptr) stand_ins->NameGroup(g, n);
  };
  rt.tp = comm->CreateGroup(groups.tp);
  name(rt.tp, "tp");
  rt.dp = comm->CreateGroup(groups.dp);
  name(rt.dp, "dp");
  rt.dp_cp = rt.dp;
  if (spec.parallel.context_parallel_size > 1) {  // engine/context_parallel.h
    rt.cp = comm->CreateGroup(groups.cp);
    name(rt.cp, "cp");
    rt.dp_cp = comm->CreateGroup(groups.dp_cp);
    name(rt.dp_cp, "dp_cp");
    rt.cp_comm_type = spec.parallel.cp_comm_type;
  }
  if (pp > 1) {
    rt.pp = comm->CreateGroup(groups.pp);
    name(rt.pp, "pp");
    if (spec.model.share_embeddings_and_output_weights || search::MtpLayerCount(spec) > 0) {
      // Megatron's embedding group: the first and the last stage of each pipeline (with MTP,
      // whose stage is the last here, builds the embedding too: engine/mtp_params.cc).
      std::vector<std::vector<int>> emb_groups;
      for (const auto& g : groups.pp) {
        emb_groups.push_back({g.front(), g.back()});
        for (size_t i = 1; i + 1 < g.size(); ++i) emb_groups.push_back({g[i]});
      }
      rt.embedding = comm->CreateGroup(emb_groups);
      name(rt.embedding, "embedding");
    }
  }
  // Megatron's expert grid (search/rank_layout.h); where it adds nothing (EP 1, ETP = TP) the
  // expert groups are the dense ones.
  if (!groups.ep.empty()) {
    rt.ep = comm->CreateGroup(groups.ep);
    name(rt.ep, "ep");
    rt.expert_dp = comm->CreateGroup(groups.expert_dp);
    name(rt.expert_dp, "expert_dp");
    rt.expert_tp = comm->CreateGroup(groups.expert_tp);
    name(rt.expert_tp, "expert_tp");
    rt.expert_tp_ep = comm->CreateGroup(groups.expert_tp_ep);
    name(rt.expert_tp_ep, "expert_tp_ep");
  } else {
    rt.ep.id = -1;  // a group of one: never reaches the transport
    rt.ep.ranks = {o.rank};
    rt.ep.rank = 0;
    rt.expert_dp = rt.dp_cp;
    rt.expert_tp = rt.tp;
    rt.expert_tp_ep = rt.tp;
  }
  rt.sequence_parallel =
      spec.parallel.sequence_parallel && spec.parallel.tensor_model_parallel_size > 1;

  return rt;
}

}  // namespace remat::engine
