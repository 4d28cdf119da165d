#include "engine/fp8_linear.h"

#include <torch/csrc/autograd/custom_function.h>

#ifdef REMAT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <cmath>
#include <stdexcept>
#include <vector>

namespace remat::engine {
#ifdef REMAT_ENGINE_FP8
namespace {

#ifdef REMAT_WITH_CUDA
// "" when `device` can run FP8 GEMMs, else why not.
std::string DeviceFp8Problem(const at::Device& device) {
  int major = 0, minor = 0;
  const int index = device.index() < 0 ? 0 : device.index();
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index) != cudaSuccess) {
    return "its compute capability could not be read";
  }
  if (major * 10 + minor < 89) {
    return "this GPU has compute capability " + std::to_string(major) + "." + std::to_string(minor);
  }
  return "";
}
#else
std::string DeviceFp8Problem(const at::Device&) { return "this build has no CUDA"; }
#endif

}  // namespace
#endif

std::string Fp8Unsupported(const search::SearchSpec& spec, const at::Device& device) {
  if (spec.model.fp8.empty()) return "";
  const std::string head =
      "model.fp8: the builtin engine runs FP8 linears only on a CUDA GPU of "
      "compute capability 8.9 or later with LibTorch >= 2.5; ";
#ifndef REMAT_ENGINE_FP8
  (void)device;
  return head + "this remat-trial was built against LibTorch " TORCH_VERSION
                " (no FP8 GEMM); plan and validate it, or run it with the megatron or command "
                "backend";
#else
  if (!device.is_cuda()) {
    return head + "this trial runs on CPU ranks; plan and validate it, or run it on a GPU";
  }
  if (std::string why = DeviceFp8Problem(device); !why.empty()) return head + why;
  return "";
#endif
}

#ifdef REMAT_ENGINE_FP8

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Megatron's TransformerConfig defaults at d98e8a6 (the spec has no fields for them).
constexpr int64_t kAmaxHistoryLen = 1;  // fp8_amax_history_len
constexpr bool kAmaxMostRecent = true;  // fp8_amax_compute_algo "most_recent"
constexpr double kMargin = 0;           // fp8_margin

double Fp8Max(at::ScalarType t) { return t == at::kFloat8_e5m2 ? 57344.0 : 448.0; }

// One tensor's scaling state under delayed scaling: the amax history and the scale it gave.
struct Delayed {
  at::Tensor history;  // [kAmaxHistoryLen] fp32, newest first
  at::Tensor scale;    // [] fp32
};

// Largest magnitude of `x` as an fp32 scalar, without an |x|-sized temporary.
at::Tensor Amax(const at::Tensor& x) {
  auto mm = at::aminmax(x);
  return at::maximum(std::get<0>(mm).neg(), std::get<1>(mm)).to(at::kFloat);
}

// fp8_max / amax / 2^margin, or `fallback` where amax is 0 or not finite (TE keeps the scale).
at::Tensor ScaleOf(const at::Tensor& amax, double fp8_max, const at::Tensor& fallback) {
  at::Tensor s = at::div(at::scalar_tensor(fp8_max / std::pow(2.0, kMargin), amax.options()), amax);
  return at::where(amax.gt(0).logical_and(at::isfinite(amax)), s, fallback);
}

struct Quantized {
  at::Tensor data;       // FP8, same shape as the input
  at::Tensor scale_inv;  // [] fp32: data * scale_inv ~ input
};

// Quantizes `x` to `type`: with `delayed` by the scale its history gave before this use (and the
// history then takes this tensor's amax), else by this tensor's own amax (current scaling).
Quantized Quantize(const at::Tensor& x, at::ScalarType type, Delayed* delayed) {
  const double fp8_max = Fp8Max(type);
  at::Tensor amax = Amax(x);
  at::Tensor scale;
  if (delayed != nullptr) {
    if (!delayed->scale.defined()) {
      delayed->scale = at::scalar_tensor(1.0, amax.options());
      delayed->history = at::zeros({kAmaxHistoryLen}, amax.options());
    }
    scale = delayed->scale.clone();
    delayed->history =
        at::cat({amax.reshape({1}), delayed->history.narrow(0, 0, kAmaxHistoryLen - 1)});
    at::Tensor chosen = kAmaxMostRecent ? delayed->history[0] : delayed->history.max();
    delayed->scale = ScaleOf(chosen, fp8_max, delayed->scale);
  } else {
    scale = ScaleOf(amax, fp8_max, at::scalar_tensor(1.0, amax.options()));
  }
  // In x's dtype: the one transient copy is x-sized in bf16, as TE's cast kernel reads x once.
  at::Tensor scaled = x.mul(scale.to(x.scalar_type())).clamp_(-fp8_max, fp8_max);
  return {scaled.to(type), scale.reciprocal()};
}

}  // namespace

