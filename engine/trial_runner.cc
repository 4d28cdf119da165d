#include "engine/trial_runner.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "common/version.h"
#include "engine/collectives.h"
#include "engine/memory_tracker.h"
#include "engine/model.h"
#include "engine/moe_dispatch.h"
#include "engine/ops.h"
#include "engine/optimizer.h"
#include "engine/rank_setup.h"
#include "engine/te_optimizer.h"
#include "search/depth_proxy.h"
#include "search/layout_proxy.h"
#include "search/noise.h"
#include "search/pipeline.h"
#include "search/proxy_driver.h"
#include "search/rank_layout.h"
#include "search/rules.h"
#include "search/steady_state.h"
#include "search/trial.h"

#ifdef REMAT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace remat::engine {
namespace {

using Clock = std::chrono::steady_clock;
using search::TrialStatus;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Megatron's model FLOPs per step over all GPUs (training.py num_floating_point_operations):
// 3x forward (forward, backward wgrad, backward dgrad), recompute not counted.
double ModelFlopsPerStep(const search::SearchSpec& spec, int64_t vocab_padded) {
  const auto& m = spec.model;
  const double b = static_cast<double>(spec.EffectiveGlobalBatchSize());
  const double s = m.seq_length, h = m.hidden_size, a = m.num_attention_heads;
  const double tokens = b * s, s2 = b * s * s;
  const double ffn_exp = m.gated_linear_unit ? 3 : 2;
  double attn_linear = 0, core = 0;
  if (m.multi_latent_attention) {
    const double qk = m.qk_head_dim, pe = m.qk_pos_emb_head_dim, v = m.v_head_dim;
    const double kvr = m.kv_lora_rank;
    const double q_term =
        m.q_lora_rank ? *m.q_lora_rank * (h + a * (qk + pe) + 1) : h * a * (qk + pe);
    attn_linear = 6 * (q_term + kvr * (h + a * (qk + v) + 1) + h * pe + a * v * h);
    core = 6 * (a * (qk + pe) / 2 + a * v / 2);
  } else {
    const double q = static_cast<double>(m.EffectiveKvChannels()) * a;
    const double kv = static_cast<double>(m.EffectiveKvChannels()) * m.EffectiveQueryGroups();
    attn_linear = 6 * (h * (q + 2 * kv) + q * h);
    core = 6 * q;
  }
  const int moe_layers = m.IsMoe() ? m.NumMoeLayers() : 0;
  const int dense_layers = m.num_layers - moe_layers;
  double mlp = m.EffectiveFfnHiddenSize() * ffn_exp * dense_layers;
  if (moe_layers > 0) {
    mlp += static_cast<double>(m.EffectiveMoeFfnHiddenSize()) * m.moe_router_topk * ffn_exp *
           moe_layers;
    if (m.HasSharedExperts()) mlp += *m.moe_shared_expert_intermediate_size * ffn_exp * moe_layers;
  }
  return tokens * (6 * h * mlp + attn_linear * m.num_layers + 6 * h * vocab_padded) +
         s2 * core * m.num_layers;
}

at::Device ChooseDevice(const search::SearchSpec& spec, int rank) {
  const auto want = spec.search.device;
  bool cuda_available = false;
#ifdef REMAT_WITH_CUDA
  cuda_available = c10::cuda::device_count() > 0;
#endif
  if (want == search::Device::kCpu) return at::kCPU;
  if (want == search::Device::kCuda && !cuda_available) {
    throw TrialStop{TrialStatus::kFailed,
                    "search.device is cuda but this remat-trial has no usable CUDA device "
                    "(built " +
                        std::string(
#ifdef REMAT_WITH_CUDA
                            "with"
#else
                            "without"
#endif
                            ) +
                        " CUDA)"};
  }
  if (!cuda_available) return at::kCPU;
#ifdef REMAT_WITH_CUDA
  const int local = rank % c10::cuda::device_count();
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(local));
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(local));
  // The caching allocator is set up lazily with the CUDA context: its statistics and memory
  // fraction calls refuse the device ("Invalid device argument") until something has run there.
  (void)at::empty({1}, at::TensorOptions().device(device));
  return device;
#else
  (void)rank;
  return at::kCPU;
#endif
}

void SynchronizeDevice(const at::Device& device) {
#ifdef REMAT_WITH_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#else
  (void)device;
#endif
}

std::string ErrorText(const std::exception& e) {
  if (const auto* c10e = dynamic_cast<const c10::Error*>(&e)) return c10e->what_without_backtrace();
  return e.what();
}

