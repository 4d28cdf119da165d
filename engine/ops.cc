#include "engine/ops.h"

#include <ATen/core/ivalue.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>

namespace remat::engine {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

DataType ToDataType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DataType::kFloat32;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kDouble: return DataType::kFloat64;
    case at::kLong: return DataType::kInt64;
    default: throw std::invalid_argument("collectives: unsupported dtype");
  }
}

const Runtime* RuntimeOf(AutogradContext* ctx) {
  return reinterpret_cast<const Runtime*>(ctx->saved_data["rt"].toInt());
}

int64_t Address(const Runtime& rt) { return reinterpret_cast<int64_t>(&rt); }

// Concatenation of every TP rank's `x` along dim 0.
at::Tensor AllGatherDim0(const Runtime& rt, const at::Tensor& x) {
  if (rt.tp_size() == 1) return x;
  at::Tensor in = x.contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] *= rt.tp_size();
  at::Tensor out = at::empty(shape, in.options());
  rt.comm->AllGather(rt.tp, in.data_ptr(), out.data_ptr(), in.numel(),
                     ToDataType(in.scalar_type()));
  return out;
}

// Sum over TP ranks, each keeping its slice of dim 0.
at::Tensor ReduceScatterDim0(const Runtime& rt, const at::Tensor& x) {
  if (rt.tp_size() == 1) return x;
  at::Tensor in = x.contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  if (shape[0] % rt.tp_size() != 0) {
    throw std::invalid_argument("sequence parallel: dim 0 is not divisible by the TP size");
  }
  shape[0] /= rt.tp_size();
  at::Tensor out = at::empty(shape, in.options());
  rt.comm->ReduceScatter(rt.tp, in.data_ptr(), out.data_ptr(), out.numel(),
                         ToDataType(in.scalar_type()));
  return out;
}

at::Tensor Flatten2d(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// ------------------------------------------------------------------------------------------------
// Recompute

class RngFork {
 public:
  RngFork(const Runtime& rt, const RngState& replay) : rt_(rt), saved_(CaptureRng(rt)) {
    RestoreRng(rt, replay);
  }
  ~RngFork() { RestoreRng(rt_, saved_); }

 private:
  const Runtime& rt_;
  RngState saved_;
};

variable_list Detach(const variable_list& inputs) {
  variable_list out;
  out.reserve(inputs.size());
  for (const at::Tensor& t : inputs) {
    at::Tensor d = t.detach();
    d.requires_grad_(t.requires_grad());
    out.push_back(std::move(d));
  }
  return out;
}

// Backpropagates `grads` through the replayed `outputs`; returns the inputs' gradients, led by
// an undefined gradient for the state argument.
variable_list BackwardThroughReplay(const variable_list& outputs, const variable_list& grads,
                                    const variable_list& detached_inputs) {
  variable_list outs, gs;
  for (size_t i = 0; i < outputs.size() && i < grads.size(); ++i) {
    if (outputs[i].requires_grad() && grads[i].defined()) {
      outs.push_back(outputs[i]);
      gs.push_back(grads[i]);
    }
  }
  if (!outs.empty()) torch::autograd::backward(outs, gs);
  variable_list result;
  result.reserve(detached_inputs.size() + 1);
  result.emplace_back();
  for (const at::Tensor& d : detached_inputs) {
    result.push_back(d.requires_grad() ? d.grad() : at::Tensor());
  }
  return result;
}

struct CheckpointState : torch::CustomClassHolder {
  Region fn;
  const Runtime* rt = nullptr;
  RngState rng;
};

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<CheckpointState> state,
                               at::TensorList inputs) {
    state->rng = CaptureRng(*state->rt);
    variable_list in(inputs.begin(), inputs.end());
    variable_list out = state->fn(in);  // grad mode is off here: nothing inside is saved
    ctx->save_for_backward(in);
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state =
        c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    variable_list detached = Detach(ctx->get_saved_variables());
    variable_list outputs;
    {
      RngFork fork(*state->rt, state->rng);
      at::AutoGradMode grad_on(true);
      outputs = state->fn(detached);
    }
    return BackwardThroughReplay(outputs, grads, detached);
  }
};

}  // namespace