// The weight workspace of one TE linear (TE module/base.py quantize_weight at d0067d0).
struct WeightWorkspace {
  int64_t step = -1;      // the step whose first micro-batch made it
  at::Tensor rowwise;     // W [out, in], e4m3
  at::Tensor columnwise;  // W^T [in, out], e4m3 (Hopper's FP8 GEMM reads TN operands only)
  at::Tensor scale_inv;
  Delayed delayed;
};

struct LinearScaling {
  Delayed input, grad;
};

struct Fp8Linears::State {
  bool delayed = true;
  int64_t step = 0;
  at::ScalarType grad_type = at::kFloat8_e5m2;
  std::map<int, WeightWorkspace> weights;
  std::map<int, LinearScaling> linears;

  const WeightWorkspace& Weight(int key, const at::Tensor& w) {
    WeightWorkspace& ws = weights[key];
    if (ws.step == step) return ws;
    at::NoGradGuard no_grad;
    Quantized q = Quantize(w.detach(), at::kFloat8_e4m3fn, delayed ? &ws.delayed : nullptr);
    ws.rowwise = q.data.contiguous();
    ws.columnwise = q.data.t().contiguous();
    ws.scale_inv = q.scale_inv;
    ws.step = step;
    return ws;
  }
};

namespace {

Fp8Linears::State* StateOf(AutogradContext* ctx) {
  return reinterpret_cast<Fp8Linears::State*>(ctx->saved_data["state"].toInt());
}

struct Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, int64_t key, int64_t mode,
                            int64_t rt_addr, int64_t state_addr, bool save_original) {
    auto* state = reinterpret_cast<Fp8Linears::State*>(state_addr);
    const auto* rt = reinterpret_cast<const Runtime*>(rt_addr);
    const int64_t in = x.size(-1), out_features = weight.size(0);
    const WeightWorkspace& ws = state->Weight(static_cast<int>(key), weight);
    LinearScaling& sc = state->linears[static_cast<int>(key)];
    Quantized xq =
        Quantize(x.reshape({-1, in}), at::kFloat8_e4m3fn, state->delayed ? &sc.input : nullptr);
    // TE's forward GEMM accumulates without split accumulation (fast accumulation).
    at::Tensor out = at::_scaled_mm(xq.data, ws.rowwise.t(), xq.scale_inv, ws.scale_inv, bias,
                                    c10::nullopt, x.scalar_type(), /*use_fast_accum=*/true);
    // Only the columnwise copy outlives the forward (TE linear.py update_usage(rowwise=False)),
    // or with save_original the bf16 input itself, quantized again in backward.
    if (save_original) {
      ctx->save_for_backward({x});
    } else {
      ctx->save_for_backward({xq.data.t().contiguous(), xq.scale_inv});
    }
    ctx->saved_data["key"] = key;
    ctx->saved_data["mode"] = mode;
    ctx->saved_data["rt"] = rt_addr;
    ctx->saved_data["state"] = state_addr;
    ctx->saved_data["bias"] = bias.has_value();
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = out_features;
    out = out.view(shape);
    if (static_cast<LinearMode>(mode) == LinearMode::kRow && rt->tp_size() > 1) {
      AllReduceTensor(*rt, rt->tp, out, ReduceOp::kSum);
    }
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Fp8Linears::State* state = StateOf(ctx);
    const auto* rt = reinterpret_cast<const Runtime*>(ctx->saved_data["rt"].toInt());
    const int key = static_cast<int>(ctx->saved_data["key"].toInt());
    const auto mode = static_cast<LinearMode>(ctx->saved_data["mode"].toInt());
    variable_list saved = ctx->get_saved_variables();
    at::Tensor xt, x_scale_inv;  // the input's FP8 transpose [in, tokens] and its scale
    if (saved.size() == 1) {     // save_original: current scaling only (never delayed)
      Quantized xq =
          Quantize(saved[0].reshape({-1, saved[0].size(-1)}), at::kFloat8_e4m3fn, nullptr);
      xt = xq.data.t().contiguous();
      x_scale_inv = xq.scale_inv;
    } else {
      xt = saved[0];
      x_scale_inv = saved[1];
    }
    const WeightWorkspace& ws = state->weights.at(key);
    LinearScaling& sc = state->linears[key];
    const at::Tensor& grad = grads[0];
    const int64_t out_features = grad.size(-1), in = xt.size(0);
    at::Tensor g = grad.reshape({-1, out_features}).contiguous();
    Quantized gq = Quantize(g, state->grad_type, state->delayed ? &sc.grad : nullptr);
    // dgrad = g W, wgrad = g^T x (TE: split accumulation in both backward GEMMs).
    at::Tensor grad_input = at::_scaled_mm(gq.data, ws.columnwise.t(), gq.scale_inv, ws.scale_inv,
                                           c10::nullopt, c10::nullopt, grad.scalar_type(), false);
    at::Tensor grad_weight =
        at::_scaled_mm(gq.data.t().contiguous(), xt.t(), gq.scale_inv, x_scale_inv, c10::nullopt,
                       c10::nullopt, grad.scalar_type(), false);
    std::vector<int64_t> shape = grad.sizes().vec();
    shape.back() = in;
    grad_input = grad_input.view(shape);
    if (mode == LinearMode::kColumn && rt->tp_size() > 1) {
      AllReduceTensor(*rt, rt->tp, grad_input, ReduceOp::kSum);
    }
    at::Tensor grad_bias = ctx->saved_data["bias"].toBool() ? g.sum(0) : at::Tensor();
    return {grad_input,   grad_weight,  grad_bias,    at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

Fp8Linears::Fp8Linears(const search::ModelSpec& m) : state_(std::make_unique<State>()) {
  state_->delayed = m.fp8_recipe == "delayed";
  state_->grad_type = m.fp8 == "hybrid" ? at::kFloat8_e5m2 : at::kFloat8_e4m3fn;
}

at::Tensor Fp8Linears::Apply(const Runtime& rt, int key, const at::Tensor& x,
                             const at::Tensor& weight, const at::Tensor& bias, LinearMode mode,
                             bool save_original) {
  if (rt.sequence_parallel && rt.tp_size() > 1) {
    throw std::invalid_argument("FP8 linears with sequence parallelism are not implemented");
  }
  c10::optional<at::Tensor> b;
  if (bias.defined()) b = bias;
  return Fp8LinearFunction::apply(x, weight, b, static_cast<int64_t>(key),
                                  static_cast<int64_t>(mode), reinterpret_cast<int64_t>(&rt),
                                  reinterpret_cast<int64_t>(state_.get()),
                                  save_original && !state_->delayed);
}

void Fp8Linears::NewStep() { ++state_->step; }

uint64_t Fp8Linears::WorkspaceBytes() const {
  uint64_t bytes = 0;
  for (const auto& [key, ws] : state_->weights) {
    if (ws.rowwise.defined()) bytes += ws.rowwise.nbytes() + ws.columnwise.nbytes();
  }
  return bytes;
}

#else  // no FP8 in this LibTorch: Fp8Unsupported refuses every FP8 trial before a model exists

struct Fp8Linears::State {};

Fp8Linears::Fp8Linears(const search::ModelSpec&) : state_(std::make_unique<State>()) {}

at::Tensor Fp8Linears::Apply(const Runtime&, int, const at::Tensor&, const at::Tensor&,
                             const at::Tensor&, LinearMode, bool) {
  throw std::runtime_error("model.fp8: this LibTorch (" TORCH_VERSION ") has no FP8 GEMM");
}

void Fp8Linears::NewStep() {}

uint64_t Fp8Linears::WorkspaceBytes() const { return 0; }

#endif

Fp8Linears::~Fp8Linears() = default;

}  // namespace remat::engine