// One training step's forward and backward passes on this pipeline rank, in Megatron Core's
// order (search::ScheduleOps: 1F1B, or interleaved 1F1B over the rank's chunks). Between two
// compute steps one point-to-point exchange sends what the step produced (its activation to the
// next virtual stage, or its input gradient to the previous one) and receives what the next
// step needs, as Megatron's schedules pair them (send_forward_recv_backward and the like). A
// stage's output is freed once sent, keeping only its graph (Megatron's
// deallocate_pipeline_outputs). Returns the sum of the micro-batches' losses / M on the rank
// holding the loss, an undefined tensor elsewhere.
at::Tensor RunPipelineSchedule(const search::SearchSpec& spec, const Runtime& rt, GptModel& model,
                               const std::vector<search::PipelineOp>& schedule,
                               const at::Tensor& all_tokens, const at::Tensor& all_labels,
                               at::ScalarType dtype) {
  const int pp = rt.pp_size(), p = rt.pp_rank(), chunks = model.NumChunks();
  const int microbatches = spec.NumMicrobatches(), b = spec.train.micro_batch_size;
  const int next = (p + 1) % pp, prev = (p + pp - 1) % pp;
  const bool first_rank = p == 0, last_rank = p == pp - 1;
  auto first_virtual = [&](int chunk) { return first_rank && chunk == 0; };
  auto last_virtual = [&](int chunk) { return last_rank && chunk == chunks - 1; };
  // Tags keep activations and gradients apart where both travel between one pair (PP 2 with
  // interleaving); between two ranks each kind arrives in the order it was sent.
  constexpr int kActivationTag = 0, kGradientTag = 1;
  const DataType wire = dtype == at::kFloat ? DataType::kFloat32 : DataType::kBFloat16;
  const auto opts = at::TensorOptions().dtype(dtype).device(rt.device);
  const std::vector<int64_t> shape = model.ActivationShape();

  using Key = std::pair<int, int>;  // micro-batch, chunk
  std::map<Key, at::Tensor> inputs, outputs, output_grads;
  std::vector<PeerTransfer> batch;
  std::vector<at::Tensor> sent;  // kept alive until their exchange returns
  auto transfer = [&](bool send, int peer, int tag, const at::Tensor& t) {
    batch.push_back(
        PeerTransfer{send, peer, tag, t.data_ptr(), static_cast<size_t>(t.numel()), wire});
    if (send) sent.push_back(t);
  };
  auto receive_for = [&](const search::PipelineOp& op) {
    const Key key{op.microbatch, op.chunk};
    if (op.forward && !first_virtual(op.chunk)) {
      inputs[key] = at::empty(shape, opts);
      transfer(false, prev, kActivationTag, inputs[key]);
    } else if (!op.forward && !last_virtual(op.chunk)) {
      output_grads[key] = at::empty(shape, opts);
      transfer(false, next, kGradientTag, output_grads[key]);
    }
  };
  auto exchange = [&] {
    if (!batch.empty()) rt.comm->SendRecv(rt.pp, batch);
    batch.clear();
    sent.clear();
  };

  at::Tensor loss;
  if (!schedule.empty()) receive_for(schedule.front());
  exchange();
  for (size_t i = 0; i < schedule.size(); ++i) {
    const search::PipelineOp& op = schedule[i];
    const Key key{op.microbatch, op.chunk};
    at::Tensor to_free;  // a sent activation, freed after the exchange
    if (op.forward) {
      at::Tensor input, tokens, labels;
      if (first_virtual(op.chunk)) {
        tokens = all_tokens.narrow(0, static_cast<int64_t>(op.microbatch) * b, b).to(rt.device);
      } else {
        input = inputs.at(key);
        input.requires_grad_(true);
      }
      if (last_virtual(op.chunk)) {
        labels = all_labels.narrow(0, static_cast<int64_t>(op.microbatch) * b, b).to(rt.device);
        // The MTP layers there embed the tokens again (engine/mtp_block.h).
        if (!tokens.defined()) {
          tokens = all_tokens.narrow(0, static_cast<int64_t>(op.microbatch) * b, b).to(rt.device);
        }
      }
      at::Tensor out = model.Forward(op.chunk, input, tokens, labels);
      if (last_virtual(op.chunk)) {
        out = out / microbatches;  // Megatron divides each micro-batch's loss by M
        loss = loss.defined() ? loss + out.detach() : out.detach();
      } else {
        transfer(true, next, kActivationTag, out);
        if (!out.is_view()) to_free = out;
      }
      outputs[key] = out;
    } else {
      at::Tensor out = outputs.at(key);
      if (last_virtual(op.chunk)) {
        torch::autograd::backward({out});
      } else {
        torch::autograd::backward({out}, {output_grads.at(key)});
        output_grads.erase(key);
      }
      outputs.erase(key);
      if (!first_virtual(op.chunk)) {
        at::Tensor input = inputs.at(key);
        transfer(true, prev, kGradientTag, input.grad());
        inputs.erase(key);
      }
    }
    if (i + 1 < schedule.size()) receive_for(schedule[i + 1]);
    exchange();
    // Only the graph is needed for backward: the output's storage goes (the tensor keeps its
    // shape in the graph's metadata, which is what backward checks the gradient against).
    if (to_free.defined()) to_free.set_data(at::empty({1}, opts));
  }
  return loss;
}

}  // namespace