// ---- Output-discarding checkpoint.

struct OutputDiscardingCheckpoint::State : torch::CustomClassHolder {
  Region fn;
  const Runtime* rt = nullptr;
  RngState rng;
  variable_list inputs;                 // what the replay starts from (kept like saved tensors)
  std::vector<c10::Storage> storages;   // the discarded outputs' storages (no tensors: no cycles)
  variable_list replay_inputs;          // detached leaves of the replay
  variable_list replay_outputs;         // the replay's outputs, with their graph
  bool replayed = false;

  void Replay() {
    if (replayed) return;
    replay_inputs = Detach(inputs);
    {
      RngFork fork(*rt, rng);
      at::AutoGradMode grad_on(true);
      replay_outputs = fn(replay_inputs);
    }
    // Share the fresh results into the discarded storages (zero-copy): the consumers' saved
    // tensors point at those storages and now read the replayed values.
    for (size_t i = 0; i < storages.size() && i < replay_outputs.size(); ++i) {
      const c10::Storage& fresh = replay_outputs[i].storage();
      auto* holder = new c10::Storage(fresh);
      c10::StorageImpl* target = storages[i].unsafeGetStorageImpl();
      target->set_data_ptr_noswap(c10::DataPtr(
          fresh.data_ptr().get(), holder,
          [](void* ctx) { delete static_cast<c10::Storage*>(ctx); }, fresh.device()));
      target->set_nbytes(fresh.nbytes());
    }
    storages.clear();
    inputs.clear();
    replayed = true;
  }
};

namespace {

using DiscardState = OutputDiscardingCheckpoint::State;

struct DiscardFunction : public torch::autograd::Function<DiscardFunction> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<DiscardState> state,
                               at::TensorList inputs) {
    state->rng = CaptureRng(*state->rt);
    state->inputs.assign(inputs.begin(), inputs.end());
    variable_list out = state->fn(state->inputs);
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state =
        c10::static_intrusive_pointer_cast<DiscardState>(ctx->saved_data["state"].toCapsule());
    state->Replay();  // normally done already by the hook
    variable_list result = BackwardThroughReplay(state->replay_outputs, grads,
                                                 state->replay_inputs);
    state->replay_outputs.clear();
    state->replay_inputs.clear();
    return result;
  }
};

}  // namespace

OutputDiscardingCheckpoint::OutputDiscardingCheckpoint() : state_(c10::make_intrusive<State>()) {}
OutputDiscardingCheckpoint::~OutputDiscardingCheckpoint() = default;

std::vector<at::Tensor> OutputDiscardingCheckpoint::Run(const Runtime& rt, Region fn,
                                                        const std::vector<at::Tensor>& inputs) {
  state_->fn = std::move(fn);
  state_->rt = &rt;
  variable_list out = DiscardFunction::apply(state_, at::TensorList(inputs));
  state_->storages.clear();
  for (const at::Tensor& t : out) state_->storages.push_back(t.storage());
  return out;
}

void OutputDiscardingCheckpoint::DiscardOutputs(const at::Tensor& hook_tensor) {
  for (c10::Storage& s : state_->storages) {
    c10::StorageImpl* impl = s.unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(c10::DataPtr(nullptr, s.device()));
    impl->set_nbytes(0);
  }
  if (hook_tensor.requires_grad()) {
    c10::intrusive_ptr<State> state = state_;
    hook_tensor.register_hook([state](const at::Tensor&) { state->Replay(); });
  } else {
    // Forward-only (inside an outer checkpoint's first run): nothing will be replayed.
    state_->storages.clear();
    state_->inputs.clear();
  }
}

// ---- RNG.

