#include "search/layout_proxy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "search/memory_model.h"
#include "search/pipeline.h"
#include "search/rank_layout.h"

namespace remat::search {
namespace {

std::string StageName(int stage, int stages) {
  std::string name = "stage " + std::to_string(stage);
  if (stages == 1) return name + " (only)";
  if (stage == 0) return name + " (first)";
  if (stage == stages - 1) return name + " (last)";
  return name;
}

// What a stage builds, chunk by chunk: its layers (dense or MoE, by moe_layer_freq) and MTP
// layers. Two middle stages that build the same differ only in the micro-batches they keep in
// flight. DeepSeek-V3's first dense layers, for one, make stage 1 unlike the stages after it.
std::vector<int> StageShape(const SearchSpec& spec, int stage) {
  std::vector<int> shape;
  for (const StageChunk& c : ChunksOf(spec, stage)) {
    shape.push_back(c.num_layers);
    shape.push_back(c.mtp_layers);  // an explicit layout may put MTP on a middle stage
    for (int l = c.first_layer; l < c.first_layer + c.num_layers; ++l) {
      shape.push_back(spec.model.IsMoeLayer(l) ? 1 : 0);
    }
  }
  return shape;
}

bool SameStates(const InFlightStateList& a, const InFlightStateList& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].backward_chunk != b[i].backward_chunk ||
        a[i].live_per_chunk != b[i].live_per_chunk) {
      return false;
    }
  }
  return true;
}

SearchSpec WithMicrobatches(const SearchSpec& spec, int microbatches) {
  SearchSpec out = spec;
  out.train.global_batch_size = 1LL * microbatches * spec.train.micro_batch_size *
                                std::max(1, spec.parallel.data_parallel_size);
  return out;
}

// One stage's figures, measured or interpolated.
struct StageFigures {
  double peak_allocated = 0, peak_reserved = 0, static_bytes = 0;
  double microbatch_s = 0;  // forward + backward of one micro-batch with its exposed traffic
  double optimizer_s = 0;   // optimizer step with the exposed data-parallel traffic
};

double Lerp(double a, double b, double t) { return a + (b - a) * t; }

// Communication that sits inside the forward and backward passes (tensor, expert, context and
// pipeline traffic: exposed, Megatron overlaps none of it by default), and what the step adds
// after the last backward (the data-parallel gradient reduction unless overlap_grad_reduce, the
// distributed optimizer's parameter gather unless overlap_param_gather; the tied embedding's
// all-reduce).
void SplitComm(const SearchSpec& spec, const std::vector<CommRecord>& comm,
               std::vector<CommRecord>* in_schedule, std::vector<CommRecord>* after) {
  for (const CommRecord& c : comm) {
    if (c.group == "world") continue;  // warm-up bookkeeping, not part of a step
    // dp_cp: Megatron's dp-cp group, which reduces the gradients under context parallelism.
    if (c.group == "dp" || c.group == "dp_cp" || c.group == "expert_dp") {
      const bool gather = c.kind == CollectiveKind::kAllGather;
      const bool hidden = gather ? spec.parallel.overlap_param_gather
                                 : spec.parallel.overlap_grad_reduce;
      if (!hidden) after->push_back(c);
    } else if (c.group == "embedding") {
      after->push_back(c);
    } else {
      in_schedule->push_back(c);
    }
  }
}

std::string Gb(double bytes_per_s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", bytes_per_s / 1e9);
  return buf;
}

}  // namespace

int TrialSlots(const SearchSpec& spec) {
  return spec.search.layout_proxy ? 1 : std::max(1, spec.parallel.WorldSize());
}

std::vector<ProxyRole> ProxyRoles(const SearchSpec& spec) {
  const int pp = std::max(1, spec.parallel.pipeline_model_parallel_size);
  // The ends, and the first and last stage of every run of consecutive middle stages that build
  // the same layers: CombineLayoutProxies interpolates only inside such a run.
  std::vector<int> stages;
  for (int s = 0; s < pp; ++s) {
    const bool middle = s > 0 && s + 1 < pp;
    const bool like_prev = middle && s - 1 > 0 && StageShape(spec, s - 1) == StageShape(spec, s);
    const bool like_next = middle && s + 2 < pp && StageShape(spec, s + 1) == StageShape(spec, s);
    if (pp <= 4 || !like_prev || !like_next) stages.push_back(s);
  }
  std::vector<ProxyRole> roles;
  for (int s : stages) roles.push_back({StageName(s, pp), s * RanksPerStage(spec.parallel), s});
  return roles;
}