// Depth proxies (search/proxy_driver.h decides the depths, the cap, the failure handling and
// the prediction): the same ranks run each cut depth one after the other, each with its own
// rendezvous subfolder.
search::TrialResult RunDepthProxies(const TrialOptions& o) {
  search::TrialResult r =
      search::RunDepthProxies(o.spec, o.policy, [&](const search::SearchSpec& spec, int layers) {
        TrialOptions cut = o;
        cut.spec = spec;
        if (!o.rendezvous_dir.empty()) {
          cut.rendezvous_dir = o.rendezvous_dir + "/proxy-" + std::to_string(layers);
          std::error_code ec;  // every rank may create it; a failure shows at the rendezvous
          std::filesystem::create_directories(cut.rendezvous_dir, ec);
        }
        return RunTrial(cut);
      });
  // A layout proxy's result already numbers every rank of the layout.
  if (!o.spec.search.layout_proxy) {
    for (auto& rank : r.ranks) rank.rank = o.rank;
  }
  return r;
}

namespace {

// One step's forward and backward over its micro-batches; the step's mean loss (on the last
// pipeline stage; undefined elsewhere).
at::Tensor ForwardBackward(const search::SearchSpec& spec, const Runtime& rt, GptModel& model,
                           const std::vector<search::PipelineOp>& schedule,
                           const at::Tensor& all_tokens, const at::Tensor& all_labels,
                           at::ScalarType dtype) {
  const int b = spec.train.micro_batch_size, microbatches = spec.NumMicrobatches();
  const at::Device& device = rt.device;
  at::Tensor loss;  // sum of the micro-batches' losses / M: the step's mean, as Megatron logs
  if (spec.parallel.pipeline_model_parallel_size > 1) {
    loss = RunPipelineSchedule(spec, rt, model, schedule, all_tokens, all_labels, dtype);
  } else {
    for (int mb = 0; mb < microbatches; ++mb) {
      at::Tensor tokens = all_tokens.narrow(0, static_cast<int64_t>(mb) * b, b).to(device);
      at::Tensor labels = all_labels.narrow(0, static_cast<int64_t>(mb) * b, b).to(device);
      // Megatron divides each micro-batch's mean loss by M before its backward, so the
      // accumulated gradient is the step's mean.
      at::Tensor mb_loss = model.Loss(tokens, labels) / microbatches;
      torch::autograd::backward({mb_loss});
      loss = loss.defined() ? loss + mb_loss.detach() : mb_loss.detach();
    }
  }
  return loss;
}

// A stand-in step's calls added to the measured steps' sums.
void AddRecords(const StandInCollectives& stand_ins,
                std::map<std::pair<std::string, int>, search::CommRecord>* comm_sum) {
  for (const search::CommRecord& r : stand_ins.Records()) {
    search::CommRecord& sum = (*comm_sum)[{r.group, static_cast<int>(r.kind)}];
    if (sum.calls == 0) {
      sum.group = r.group;
      sum.kind = r.kind;
      sum.ranks = r.ranks;
    }
    sum.bytes += r.bytes;
    sum.calls += r.calls;
  }
}

// The loss and grad norm of the step every trial logs: the loss averaged over the data-parallel
// (and CP) ranks as Megatron logs it, computed on the last pipeline stage (the others add zero).
void RecordLoss(const Runtime& rt, const at::Tensor& loss, const at::Tensor& norm,
                search::TrialResult* result) {
  // The same step in every trial, whatever warm-up it takes, so that losses compare.
  // Megatron logs the loss averaged over the data-parallel ranks; the last pipeline stage
  // computes it (the others add zero).
  at::Tensor mean_loss = loss.defined() ? loss.to(at::kFloat).reshape({1}).clone()
                                        : at::zeros({1}, at::TensorOptions().device(rt.device));
  if (rt.pp.size() > 1) AllReduceTensor(rt, rt.pp, mean_loss, ReduceOp::kSum);
  // Under CP each rank's loss is the mean over its tokens (equal counts): the dp-cp mean.
  AllReduceTensor(rt, rt.dp_cp, mean_loss, ReduceOp::kSum);
  rt.comm->Synchronize();
  result->loss = mean_loss.item<double>() / rt.dp_cp.size();
  result->grad_norm = norm.item<double>();
}

// What a failed rank reports: its status and message, from the exception in flight.
void RecordFailure(MemoryTracker* tracker, search::TrialResult* result, search::RankResult* rank) {
  try {
    throw;
  } catch (const TrialStop& stop) {
    result->status = stop.status;
    result->message = stop.message;
  } catch (const CollectiveError& e) {
    result->status = TrialStatus::kFailed;
    result->message = std::string("collective failed: ") + e.what();
  } catch (const std::exception& e) {
    if (tracker != nullptr && tracker->FailedRequestBytes() > 0) {
      result->status = TrialStatus::kOom;
      rank->failing_request_bytes = tracker->FailedRequestBytes();
      result->message = "out of memory: " + ErrorText(e);
    } else if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) {
      result->status = TrialStatus::kOom;
      result->message = "out of memory: " + ErrorText(e);
    } else {
      result->status = TrialStatus::kFailed;
      result->message = ErrorText(e);
    }
  } catch (...) {
    result->status = TrialStatus::kFailed;
    result->message = "unknown error";
  }
}

