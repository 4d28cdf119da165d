#include "engine/optimizer.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>

#include "engine/collectives.h"
#include "engine/moe_dispatch.h"

namespace remat::engine {
namespace {

// Megatron's GradBuffer hook: after AccumulateGrad has stored a parameter's gradient, add it to
// the fp32 main gradient and drop it, so each bf16 gradient lives only briefly.
class MainGradHook final : public torch::autograd::FunctionPostHook {
 public:
  MainGradHook(at::Tensor param, at::Tensor main_grad)
      : param_(std::move(param)), main_grad_(std::move(main_grad)) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
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

}  // namespace

class Optimizer::Impl {
 public:
  Impl(const Runtime& rt, std::vector<ParamInfo>& params, const OptimizerDTypes& types,
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
      if (distributed)
        numel_ = b.begin + RoundUp(numel_ - b.begin, std::lcm<int64_t>(members_n, 128));
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

  ~Impl() {
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
        rt_.comm->ReduceScatter(
            *b.group, base + b.begin * elem, base + b.shard_begin * elem,
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
    // bf16 gradients are read as they are and summed in fp32 inside the kernel (as a fused
    // multi-tensor norm reads them): no fp32 copy. One call for the whole range: a loop over
    // chunks cost about a thousand small kernels per step on a 0.3B model (the step time of a
    // bf16-gradient trial on an H200 doubled, bench/fidelity/fused_step_time.sh).
    const int64_t n = flat.numel(), rows = n / kBlock;
    at::Tensor sq = at::zeros({1}, flat.options().dtype(at::kDouble));
    if (rows > 0) {
      sq += at::linalg_vector_norm(flat.narrow(0, 0, rows * kBlock).view({rows, kBlock}), 2, {1},
                                   /*keepdim=*/false, at::kFloat)
                .to(at::kDouble)
                .pow(2)
                .sum();
    }
    if (n > rows * kBlock) {
      sq += at::linalg_vector_norm(flat.narrow(0, rows * kBlock, n - rows * kBlock), 2,
                                   c10::nullopt, /*keepdim=*/false, at::kFloat)
                .to(at::kDouble)
                .pow(2);
    }
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

Optimizer::Optimizer(const Runtime& rt, std::vector<ParamInfo>& params,
                     const OptimizerDTypes& types, uint64_t seed, bool distributed)
    : impl_(std::make_unique<Impl>(rt, params, types, seed, distributed)) {}
Optimizer::~Optimizer() = default;
int64_t Optimizer::numel() const { return impl_->numel(); }
uint64_t Optimizer::StaticBytes() const { return impl_->StaticBytes(); }
void Optimizer::ZeroGrad() { impl_->ZeroGrad(); }
at::Tensor Optimizer::Step() { return impl_->Step(); }

}  // namespace remat::engine