RngState CaptureRng(const Runtime& rt) {
  RngState s;
  {
    at::Generator gen = at::globalContext().defaultGenerator(at::kCPU);
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.cpu = gen.clone();
  }
  if (rt.device.is_cuda()) {
    at::Generator gen = at::globalContext().defaultGenerator(rt.device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.cuda = gen.clone();
  }
  return s;
}

void RestoreRng(const Runtime& rt, const RngState& s) {
  if (s.cpu.defined()) {
    at::Generator gen = at::globalContext().defaultGenerator(at::kCPU);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(s.cpu.get_state());
  }
  if (s.cuda.defined() && rt.device.is_cuda()) {
    at::Generator gen = at::globalContext().defaultGenerator(rt.device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(s.cuda.get_state());
  }
}

std::vector<at::Tensor> Checkpoint(const Runtime& rt, Region fn,
                                   const std::vector<at::Tensor>& inputs) {
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = std::move(fn);
  state->rt = &rt;
  return CheckpointFunction::apply(state, at::TensorList(inputs));
}

// ------------------------------------------------------------------------------------------------
// Layers

at::Tensor Dropout(const at::Tensor& x, double p) {
  if (p <= 0.0) return x;
  return std::get<0>(at::native_dropout(x, p, true));
}

VocabParallelSoftmax SoftmaxInPlace(const Runtime& rt, at::Tensor& x, const at::Tensor& target,
                                    int64_t vocab_start, SoftmaxExp exp) {
  const int64_t vocab_local = x.size(-1);
  at::Tensor max = std::get<0>(x.max(-1));
  AllReduceTensor(rt, rt.tp, max, ReduceOp::kMax);
  x.sub_(max.unsqueeze(-1));
  at::Tensor outside = target.lt(vocab_start).logical_or_(target.ge(vocab_start + vocab_local));
  at::Tensor local = (target - vocab_start).masked_fill_(outside, 0);
  at::Tensor predicted = x.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill_(outside, 0.0);
  AllReduceTensor(rt, rt.tp, predicted, ReduceOp::kSum);
  if (exp == SoftmaxExp::kThroughBuffer) {
    x.copy_(at::exp(x));  // the compiled helper's buffer, freed once copied back
  } else {
    x.exp_();
  }
  at::Tensor sum_exp = x.sum(-1);
  AllReduceTensor(rt, rt.tp, sum_exp, ReduceOp::kSum);
  at::Tensor loss = at::log(sum_exp).sub_(predicted);
  x.div_(sum_exp.unsqueeze(-1));
  return {loss, local, outside};
}

namespace {

struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, int64_t mode, int64_t rt_addr) {
    const auto* rt = reinterpret_cast<const Runtime*>(rt_addr);
    const auto m = static_cast<LinearMode>(mode);
    ctx->saved_data["rt"] = rt_addr;
    ctx->saved_data["mode"] = mode;
    ctx->saved_data["bias"] = bias.has_value();
    ctx->save_for_backward({x, weight});  // the sharded input under sequence parallel
    at::Tensor total = x;
    if (m == LinearMode::kColumn && rt->sequence_parallel) total = AllGatherDim0(*rt, x);
    at::Tensor out = bias.has_value() ? at::linear(total, weight, *bias) : at::linear(total, weight);
    if (m == LinearMode::kRow && rt->tp_size() > 1) {
      if (rt->sequence_parallel) return ReduceScatterDim0(*rt, out);
      AllReduceTensor(*rt, rt->tp, out, ReduceOp::kSum);
    }
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Runtime* rt = RuntimeOf(ctx);
    const auto m = static_cast<LinearMode>(ctx->saved_data["mode"].toInt());
    const bool has_bias = ctx->saved_data["bias"].toBool();
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    at::Tensor grad = grads[0];
    at::Tensor total = x;
    if (m == LinearMode::kColumn && rt->sequence_parallel) total = AllGatherDim0(*rt, x);
    if (m == LinearMode::kRow && rt->sequence_parallel) grad = AllGatherDim0(*rt, grad);
    at::Tensor grad_input = grad.matmul(weight);
    if (m == LinearMode::kColumn && rt->tp_size() > 1) {
      if (rt->sequence_parallel) {
        grad_input = ReduceScatterDim0(*rt, grad_input);
      } else {
        AllReduceTensor(*rt, rt->tp, grad_input, ReduceOp::kSum);
      }
    }
    at::Tensor grad2d = Flatten2d(grad);
    at::Tensor grad_weight = grad2d.t().mm(Flatten2d(total));
    at::Tensor grad_bias = has_bias ? grad2d.sum(0) : at::Tensor();
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor()};
  }
};

struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps) {
    at::Tensor xf = x.to(at::kFloat);
    at::Tensor rstd = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true).add_(eps));
    at::Tensor y = (xf * rstd).mul_(weight.to(at::kFloat)).to(x.scalar_type());
    ctx->save_for_backward({x, weight, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& rstd = saved[2];
    // Out of place on x and the incoming gradient: both may be shared with other nodes.
    at::Tensor xhat = x.to(at::kFloat) * rstd;
    at::Tensor dy = grads[0].to(at::kFloat);
    at::Tensor grad_weight = Flatten2d(dy * xhat).sum(0).to(weight.scalar_type());
    at::Tensor dxhat = dy * weight.to(at::kFloat);
    at::Tensor dot = (dxhat * xhat).mean(-1, /*keepdim=*/true);
    at::Tensor grad_x = dxhat.sub_(xhat.mul_(dot)).mul_(rstd).to(x.scalar_type());
    return {grad_x, grad_weight, at::Tensor()};
  }
};

struct VocabEmbeddingFunction : public torch::autograd::Function<VocabEmbeddingFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& ids, const at::Tensor& weight,
                            int64_t vocab_start, int64_t rt_addr) {
    const auto* rt = reinterpret_cast<const Runtime*>(rt_addr);
    ctx->saved_data["rt"] = rt_addr;
    ctx->saved_data["vocab"] = weight.size(0);
    if (rt->tp_size() == 1) {
      ctx->save_for_backward({ids});
      return at::embedding(weight, ids);
    }
    const int64_t vocab_end = vocab_start + weight.size(0);
    at::Tensor outside = ids.lt(vocab_start).logical_or_(ids.ge(vocab_end));
    at::Tensor local = (ids - vocab_start).masked_fill_(outside, 0);
    at::Tensor out = at::embedding(weight, local);
    out.masked_fill_(outside.unsqueeze(-1), 0.0);
    AllReduceTensor(*rt, rt->tp, out, ReduceOp::kSum);
    ctx->save_for_backward({local, outside});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Runtime* rt = RuntimeOf(ctx);
    variable_list saved = ctx->get_saved_variables();
    at::Tensor grad = grads[0];
    if (rt->tp_size() > 1) grad = grad.masked_fill(saved[1].unsqueeze(-1), 0.0);
    at::Tensor grad_weight = at::embedding_dense_backward(
        grad, saved[0], ctx->saved_data["vocab"].toInt(), /*padding_idx=*/-1,
        /*scale_grad_by_freq=*/false);
    return {at::Tensor(), grad_weight, at::Tensor(), at::Tensor()};
  }
};

struct CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target, int64_t vocab_start, int64_t exp,
                            int64_t rt_addr) {
    const auto* rt = reinterpret_cast<const Runtime*>(rt_addr);
    ctx->saved_data["rt"] = rt_addr;
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    // Megatron: logits.float() (the same tensor in fp32 runs, then changed in place).
    at::Tensor x = logits.to(at::kFloat);
    VocabParallelSoftmax s = SoftmaxInPlace(*rt, x, target, vocab_start,
                                            static_cast<SoftmaxExp>(exp));  // kept for backward
    ctx->save_for_backward({x, s.local, s.outside});
    return s.loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    at::Tensor softmax = saved[0];  // changed in place, as Megatron does
    const at::Tensor& local = saved[1];
    const at::Tensor& outside = saved[2];
    at::Tensor inside = outside.logical_not().to(softmax.scalar_type()).unsqueeze(-1);
    softmax.scatter_add_(-1, local.unsqueeze(-1), inside.neg());
    softmax.mul_(grads[0].unsqueeze(-1));
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {softmax.to(dtype), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct ScatterToSequenceFunction : public torch::autograd::Function<ScatterToSequenceFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t rt_addr) {
    const auto* rt = reinterpret_cast<const Runtime*>(rt_addr);
    ctx->saved_data["rt"] = rt_addr;
    const int64_t chunk = x.size(0) / rt->tp_size();
    // A copy, not a view: a view would keep the whole sequence alive.
    return x.narrow(0, chunk * rt->tp_rank(), chunk).clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {AllGatherDim0(*RuntimeOf(ctx), grads[0]), at::Tensor()};
  }
};