// The rank's peaks; a failing statistics call fails the trial (RunTrial never throws).
void ReadPeaks(MemoryTracker* tracker, search::TrialResult* result, search::RankResult* rank) {
  if (tracker != nullptr) {
    try {  // RunTrial never throws: a failing statistics call is a failed trial too
      const MemoryStats stats = tracker->Stats();
      rank->peak_allocated_bytes = stats.peak_allocated_bytes;
      rank->peak_reserved_bytes = stats.peak_reserved_bytes;
      rank->alloc_retries = stats.alloc_retries;
      tracker->Stop();
    } catch (const std::exception& e) {
      result->status = TrialStatus::kFailed;
      result->message += std::string(result->message.empty() ? "" : "; ") +
                         "reading the allocator's statistics failed: " + ErrorText(e);
    }
  }
}

// Runs rank o.rank of the trial: with the real collectives, or (stand_in) alone with the
// stand-ins, filling `role`'s communication records and schedule/optimizer times too.
search::TrialResult RunRank(const TrialOptions& o, bool stand_in, search::RoleMeasurement* role) {
  const auto start = Clock::now();
  search::TrialResult result;
  result.policy = o.policy;
  search::RankResult rank;
  rank.rank = o.rank;

  MemoryTracker* tracker = nullptr;
  std::unique_ptr<MemoryTracker> cuda_tracker;
  try {
    const search::SearchSpec& spec = o.spec;
    CheckRunnable(o, stand_in);

    // A stand-in rank runs on the first device it sees, whichever rank it stands for.
    const at::Device device = ChooseDevice(spec, stand_in ? 0 : o.rank);
    result.versions = TrialVersions(device.is_cuda(), device.is_cuda() ? device.index() : -1);
    CheckTransport(spec, device);
#ifdef REMAT_WITH_CUDA
    if (device.is_cuda()) {
      cuda_tracker = NewCudaMemoryTracker(device.index());
      tracker = cuda_tracker.get();
    }
#endif
    if (tracker == nullptr) tracker = CpuMemoryTracker();
    tracker->Start(spec.search.MemoryBudgetBytes());

    StandInCollectives* stand_ins = nullptr;
    std::unique_ptr<Collectives> comm = MakeCollectives(o, stand_in, device, &stand_ins);
    const Runtime rt = MakeRuntime(o, comm.get(), stand_ins, device);

    const at::ScalarType dtype =
        spec.train.precision == search::Precision::kBf16 ? at::kBFloat16 : at::kFloat;
    {
      at::Generator cpu_gen = at::globalContext().defaultGenerator(at::kCPU);
      cpu_gen.set_current_seed(spec.train.seed);
    }
    GptModel model(spec, o.policy, rt, dtype);
    Optimizer optimizer(rt, model.params(), OptimizerDTypesOf(spec), spec.train.seed,
                        spec.train.use_distributed_optimizer);
    // Tokens: the same stream on every TP rank and pipeline stage, one per DP rank.
    at::Generator data_gen =
        at::make_generator<at::CPUGeneratorImpl>(spec.train.seed + 1 + rt.dp.rank);
    // Only the stages with the embedding or the loss read the batch (Megatron's middle stages
    // load no data).
    const std::vector<search::StageChunk> chunks = search::ChunksOf(spec, rt.pp_rank());
    const bool reads_data = chunks.front().has_embedding || chunks.back().has_loss;
    const std::vector<search::PipelineOp> schedule = search::ScheduleOps(spec, rt.pp_rank());

    const int b = spec.train.micro_batch_size, s = spec.model.seq_length;
    // Gradient accumulation: M micro-batches per step, the optimizer once (Megatron's
    // forward_backward_func). The step's tokens are drawn at once on the host, so M micro-batches
    // of b sequences see the tokens of one micro-batch of M x b.
    const int microbatches = spec.NumMicrobatches();
    // Warm-up until the step times settle (search/steady_state.h), then at least measure_steps
    // steps, until the median is known to search.noise_target (search/noise.h).
    const search::SearchOptions& so = spec.search;
    std::vector<double> warmup_times, times, judged_times;
    // Stand-ins: the measured steps' calls, and each step's forward/backward and optimizer parts.
    std::map<std::pair<std::string, int>, search::CommRecord> comm_sum;
    std::vector<double> schedule_times, optimizer_times;
    bool measuring = search::WarmupDone(so, warmup_times);
    result.setup_s = Seconds(start, Clock::now());
    for (int step = 0; !measuring || !search::MeasureDone(so, judged_times); ++step) {
      const int64_t rows = static_cast<int64_t>(microbatches) * b;
      at::Tensor all_tokens, all_labels;
      if (reads_data) {
        all_tokens = at::randint(0, spec.model.vocab_size, {rows, s}, data_gen, at::kLong);
        all_labels = at::randint(0, spec.model.vocab_size, {rows, s}, data_gen, at::kLong);
      }
      SynchronizeDevice(device);
      if (stand_ins != nullptr) stand_ins->ResetRecords();
      const auto t0 = Clock::now();
      optimizer.ZeroGrad();
      model.NewStep();
      // The sum of the micro-batches' losses / M: the step's mean, as Megatron logs it.
      const at::Tensor loss =
          ForwardBackward(spec, rt, model, schedule, all_tokens, all_labels, dtype);
      auto t_mid = t0;
      if (stand_ins != nullptr) {  // a real trial does not wait here (its step time stays whole)
        SynchronizeDevice(device);
        t_mid = Clock::now();
      }
      at::Tensor norm = optimizer.Step();
      comm->Synchronize();
      SynchronizeDevice(device);
      const auto t1 = Clock::now();
      if (stand_ins != nullptr && measuring) {
        AddRecords(*stand_ins, &comm_sum);
        schedule_times.push_back(Seconds(t0, t_mid));
        optimizer_times.push_back(Seconds(t_mid, t1));
      }
      // The same step in every trial, whatever warm-up it takes, so that losses compare.
      if (step == so.warmup_steps) RecordLoss(rt, loss, norm, &result);
      const double seconds = Seconds(t0, t1);
      // Every rank judges the slowest rank's times, so all of them stop warming up and measuring
      // at the same step (their collectives must pair up).
      double judged = seconds;
      if (o.world_size > 1 && (!measuring || search::MeasureStepCap(so) > so.measure_steps)) {
        at::Tensor t =
            at::full({1}, seconds, at::TensorOptions().dtype(at::kDouble).device(device));
        AllReduceTensor(rt, comm->World(), t, ReduceOp::kMax);
        comm->Synchronize();
        judged = t.item<double>();
      }
      if (measuring) {
        times.push_back(seconds);
        judged_times.push_back(judged);
        continue;
      }
      rank.warmup_step_times_s.push_back(seconds);
      warmup_times.push_back(judged);
      measuring = search::WarmupDone(so, warmup_times);
    }
    rank.warmup_steps_taken = static_cast<int>(warmup_times.size());
    result.warmup_steps_taken = rank.warmup_steps_taken;
    result.warmup_settled = search::Settled(so, warmup_times);
    rank.static_bytes = optimizer.StaticBytes() + model.Fp8WorkspaceBytes();
    rank.step_time_s = search::MedianStepTime(times);
    rank.step_times_s = times;
    result.step_time_s = rank.step_time_s;
    result.step_time_spread_s = *std::max_element(times.begin(), times.end()) -
                                *std::min_element(times.begin(), times.end());
    search::SetStepTimeInterval(so, judged_times, &result);
    result.forced_load_balancing = spec.model.IsMoe() && spec.model.moe_router_force_load_balancing;
    result.tokens_per_s = search::TokensPerSecond(spec, result.step_time_s);
    result.model_tflops = ModelFlopsPerStep(spec, search::PaddedVocabSize(spec)) /
                          (result.step_time_s * o.world_size * 1e12);
    result.status = TrialStatus::kOk;
    if (role != nullptr && !times.empty()) {
      const double steps = static_cast<double>(times.size());
      role->comm.clear();
      for (auto& [key, r] : comm_sum) {
        r.bytes /= steps;
        r.calls /= steps;
        role->comm.push_back(r);
      }
      role->schedule_s = search::MedianStepTime(schedule_times);
      role->optimizer_s = search::MedianStepTime(optimizer_times);
    }
  } catch (...) {
    RecordFailure(tracker, &result, &rank);
  }
  ReadPeaks(tracker, &result, &rank);
  result.ranks.push_back(rank);
  result.wall_s = Seconds(start, Clock::now());
  return result;
}

}  // namespace