int ProxyMicrobatches(const SearchSpec& spec) {
  const int m = spec.NumMicrobatches();
  const int pp = std::max(1, spec.parallel.pipeline_model_parallel_size);
  // Megatron's interleaved schedule takes micro-batches in groups of PP.
  const int step = spec.parallel.VirtualChunks() > 1 ? pp : 1;
  std::vector<InFlightStateList> full;
  for (int s = 0; s < pp; ++s) full.push_back(InFlightStates(spec, s));
  if (m % step != 0) return m;  // ValidatePipelineLayout refuses such a spec
  // Beyond the shortened schedules InFlightStates walks, every count has the step's states: the
  // answer is at most the longest of them (M may be 2^24; this stays within the layout's size).
  int enough = step;
  for (int s = 0; s < pp; ++s) enough = std::max(enough, InFlightMicrobatches(spec, s));
  if (enough >= m) enough = m;
  for (int cand = step; cand < enough; cand += step) {
    const SearchSpec cut = WithMicrobatches(spec, cand);
    bool same = true;
    for (int s = 0; s < pp && same; ++s) same = SameStates(InFlightStates(cut, s), full[s]);
    if (same) return cand;
  }
  return enough;
}

SearchSpec ProxyRunSpec(const SearchSpec& spec) {
  SearchSpec out = WithMicrobatches(spec, ProxyMicrobatches(spec));
  out.search.layout_proxy = false;
  return out;
}

LinkModel LinksOf(const SearchSpec& spec) {
  LinkModel l;
  l.gpus_per_node = std::max(1, spec.search.gpus_per_node);
  l.nvlink_bytes_per_s = spec.search.nvlink_gb_s * 1e9;
  l.network_bytes_per_s = spec.search.network_gb_s * 1e9;
  // NCCL's per-call latency on one node is about 10 us for small messages; taken for every
  // call, inside or between nodes (the per-layer calls of TP are the ones it matters for).
  l.latency_s = 10e-6;
  return l;
}

double CommSeconds(const LinkModel& links, const std::vector<CommRecord>& comm) {
  double seconds = 0;
  for (const CommRecord& c : comm) {
    const int n = static_cast<int>(c.ranks.size());
    if (n <= 1) continue;
    bool crosses = false;
    for (int i = 0; i + 1 < n && !crosses; ++i) {
      // A ring visits members in order: one hop between nodes puts the ring on the network.
      crosses = c.ranks[i] / links.gpus_per_node != c.ranks[i + 1] / links.gpus_per_node;
    }
    const double bw = crosses ? links.network_bytes_per_s : links.nvlink_bytes_per_s;
    double factor = 1;
    switch (c.kind) {
      case CollectiveKind::kAllReduce: factor = 2.0 * (n - 1) / n; break;
      case CollectiveKind::kAllGather:
      case CollectiveKind::kReduceScatter:
      case CollectiveKind::kAllToAll: factor = static_cast<double>(n - 1) / n; break;
      case CollectiveKind::kSendRecv: factor = 1; break;
    }
    seconds += factor * c.bytes / bw + c.calls * links.latency_s;
  }
  return seconds;
}