// Megatron's gather_from_sequence_parallel_region: all-gather along dim 0, reduce-scatter of
// the gradient. Nothing is saved.
struct GatherFromSequenceFunction : public torch::autograd::Function<GatherFromSequenceFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t rt_addr) {
    ctx->saved_data["rt"] = rt_addr;
    return AllGatherDim0(*reinterpret_cast<const Runtime*>(rt_addr), x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {ReduceScatterDim0(*RuntimeOf(ctx), grads[0]), at::Tensor()};
  }
};

// Megatron's gather_from_tensor_model_parallel_region: all-gather along the last dimension, the
// gradient's own slice in backward. Nothing is saved.
struct GatherLastDimFunction : public torch::autograd::Function<GatherLastDimFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t rt_addr) {
    const auto* rt = reinterpret_cast<const Runtime*>(rt_addr);
    ctx->saved_data["rt"] = rt_addr;
    const int64_t tp = rt->tp_size();
    std::vector<int64_t> shape = x.sizes().vec();
    at::Tensor stacked = AllGatherDim0(*rt, x.unsqueeze(0));  // [tp, ..., d]
    std::vector<int64_t> order;
    for (int64_t d = 1; d < stacked.dim() - 1; ++d) order.push_back(d);
    order.push_back(0);
    order.push_back(stacked.dim() - 1);
    shape.back() *= tp;
    return stacked.permute(order).reshape(shape);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Runtime* rt = RuntimeOf(ctx);
    const int64_t chunk = grads[0].size(-1) / rt->tp_size();
    return {grads[0].narrow(-1, chunk * rt->tp_rank(), chunk).contiguous(), at::Tensor()};
  }
};

struct CopyToTensorParallelFunction
    : public torch::autograd::Function<CopyToTensorParallelFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t rt_addr) {
    ctx->saved_data["rt"] = rt_addr;
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Runtime* rt = RuntimeOf(ctx);
    at::Tensor g = grads[0].contiguous().clone();
    AllReduceTensor(*rt, rt->tp, g, ReduceOp::kSum);
    return {g, at::Tensor()};
  }
};

struct GroupedGemmFunction : public torch::autograd::Function<GroupedGemmFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::vector<int64_t>& counts) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["counts"] = counts;
    at::Tensor out = at::empty({x.size(0), weight.size(2)}, x.options());
    int64_t offset = 0;
    for (size_t e = 0; e < counts.size(); ++e) {
      if (counts[e] == 0) continue;
      at::Tensor slice = out.narrow(0, offset, counts[e]);
      at::mm_out(slice, x.narrow(0, offset, counts[e]), weight[e]);
      offset += counts[e];
    }
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    at::Tensor grad = grads[0].contiguous();
    at::Tensor grad_x = at::empty_like(x);
    at::Tensor grad_w = at::zeros_like(weight);
    int64_t offset = 0;
    for (size_t e = 0; e < counts.size(); ++e) {
      if (counts[e] == 0) continue;
      at::Tensor g = grad.narrow(0, offset, counts[e]);
      at::Tensor gx = grad_x.narrow(0, offset, counts[e]);
      at::mm_out(gx, g, weight[e].t());
      at::Tensor gw = grad_w[e];
      at::mm_out(gw, x.narrow(0, offset, counts[e]).t(), g);
      offset += counts[e];
    }
    return {grad_x, grad_w, at::Tensor()};
  }
};

// Megatron's _AllToAll (variable splits): the backward sends the gradient back the way the
// tokens came.
at::Tensor ExchangeRows(const Runtime& rt, const at::Tensor& x, const std::vector<int64_t>& send,
                        const std::vector<int64_t>& recv) {
  at::Tensor in = x.contiguous();
  int64_t rows = 0;
  for (int64_t r : recv) rows += r;
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] = rows;
  at::Tensor out = at::empty(shape, in.options());
  int64_t row_elems = 1;
  for (size_t d = 1; d < shape.size(); ++d) row_elems *= shape[d];
  std::vector<size_t> send_counts, recv_counts;
  for (int64_t r : send) send_counts.push_back(static_cast<size_t>(r * row_elems));
  for (int64_t r : recv) recv_counts.push_back(static_cast<size_t>(r * row_elems));
  rt.comm->AllToAll(rt.ep, in.data_ptr(), send_counts, out.data_ptr(), recv_counts,
                    ToDataType(in.scalar_type()));
  return out;
}

