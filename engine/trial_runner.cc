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
#include <numeric>
#include <sstream>
#include <memory>
#include <stdexcept>

#include "search/depth_proxy.h"
#include "search/proxy_driver.h"
#include "search/layout_proxy.h"
#include "search/pipeline.h"
#include "search/rank_layout.h"
#include "search/rules.h"
#include "search/noise.h"
#include "search/steady_state.h"
#include "search/trial.h"
#include "engine/collectives.h"
#include "engine/memory_tracker.h"
#include "engine/model.h"
#include "engine/moe_dispatch.h"
#include "common/version.h"
#include "engine/ops.h"
#include "engine/te_optimizer.h"

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

// A result that ends the trial early with `status` and `message`.
struct TrialStop {
  TrialStatus status;
  std::string message;
};

// Megatron's GradBuffer hook: after AccumulateGrad has stored a parameter's gradient, add it to
// the fp32 main gradient and drop it, so each bf16 gradient lives only briefly.
class MainGradHook final : public torch::autograd::FunctionPostHook {
 public:
  MainGradHook(at::Tensor param, at::Tensor main_grad)
      : param_(std::move(param)), main_grad_(std::move(main_grad)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    at::Tensor& grad = param_.mutable_grad();
    if (grad.defined()) {
      main_grad_.add_(grad);
      grad.reset();
    }
    return outputs;
  }

 private:
  at::Tensor param_;
  at::Tensor main_grad_;
};

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
    const double q_term = m.q_lora_rank ? *m.q_lora_rank * (h + a * (qk + pe) + 1) : h * a * (qk + pe);
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
    mlp += static_cast<double>(m.EffectiveMoeFfnHiddenSize()) * m.moe_router_topk * ffn_exp * moe_layers;
    if (m.HasSharedExperts()) mlp += *m.moe_shared_expert_intermediate_size * ffn_exp * moe_layers;
  }
  return tokens * (6 * h * mlp + attn_linear * m.num_layers + 6 * h * vocab_padded) +
         s2 * core * m.num_layers;
}