TrialResult CombineLayoutProxies(const SearchSpec& spec,
                                 const std::vector<RoleMeasurement>& measured) {
  TrialResult out;
  out.predicted = true;
  if (measured.empty()) {
    out.status = TrialStatus::kFailed;
    out.message = "layout proxy: no stage was measured";
    return out;
  }
  out.policy = measured.front().result.policy;
  for (const RoleMeasurement& m : measured) {
    ProxyMeasurement pm;
    pm.role = m.role.name;
    pm.rank = m.role.rank;
    pm.num_layers = StageLayerCount(spec, m.role.pp_rank);
    pm.ranks = m.result.ranks;
    for (RankResult& r : pm.ranks) r.rank = m.role.rank;
    pm.step_time_s = m.result.step_time_s;
    out.proxies.push_back(std::move(pm));
    out.setup_s += m.result.setup_s;
    if (out.versions.empty()) out.versions = m.result.versions;
  }
  // A stage that did not measure decides the trial (an OOM on one stage is the layout's OOM).
  for (const RoleMeasurement& m : measured) {
    if (m.result.status == TrialStatus::kOk) continue;
    out.status = m.result.status;
    out.message = "layout proxy, " + m.role.name + " (rank " + std::to_string(m.role.rank) +
                  "): " + m.result.message;
    for (RankResult r : m.result.ranks) {
      r.rank = m.role.rank;
      out.ranks.push_back(r);
    }
    return out;
  }

  const int pp = std::max(1, spec.parallel.pipeline_model_parallel_size);
  const int run_microbatches = ProxyMicrobatches(spec);
  const int microbatches = spec.NumMicrobatches();
  const LinkModel links = LinksOf(spec);
  std::vector<StageFigures> stages(pp);
  std::vector<bool> known(pp, false);
  for (const RoleMeasurement& m : measured) {
    StageFigures f;
    for (const RankResult& r : m.result.ranks) {
      f.peak_allocated = std::max(f.peak_allocated, static_cast<double>(r.peak_allocated_bytes));
      f.peak_reserved = std::max(f.peak_reserved, static_cast<double>(r.peak_reserved_bytes));
      f.static_bytes = std::max(f.static_bytes, static_cast<double>(r.static_bytes));
    }
    std::vector<CommRecord> in_schedule, after;
    SplitComm(spec, m.comm, &in_schedule, &after);
    f.microbatch_s =
        (m.schedule_s + CommSeconds(links, in_schedule)) / std::max(1, run_microbatches);
    f.optimizer_s = m.optimizer_s + CommSeconds(links, after);
    const int s = std::clamp(m.role.pp_rank, 0, pp - 1);
    stages[s] = f;
    known[s] = true;
  }
  // Unmeasured middle stages: linear in the stage index between the nearest measured stages on
  // either side (ProxyRoles measures the ends of every run of alike stages, which bracket them).
  for (int s = 0; s < pp; ++s) {
    if (known[s]) continue;
    int lo = s - 1, hi = s + 1;
    while (lo >= 0 && !known[lo]) --lo;
    while (hi < pp && !known[hi]) ++hi;
    if (lo < 0 && hi >= pp) continue;
    if (lo < 0) lo = hi;
    if (hi >= pp) hi = lo;
    const double t = hi == lo ? 0 : static_cast<double>(s - lo) / (hi - lo);
    const StageFigures& a = stages[lo];
    const StageFigures& b = stages[hi];
    stages[s] = {Lerp(a.peak_allocated, b.peak_allocated, t),
                 Lerp(a.peak_reserved, b.peak_reserved, t),
                 Lerp(a.static_bytes, b.static_bytes, t), Lerp(a.microbatch_s, b.microbatch_s, t),
                 Lerp(a.optimizer_s, b.optimizer_s, t)};
  }

  // The step: M micro-batches through the slowest stage, plus the pipeline's fill and drain,
  // (PP - 1) / VPP micro-batch times (the interleaved schedule's bubble), then the optimizer of
  // the slowest stage.
  double slowest_mb = 0, slowest_opt = 0;
  for (const StageFigures& f : stages) {
    slowest_mb = std::max(slowest_mb, f.microbatch_s);
    slowest_opt = std::max(slowest_opt, f.optimizer_s);
  }
  const int vpp = spec.parallel.VirtualChunks();
  const double bubble = static_cast<double>(pp - 1) / vpp;
  const double step = (microbatches + bubble) * slowest_mb + slowest_opt;

  double spread = 0;
  for (const RoleMeasurement& m : measured) spread = std::max(spread, m.result.RelativeSpread());
  const int per_stage = RanksPerStage(spec.parallel);
  const int world = std::max(1, spec.parallel.WorldSize());
  out.ranks.reserve(world);
  for (int r = 0; r < world; ++r) {
    const StageFigures& f = stages[std::min(pp - 1, r / per_stage)];
    RankResult rr;
    rr.rank = r;
    rr.peak_allocated_bytes = static_cast<uint64_t>(std::llround(f.peak_allocated));
    rr.peak_reserved_bytes = static_cast<uint64_t>(std::llround(f.peak_reserved));
    rr.static_bytes = static_cast<uint64_t>(std::llround(f.static_bytes));
    rr.step_time_s = step;
    out.ranks.push_back(rr);
  }
  out.status = TrialStatus::kOk;
  out.step_time_s = step;
  out.step_time_spread_s = spread * step;
  out.tokens_per_s = TokensPerSecond(spec, step);
  out.model_tflops = step > 0 ? ModelFlopsPerStep(spec) / (step * world * 1e12) : 0;
  out.warmup_settled = true;
  for (const RoleMeasurement& m : measured) {
    out.warmup_steps_taken = std::max(out.warmup_steps_taken, m.result.warmup_steps_taken);
    out.warmup_settled = out.warmup_settled && m.result.warmup_settled;
  }
  std::string ranks_measured;
  for (const RoleMeasurement& m : measured) {
    ranks_measured += (ranks_measured.empty() ? "" : ", ") + std::to_string(m.role.rank);
  }
  out.message = "layout proxy: " + std::to_string(measured.size()) + " of " +
                std::to_string(pp) + " pipeline stages measured alone on one device (ranks " +
                ranks_measured + ")" +
                (static_cast<int>(measured.size()) < pp ? ", the others interpolated" : "") +
                ", " + std::to_string(run_microbatches) + " of " + std::to_string(microbatches) +
                " micro-batches run; step time modelled (pipeline bubble " +
                std::to_string(pp - 1) + "/" + std::to_string(vpp) +
                " micro-batches; links " + Gb(links.nvlink_bytes_per_s) + " GB/s in a node of " +
                std::to_string(links.gpus_per_node) + ", " + Gb(links.network_bytes_per_s) +
                " GB/s between nodes)";
  return out;
}

}  // namespace remat::search