struct AllToAllFunction : public torch::autograd::Function<AllToAllFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                            int64_t rt_addr) {
    ctx->saved_data["rt"] = rt_addr;
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return ExchangeRows(*reinterpret_cast<const Runtime*>(rt_addr), x, send, recv);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    return {ExchangeRows(*RuntimeOf(ctx), grads[0], recv, send), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor AllToAllRows(const Runtime& rt, const at::Tensor& x, const std::vector<int64_t>& send_rows,
                        const std::vector<int64_t>& recv_rows) {
  if (static_cast<int>(send_rows.size()) != rt.ep_size() ||
      static_cast<int>(recv_rows.size()) != rt.ep_size()) {
    throw std::invalid_argument("all-to-all: one row count per expert-parallel rank expected");
  }
  return AllToAllFunction::apply(x, send_rows, recv_rows, Address(rt));
}

at::Tensor Linear(const Runtime& rt, const at::Tensor& x, const at::Tensor& weight,
                  const at::Tensor& bias, LinearMode mode) {
  c10::optional<at::Tensor> b;
  if (bias.defined()) b = bias;
  return LinearFunction::apply(x, weight, b, static_cast<int64_t>(mode), Address(rt));
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return RmsNormFunction::apply(x, weight, eps);
}

at::Tensor LayerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                     double eps) {
  return at::layer_norm(x, {x.size(-1)}, weight, bias, eps);
}

at::Tensor VocabParallelEmbedding(const Runtime& rt, const at::Tensor& ids,
                                  const at::Tensor& weight, int64_t vocab_start) {
  return VocabEmbeddingFunction::apply(ids, weight, vocab_start, Address(rt));
}

at::Tensor VocabParallelCrossEntropy(const Runtime& rt, const at::Tensor& logits,
                                     const at::Tensor& target, int64_t vocab_start,
                                     SoftmaxExp exp) {
  return CrossEntropyFunction::apply(logits, target, vocab_start, static_cast<int64_t>(exp),
                                     Address(rt));
}

at::Tensor ScatterToSequenceParallel(const Runtime& rt, const at::Tensor& x) {
  if (rt.tp_size() == 1) return x;
  return ScatterToSequenceFunction::apply(x, Address(rt));
}

at::Tensor GatherFromSequenceParallel(const Runtime& rt, const at::Tensor& x) {
  if (rt.tp_size() == 1) return x;
  return GatherFromSequenceFunction::apply(x, Address(rt));
}

at::Tensor GatherFromTensorParallel(const Runtime& rt, const at::Tensor& x) {
  if (rt.tp_size() == 1) return x;
  return GatherLastDimFunction::apply(x, Address(rt));
}

at::Tensor CopyToTensorParallel(const Runtime& rt, const at::Tensor& x) {
  if (rt.tp_size() == 1) return x;
  return CopyToTensorParallelFunction::apply(x, Address(rt));
}

at::Tensor GroupedGemm(const at::Tensor& x, const at::Tensor& weight,
                       const std::vector<int64_t>& tokens_per_expert) {
  return GroupedGemmFunction::apply(x, weight, tokens_per_expert);
}

DataType CollectiveType(at::ScalarType t) { return ToDataType(t); }

void AllReduceTensor(const Runtime& rt, const Group& group, at::Tensor& t, ReduceOp op) {
  if (group.size() == 1) return;
  if (!t.is_contiguous()) throw std::invalid_argument("all-reduce of a non-contiguous tensor");
  rt.comm->AllReduce(group, t.data_ptr(), static_cast<size_t>(t.numel()),
                     ToDataType(t.scalar_type()), op);
}

}  // namespace remat::engine