// Flat buffers, as Megatron's DDP grad buffer and Float16Optimizer: the bf16 (or fp32) parameters,
// fp32 main gradients, fp32 master weights and the two Adam moments.
//
// With the distributed optimizer (train.use_distributed_optimizer, Megatron's
// DistributedOptimizer) the parameter and main-gradient buffers stay whole, but every
// data-parallel rank keeps master weights and Adam moments for its 1/DP shard of each bucket
// only: after the backward each bucket's gradients are reduce-scattered over its group (dense:
// DP, expert: expert-DP), each rank clips and updates its shard, and the parameters are
// all-gathered back. Static bytes are then 2 + 4 + 12/DP per parameter (fp32: 4 + 4 + 8/DP), as
// search/memory_model.cc's BytesPerParameter counts them. The gradient buffer, master weights
// and moments take the dtypes of `types` (engine/te_optimizer.h: bf16 gradients, the
// precision-aware optimizer).
class Optimizer {
 public:
  Optimizer(const Runtime& rt, std::vector<ParamInfo>& params, const OptimizerDTypes& types,
            uint64_t seed, bool distributed)
      : rt_(rt), params_(params), types_(types), dtype_(types.param), distributed_(distributed) {
    const at::ScalarType dtype = dtype_;
    // TP-split parameters first, then TP-duplicated ones (the gradient norm counts those on TP
    // rank 0 only), then shared copies (the last stage's tied embedding: not in the norm), then
    // expert weights (reduced over the expert-data-parallel group). Another EP rank's experts and
    // another pipeline stage's parameters get no storage.
    auto region = [](const ParamInfo& p) {
      if (p.expert) return kExpert;
      if (p.shared) return kShared;
      return p.tp_duplicate() ? kDuplicated : kSplit;
    };
    // Buckets, as Megatron's DDP builds them: dense and expert parameters in separate buffers
    // (reduced over different groups). The distributed optimizer gives the word embedding tied
    // across pipeline stages a bucket of its own, so that the first and the last stage shard it
    // alike and its all-reduce over the embedding group can follow the reduce-scatter; it pads
    // each parameter's start to 64 elements and each bucket's end to a multiple of
    // lcm(group size, 128), so every rank's shard has the same size.
    const Group& edp = rt.expert_dp.size() > 0 ? rt.expert_dp : rt.dp_cp;
    std::vector<std::vector<size_t>> members(3);  // dense, tied, expert
    for (int r = kSplit; r <= kExpert; ++r) {
      for (size_t i = 0; i < params.size(); ++i) {
        if (params[i].absent || region(params[i]) != r) continue;
        if (r == kExpert) {
          members[2].push_back(i);
        } else if (distributed && params[i].pipeline_tied && rt.embedding.size() > 1) {
          members[1].push_back(i);
        } else {
          members[0].push_back(i);
        }
      }
    }
    std::vector<int64_t> offset(params.size(), -1);
    for (int k = 0; k < 3; ++k) {
      if (members[k].empty()) continue;
      Bucket b;
      b.group = k == 2 ? &edp : &rt.dp_cp;  // Megatron's dp-cp group (the DP group at CP 1)
      b.begin = numel_;
      for (size_t i : members[k]) {
        if (distributed) numel_ = RoundUp(numel_, 64);
        offset[i] = numel_;
        const int64_t n = Numel(params[i]);
        const int r = region(params[i]);
        // Consecutive parameters of one region form one range of the norm (padding is zero).
        if (!b.ranges.empty() && b.ranges.back().region == r) {
          b.ranges.back().end = numel_ + n;
        } else {
          b.ranges.push_back(Range{numel_, numel_ + n, r});
        }
        numel_ += n;
      }
      const int64_t members_n = b.group->size();
      if (distributed) numel_ = b.begin + RoundUp(numel_ - b.begin, std::lcm<int64_t>(members_n, 128));
      b.end = numel_;
      b.shard_len = distributed ? (b.end - b.begin) / members_n : b.end - b.begin;
      b.shard_begin = b.begin + (distributed ? b.group->rank * b.shard_len : 0);
      b.state_offset = state_numel_;
      state_numel_ += b.shard_len;
      buckets_.push_back(std::move(b));
    }
    auto opts = at::TensorOptions().device(rt.device);
    param_buffer_ = at::zeros({numel_}, opts.dtype(dtype));  // padding stays zero
    {
      at::NoGradGuard no_grad;
      // Initialise every parameter in declaration order from the full (unsharded) tensor, so a
      // TP run starts from the same weights as its 1-rank equivalent.
      at::Generator gen = at::globalContext().defaultGenerator(rt.device);
      gen.set_current_seed(seed);
      for (size_t i = 0; i < params.size(); ++i) {
        ParamInfo& p = params[i];
        if (p.copy_of >= 0) continue;  // filled with its source below
        at::Tensor full = at::empty(p.full_shape, opts.dtype(at::kFloat));
        if (p.init_std > 0) {
          full.normal_(0.0, p.init_std, gen);
        } else {
          full.fill_(p.init_value);
        }
        for (size_t j = 0; j < params.size(); ++j) {
          if (params[j].copy_of != static_cast<int>(i)) continue;
          at::Tensor shard = Shard(full, params[j]);
          param_buffer_.narrow(0, offset[j], shard.numel()).view(params[j].shape).copy_(shard);
        }
        if (p.absent) continue;  // drawn all the same: every rank's stream stays aligned
        at::Tensor shard = Shard(full, p);
        at::Tensor view = param_buffer_.narrow(0, offset[i], shard.numel()).view(p.shape);
        view.copy_(shard);
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      ParamInfo& p = params[i];
      if (p.absent) continue;
      // A leaf parameter whose data is a view of the buffer (Megatron: param.data = buffer view).
      p.value = at::empty({0}, opts.dtype(dtype));
      p.value.set_data(param_buffer_.narrow(0, offset[i], Numel(p)).view(p.shape));
      p.value.requires_grad_(true);
    }
    // DDP: the main-gradient buffer (fp32, or bf16 without grad_reduce_in_fp32) and its hooks.
    grad_buffer_ = at::zeros({numel_}, opts.dtype(types_.grad));
    for (size_t i = 0; i < params.size(); ++i) {
      ParamInfo& p = params[i];
      if (p.absent) continue;
      at::Tensor main_grad = grad_buffer_.narrow(0, offset[i], Numel(p)).view(p.shape);
      std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(p.value);
      acc->add_post_hook(std::make_unique<MainGradHook>(p.value, main_grad));
      accumulators_.push_back(std::move(acc));  // the hook lives on this very node: keep it
      if (p.sequence_parallel_grad) sp_grads_.push_back(main_grad);
      if (p.pipeline_tied) tied_grads_.push_back(main_grad);
    }
    // Float16Optimizer: master weights of this rank's shards (fp32 runs update the parameters
    // directly; FusedAdam keeps int16 remainders or fp16).
    if (types_.master != MasterWeights::kNone) {
      master_ = at::empty({state_numel_}, opts.dtype(types_.MasterStorage()));
      for (const Bucket& b : buckets_) {
        at::Tensor master = master_.narrow(0, b.state_offset, b.shard_len);
        InitMasterWeights(types_, param_buffer_.narrow(0, b.shard_begin, b.shard_len), master);
      }
    }
  }

  ~Optimizer() {
    for (ParamInfo& p : params_) p.value = at::Tensor();
    accumulators_.clear();
  }

  int64_t numel() const { return numel_; }

  // Bytes of weights, main gradients, master weights and Adam states once all exist.
  uint64_t StaticBytes() const { return types_.StaticBytes(numel_, state_numel_); }

  void ZeroGrad() { grad_buffer_.zero_(); }  // also clears Step()'s scratch use of it

  // Megatron's finalize_model_grads + clip_grad_norm + Adam step. Returns the gradient norm
  // (before clipping) as a device scalar.
  at::Tensor Step() {
    at::NoGradGuard no_grad;
    if (rt_.sequence_parallel && !sp_grads_.empty()) {
      std::vector<at::Tensor> flat;
      for (const at::Tensor& g : sp_grads_) flat.push_back(g.reshape({-1}));
      at::Tensor packed = at::cat(flat);
      AllReduceTensor(rt_, rt_.tp, packed, ReduceOp::kSum);
      int64_t off = 0;
      for (at::Tensor& g : sp_grads_) {
        g.copy_(packed.narrow(0, off, g.numel()).view(g.sizes()));
        off += g.numel();
      }
    }
    // Megatron's DDP: every gradient is scaled by 1 / (DP x CP); dense ones are summed over the
    // dp-cp group, expert ones over the expert-data-parallel group (their tokens came from every
    // EP rank already). The distributed optimizer reduce-scatters instead: only this rank's shard
    // is summed.
    if (rt_.dp_cp.size() > 1) grad_buffer_.mul_(1.0 / rt_.dp_cp.size());
    for (const Bucket& b : buckets_) {
      if (b.group->size() == 1) continue;
      if (distributed_) {
        char* base = static_cast<char*>(grad_buffer_.data_ptr());
        const size_t elem = grad_buffer_.element_size();
        rt_.comm->ReduceScatter(*b.group, base + b.begin * elem, base + b.shard_begin * elem,
                                static_cast<size_t>(b.shard_len),
                                types_.grad == at::kFloat ? DataType::kFloat32 : DataType::kBFloat16);
      } else {
        at::Tensor all = grad_buffer_.narrow(0, b.begin, b.end - b.begin);
        AllReduceTensor(rt_, *b.group, all, ReduceOp::kSum);
      }
    }
    // Megatron's _allreduce_word_embedding_grads: the first stage's word embedding and the last
    // stage's copy get the sum of both gradients, so both take the same step (with the
    // distributed optimizer both sit at the same place of a bucket of their own, so the
    // reduced shards line up).
    if (rt_.embedding.size() > 1) {
      for (at::Tensor& g : tied_grads_) AllReduceTensor(rt_, rt_.embedding, g, ReduceOp::kSum);
    }
    // Megatron's optimizer without the precision-aware FusedAdam reads fp32 gradients: 16-bit
    // shards are copied to fp32 first (held until the step ends).
    at::Tensor main_grads;
    if (types_.UpcastsGrads()) {
      main_grads = at::empty({state_numel_}, grad_buffer_.options().dtype(at::kFloat));
      for (const Bucket& b : buckets_) {
        main_grads.narrow(0, b.state_offset, b.shard_len)
            .copy_(grad_buffer_.narrow(0, b.shard_begin, b.shard_len));
      }
    }
    // The norm over this rank's shards: TP-split gradients, TP-duplicated ones on TP rank 0 only,
    // never the shared copy; summed over DP (the shards) and TP, expert ones over expert-DP and EP.
    at::Tensor sq = at::zeros({1}, grad_buffer_.options().dtype(at::kDouble));
    at::Tensor esq = at::zeros({1}, grad_buffer_.options().dtype(at::kDouble));
    bool experts = false;
    for (const Bucket& b : buckets_) {
      for (const Range& r : b.ranges) {
        const int64_t lo = std::max(r.begin, b.shard_begin);
        const int64_t hi = std::min(r.end, b.shard_begin + b.shard_len);
        if (r.region == kExpert) experts = true;
        if (hi <= lo || r.region == kShared) continue;
        if (r.region == kDuplicated && rt_.tp_rank() != 0) continue;
        at::Tensor part = SquaredNorm(grad_buffer_.narrow(0, lo, hi - lo));
        if (r.region == kExpert) {
          esq += part;
        } else {
          sq += part;
        }
      }
    }
    if (distributed_) AllReduceTensor(rt_, rt_.dp_cp, sq, ReduceOp::kSum);
    AllReduceTensor(rt_, rt_.tp, sq, ReduceOp::kSum);
    if (experts) {  // each EP rank holds a share of the experts: sum the shares
      const Group& edp = rt_.expert_dp.size() > 0 ? rt_.expert_dp : rt_.dp_cp;
      if (distributed_) AllReduceTensor(rt_, edp, esq, ReduceOp::kSum);
      // every rank of an ETP x EP block holds other expert shards
      if (rt_.expert_tp_ep.size() > 1) AllReduceTensor(rt_, rt_.expert_tp_ep, esq, ReduceOp::kSum);
      sq = sq + esq;
    }
    // Every stage holds its own layers: the squares add up over the pipeline (Megatron reduces
    // the norm over the model-parallel group).
    if (rt_.pp.size() > 1) AllReduceTensor(rt_, rt_.pp, sq, ReduceOp::kSum);
    at::Tensor norm = sq.sqrt().to(at::kFloat);
    at::Tensor coef = (kMaxGradNorm / (norm + 1e-6)).clamp_max(1.0);

    ++step_;
    if (!exp_avg_.defined()) {  // optimizer state, created at the first step as Adam does
      exp_avg_ = at::zeros({state_numel_}, grad_buffer_.options().dtype(types_.exp_avg));
      exp_avg_sq_ = at::zeros({state_numel_}, grad_buffer_.options().dtype(types_.exp_avg_sq));
    }
    AdamHyper hyper{kLr, kBeta1, kBeta2, kEps, kWeightDecay, step_};
    for (const Bucket& b : buckets_) {
      // AdamW without temporaries (as a fused Adam): once the moments are updated the gradient
      // is spent, so its buffer holds the denominator.
      at::Tensor g = main_grads.defined() ? main_grads.narrow(0, b.state_offset, b.shard_len)
                                          : grad_buffer_.narrow(0, b.shard_begin, b.shard_len);
      AdamUpdate(types_, hyper, g, coef, param_buffer_.narrow(0, b.shard_begin, b.shard_len),
                 master_.defined() ? master_.narrow(0, b.state_offset, b.shard_len) : at::Tensor(),
                 exp_avg_.narrow(0, b.state_offset, b.shard_len),
                 exp_avg_sq_.narrow(0, b.state_offset, b.shard_len));
      // The distributed optimizer's parameter all-gather: every rank's updated shard, in place.
      if (distributed_ && b.group->size() > 1) {
        char* base = static_cast<char*>(param_buffer_.data_ptr());
        const size_t elem = param_buffer_.element_size();
        rt_.comm->AllGather(*b.group, base + b.shard_begin * elem, base + b.begin * elem,
                            static_cast<size_t>(b.shard_len),
                            dtype_ == at::kFloat ? DataType::kFloat32 : DataType::kBFloat16);
      }
    }
    return norm;
  }

 private:
  static constexpr double kLr = 1e-4, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8,
                          kWeightDecay = 0.01, kMaxGradNorm = 1.0;
  // Where a parameter sits in the buffer, in this order.
  static constexpr int kSplit = 0, kDuplicated = 1, kShared = 2, kExpert = 3;

  // Consecutive parameters of one region within a bucket.
  struct Range {
    int64_t begin = 0, end = 0;
    int region = kSplit;
  };
  // One bucket of the buffers and this rank's shard of it (the whole bucket without the
  // distributed optimizer); its master weights and Adam moments sit at state_offset.
  struct Bucket {
    const Group* group = nullptr;  // reduced over (rt_.dp_cp or the expert-DP group)
    int64_t begin = 0, end = 0;
    int64_t shard_begin = 0, shard_len = 0;
    int64_t state_offset = 0;
    std::vector<Range> ranges;
  };

  static int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

  // The sum of squares of a flat gradient range as a [1] fp64 tensor: fp32 norms of blocks of
  // 4096 elements (as a fused multi-tensor norm works block by block), added in fp64. One fp32
  // norm over millions of elements is off by ~1e-5 relative, and by a different amount once the
  // range is split over pipeline stages; this keeps the figure independent of the split.
  static at::Tensor SquaredNorm(const at::Tensor& flat) {
    constexpr int64_t kBlock = 4096;
    if (flat.scalar_type() != at::kFloat) {  // bf16 gradients: fp32 norms, 64 blocks at a time
      at::Tensor sq = at::zeros({1}, flat.options().dtype(at::kDouble));
      for (int64_t lo = 0; lo < flat.numel(); lo += 64 * kBlock) {
        sq += SquaredNorm(flat.narrow(0, lo, std::min(64 * kBlock, flat.numel() - lo)).to(at::kFloat));
      }
      return sq;
    }
    const int64_t n = flat.numel(), rows = n / kBlock;
    at::Tensor sq = at::zeros({1}, flat.options().dtype(at::kDouble));
    if (rows > 0) {
      sq += flat.narrow(0, 0, rows * kBlock).view({rows, kBlock}).norm(2, {1}).to(at::kDouble)
                .pow(2).sum();
    }
    if (n > rows * kBlock) sq += flat.narrow(0, rows * kBlock, n - rows * kBlock).norm().to(at::kDouble).pow(2);
    return sq;
  }

  static int64_t Numel(const ParamInfo& p) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    return n;
  }