search::RoleMeasurement RunStandInRank(const TrialOptions& o) {
  search::RoleMeasurement m;
  m.role.rank = o.rank;
  m.role.pp_rank = search::PlaceOf(o.spec.parallel, o.rank).pp;
  m.role.name = "rank " + std::to_string(o.rank);
  m.result = RunRank(o, /*stand_in=*/true, &m);
  return m;
}

// Layout proxies: each role of search::ProxyRoles runs alone in this process with the stand-in
// collectives, one after the other (each RunRank starts its own peak tracking; on CUDA the
// cache is emptied between roles so a role's reserved peak is its own), on ProxyRunSpec's
// micro-batches; search::CombineLayoutProxies predicts every rank of the layout from them.
search::TrialResult RunLayoutProxies(const TrialOptions& o) {
  const auto start = Clock::now();
  auto refuse = [&](const std::string& message) {
    search::TrialResult r;
    r.policy = o.policy;
    r.status = TrialStatus::kInvalid;
    r.message = message;
    return r;
  };
  // search::ValidateSpec has refused what cannot be proxied (another backend, depth proxies).
  const search::Status spec_ok = search::ValidateSpec(o.spec);
  if (!spec_ok.ok()) return refuse(spec_ok.message());
  const search::Status valid = search::ValidatePolicy(o.spec, o.policy);
  if (!valid.ok()) return refuse(valid.message());
  const search::SearchSpec run = search::ProxyRunSpec(o.spec);
  std::vector<search::RoleMeasurement> measured;
  for (const search::ProxyRole& role : search::ProxyRoles(o.spec)) {
    TrialOptions one = o;
    one.spec = run;
    one.rank = role.rank;
    one.world_size = run.parallel.WorldSize();
    one.rendezvous_dir.clear();
    search::RoleMeasurement m = RunStandInRank(one);
    m.role = role;
    measured.push_back(std::move(m));
#ifdef REMAT_WITH_CUDA
    if (o.spec.search.device != search::Device::kCpu && c10::cuda::device_count() > 0) {
      c10::cuda::CUDACachingAllocator::emptyCache();
    }
#endif
    if (measured.back().result.status != TrialStatus::kOk) break;
  }
  search::TrialResult r = search::CombineLayoutProxies(o.spec, measured);
  r.policy = o.policy;
  r.wall_s = Seconds(start, Clock::now());
  return r;
}

search::TrialResult RunTrial(const TrialOptions& o) {
  // Depth proxies first: with layout proxies too, each cut depth runs as a layout proxy (every
  // rank of the layout at that depth) and the line through the two gives the full depth.
  if (!o.spec.search.proxy_layers.empty()) return RunDepthProxies(o);
  if (o.spec.search.layout_proxy) return RunLayoutProxies(o);
  return RunRank(o, /*stand_in=*/false, nullptr);
}

}  // namespace remat::engine