  // This TP rank's slice of a full parameter (block-wise for fused [gate; up] weights), or this
  // EP rank's flat chunk of an expert weight.
  at::Tensor Shard(const at::Tensor& full, const ParamInfo& p) const {
    if (p.expert) return ExpertShard(rt_, full, p);
    if (p.shard_dim < 0) return full;
    const int64_t tp = rt_.tp_size(), rank = rt_.tp_rank();
    std::vector<at::Tensor> blocks = full.chunk(p.shard_blocks, p.shard_dim);
    std::vector<at::Tensor> mine;
    for (const at::Tensor& b : blocks) {
      const int64_t part = b.size(p.shard_dim) / tp;
      mine.push_back(b.narrow(p.shard_dim, part * rank, part));
    }
    return at::cat(mine, p.shard_dim).contiguous();
  }

  const Runtime& rt_;
  std::vector<ParamInfo>& params_;
  OptimizerDTypes types_;
  at::ScalarType dtype_;
  bool distributed_ = false;
  int64_t numel_ = 0;        // the buffers' elements, padding included
  int64_t state_numel_ = 0;  // elements of master weights and each Adam moment (the shards)
  std::vector<Bucket> buckets_;
  at::Tensor param_buffer_, grad_buffer_, master_, exp_avg_, exp_avg_sq_;
  std::vector<at::Tensor> sp_grads_;
  std::vector<at::Tensor> tied_grads_;  // the word embedding or its last-stage copy
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  int step_ = 0;
};

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
    batch.push_back(PeerTransfer{send, peer, tag, t.data_ptr(), static_cast<size_t>(t.numel()), wire});
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
  search::TrialResult r = search::RunDepthProxies(
      o.spec, o.policy, [&](const search::SearchSpec& spec, int layers) {
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
    search::Status policy_ok = search::ValidatePolicy(spec, o.policy);
    if (!policy_ok.ok()) throw TrialStop{TrialStatus::kInvalid, policy_ok.message()};
    std::string unsupported = UnsupportedReason(spec, o.policy);
    if (!unsupported.empty()) throw TrialStop{TrialStatus::kInvalid, unsupported};
    if (o.world_size != spec.parallel.WorldSize() || o.rank < 0 || o.rank >= o.world_size) {
      throw TrialStop{TrialStatus::kInvalid,
                      "world size " + std::to_string(o.world_size) + " / rank " +
                          std::to_string(o.rank) + " do not match the spec's layout (TP x PP x DP = " +
                          std::to_string(spec.parallel.WorldSize()) + ")"};
    }
    if (o.world_size > 1 && o.rendezvous_dir.empty() && !stand_in) {
      throw TrialStop{TrialStatus::kInvalid, "a multi-rank trial needs a rendezvous directory"};
    }
    if (spec.search.measure_steps < 1) {
      throw TrialStop{TrialStatus::kInvalid, "search.measure_steps must be at least 1"};
    }

    // A stand-in rank runs on the first device it sees, whichever rank it stands for.
    const at::Device device = ChooseDevice(spec, stand_in ? 0 : o.rank);
    result.versions = TrialVersions(device.is_cuda(), device.is_cuda() ? device.index() : -1);
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
#ifdef REMAT_WITH_CUDA
    if (device.is_cuda()) {
      cuda_tracker = NewCudaMemoryTracker(device.index());
      tracker = cuda_tracker.get();
    }
#endif
    if (tracker == nullptr) tracker = CpuMemoryTracker();
    tracker->Start(spec.search.MemoryBudgetBytes());

    CollectivesOptions copts;
    copts.rank = o.rank;
    copts.world_size = o.world_size;
    copts.rendezvous_dir = o.rendezvous_dir;
    copts.timeout_s = o.collective_timeout_s;
    copts.nccl_point_to_point = o.nccl_point_to_point;
    std::unique_ptr<Collectives> comm;
    StandInCollectives* stand_ins = nullptr;
    if (stand_in) {
      std::unique_ptr<StandInCollectives> s = NewStandInCollectives(
          o.rank, o.world_size, device.is_cuda() ? device.index() : -1,
          spec.train.seed * 1000003 + static_cast<uint64_t>(o.rank));
      stand_ins = s.get();
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

    Runtime rt;
    rt.comm = comm.get();
    rt.device = device;
    // Megatron Core's rank order (search/rank_layout.h).
    const int pp = spec.parallel.pipeline_model_parallel_size;
    const search::ParallelGroups groups = search::GroupsOf(spec.parallel);
    // Stand-ins record every call under its group's name (search::CommRecord::group).
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
      if (spec.model.share_embeddings_and_output_weights) {
        // Megatron's embedding group: the first and the last stage of each pipeline.
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
    at::Generator data_gen = at::make_generator<at::CPUGeneratorImpl>(spec.train.seed + 1 + rt.dp.rank);
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
      at::Tensor loss;  // sum of the micro-batches' losses / M: the step's mean, as Megatron logs
      if (pp > 1) {
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
        for (const search::CommRecord& r : stand_ins->Records()) {
          search::CommRecord& sum = comm_sum[{r.group, static_cast<int>(r.kind)}];
          if (sum.calls == 0) {
            sum.group = r.group;
            sum.kind = r.kind;
            sum.ranks = r.ranks;
          }
          sum.bytes += r.bytes;
          sum.calls += r.calls;
        }
        schedule_times.push_back(Seconds(t0, t_mid));
        optimizer_times.push_back(Seconds(t_mid, t1));
      }
      if (step == so.warmup_steps) {
        // The same step in every trial, whatever warm-up it takes, so that losses compare.
        // Megatron logs the loss averaged over the data-parallel ranks; the last pipeline stage
        // computes it (the others add zero).
        at::Tensor mean_loss = loss.defined() ? loss.to(at::kFloat).reshape({1}).clone()
                                              : at::zeros({1}, at::TensorOptions().device(device));
        if (rt.pp.size() > 1) AllReduceTensor(rt, rt.pp, mean_loss, ReduceOp::kSum);
        // Under CP each rank's loss is the mean over its tokens (equal counts): the dp-cp mean.
        AllReduceTensor(rt, rt.dp_cp, mean_loss, ReduceOp::kSum);
        comm->Synchronize();
        result.loss = mean_loss.item<double>() / rt.dp_cp.size();
        result.grad_norm = norm.item<double>();
      }
      const double seconds = Seconds(t0, t1);
      // Every rank judges the slowest rank's times, so all of them stop warming up and measuring
      // at the same step (their collectives must pair up).
      double judged = seconds;
      if (o.world_size > 1 && (!measuring || search::MeasureStepCap(so) > so.measure_steps)) {
        at::Tensor t = at::full({1}, seconds, at::TensorOptions().dtype(at::kDouble).device(device));
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
    rank.static_bytes = optimizer.StaticBytes();
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
  } catch (const TrialStop& stop) {
    result.status = stop.status;
    result.message = stop.message;
  } catch (const CollectiveError& e) {
    result.status = TrialStatus::kFailed;
    result.message = std::string("collective failed: ") + e.what();
  } catch (const std::exception& e) {
    if (tracker != nullptr && tracker->FailedRequestBytes() > 0) {
      result.status = TrialStatus::kOom;
      rank.failing_request_bytes = tracker->FailedRequestBytes();
      result.message = "out of memory: " + ErrorText(e);
    } else if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) {
      result.status = TrialStatus::kOom;
      result.message = "out of memory: " + ErrorText(e);
    } else {
      result.status = TrialStatus::kFailed;
      result.message = ErrorText(e);
    }
  } catch (...) {
    result.status = TrialStatus::kFailed;
    result.message = "unknown error";
  }
  if (tracker != nullptr) {
    try {  // RunTrial never throws: a failing statistics call is a failed trial too
      const MemoryStats stats = tracker->Stats();
      rank.peak_allocated_bytes = stats.peak_allocated_bytes;
      rank.peak_reserved_bytes = stats.peak_reserved_bytes;
      rank.alloc_retries = stats.alloc_retries;
      tracker->Stop();
    } catch (const std::exception& e) {
      result.status = TrialStatus::kFailed;
      result.message += std::string(result.message.empty() ? "" : "; ") +
                        "reading the allocator's statistics failed: " + ErrorText(e);
    }
  }
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

namespace {

#ifdef REMAT_WITH_CUDA
// The NVIDIA kernel driver's release ("550.54.15"), from the file the driver publishes; else the
// CUDA driver API version the runtime reports; "none" without CUDA.
std::string DriverVersion() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (std::getline(in, line)) {
    const std::string marker = "Kernel Module";
    const size_t at = line.find(marker);
    if (at != std::string::npos) {
      // "... Kernel Module  550.54.15  ..." or "... Open Kernel Module for x86_64  570.86.15 ...":
      // the first word after the marker that starts with a digit.
      std::istringstream rest(line.substr(at + marker.size()));
      std::string word;
      while (rest >> word) {
        if (std::isdigit(static_cast<unsigned char>(word[0]))) return word;
      }
    }
  }
  int api = 0;
  if (cudaDriverGetVersion(&api) == cudaSuccess && api > 0) {
    return "cuda-api-" + std::to_string(api / 1000) + "." + std::to_string(api % 1000 / 10);
  }
  return "none";
}
#endif

// What the engine runs with on `device` (a CUDA device index, or -1 for the CPU): the CUDA-side
// entries are "none" for the CPU, whatever the build could do.
std::vector<std::pair<std::string, std::string>> VersionsOn(int cuda_device) {
  std::vector<std::pair<std::string, std::string>> v;
  v.emplace_back("remat", common::kVersion);
  v.emplace_back("torch", TORCH_VERSION);
  std::string cuda = "none", nccl = "none", driver = "none", gpu = "none";
  std::string device = "cpu";
#ifdef REMAT_WITH_CUDA
  if (cuda_device >= 0) {
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    cuda = std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10);
    int version = 0;
    ncclGetVersion(&version);
    nccl = std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
           std::to_string(version % 100);
    driver = DriverVersion();
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, cuda_device) == cudaSuccess) gpu = prop.name;
    device = "cuda";
  }
#else
  (void)cuda_device;
#endif
  v.emplace_back("cuda", cuda);
  v.emplace_back("nccl", nccl);
  v.emplace_back("driver", driver);
  v.emplace_back("gpu", gpu);
  v.emplace_back("device", device);
  return v;
}

}  // namespace

std::map<std::string, std::string> TrialVersions(bool on_cuda, int device_index) {
  std::map<std::string, std::string> out;
  for (auto& [key, value] : VersionsOn(on_cuda ? device_index : -1)) out[key] = value;
  const char* alloc_conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  out["allocator_conf"] = alloc_conf != nullptr && *alloc_conf != '\0' ? alloc_conf : "none";
  return out;
}

std::vector<std::pair<std::string, std::string>> EngineVersions() {
  int first_gpu = -1;
#ifdef REMAT_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) first_gpu = 0;
#endif
  return VersionsOn(first_gpu);
}

}  // namespace remat::engine
