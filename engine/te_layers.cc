#include "engine/te_layers.h"

#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <mutex>
#include <vector>

namespace remat::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor Defined(const c10::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }

// Sum of `g` over every dim but the last (a bias gradient).
at::Tensor SumToLast(const at::Tensor& g) { return g.reshape({-1, g.size(-1)}).sum(0); }

// ---- SwiGLU --------------------------------------------------------------------------------

struct FusedSwigluFunction : public torch::autograd::Function<FusedSwigluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const c10::optional<at::Tensor>& bias,
                            const c10::optional<at::Tensor>& probs) {
    at::Tensor y = bias.has_value() ? x + *bias : x;
    std::vector<at::Tensor> c = y.chunk(2, -1);
    at::Tensor out = at::silu(c[0]) * c[1];
    if (probs.has_value()) out = (out * *probs).to(x.scalar_type());
    // Only the inputs: the activation is recomputed in backward.
    ctx->save_for_backward({x, Defined(bias), Defined(probs)});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& bias = saved[1];
    const at::Tensor& probs = saved[2];
    at::Tensor y = bias.defined() ? x + bias : x;
    std::vector<at::Tensor> c = y.chunk(2, -1);
    at::Tensor sig = at::sigmoid(c[0]);
    at::Tensor silu = c[0] * sig;
    at::Tensor g = grads[0];
    at::Tensor grad_probs;
    if (probs.defined()) {
      if (probs.requires_grad()) grad_probs = (g * silu * c[1]).sum(-1, /*keepdim=*/true);
      g = g * probs;
    }
    // d silu(a) / da = sig (1 + a (1 - sig))
    at::Tensor da = g * c[1] * sig * (1 + c[0] * (1 - sig));
    at::Tensor grad_y = at::cat({da, g * silu}, -1).to(x.scalar_type());
    at::Tensor grad_bias = bias.defined() ? SumToLast(grad_y).to(bias.scalar_type()) : at::Tensor();
    if (grad_probs.defined()) grad_probs = grad_probs.to(probs.scalar_type());
    return {grad_y, grad_bias, grad_probs};
  }
};

// ---- RoPE ----------------------------------------------------------------------------------

// R(x) = cat(-x2, x1) over the rotary dims and its adjoint R^T(y) = cat(y2, -y1).
at::Tensor RotateHalf(const at::Tensor& x, bool adjoint) {
  std::vector<at::Tensor> h = x.chunk(2, -1);
  return adjoint ? at::cat({h[1], h[0].neg()}, -1) : at::cat({h[1].neg(), h[0]}, -1);
}

struct FusedRopeFunction : public torch::autograd::Function<FusedRopeFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& t, const at::Tensor& freqs) {
    const int64_t rot = freqs.size(-1);
    at::Tensor out = at::empty(t.sizes(), t.options());
    at::Tensor x = t.narrow(-1, 0, rot);
    // The cos/sin tables live only inside the "kernel".
    at::Tensor cos = at::cos(freqs).to(t.scalar_type());
    at::Tensor sin = at::sin(freqs).to(t.scalar_type());
    out.narrow(-1, 0, rot).copy_(x * cos + RotateHalf(x, false) * sin);
    if (t.size(-1) > rot) out.narrow(-1, rot, t.size(-1) - rot).copy_(t.narrow(-1, rot, t.size(-1) - rot));
    ctx->save_for_backward({freqs});  // the shared table of every layer: nothing per call
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor freqs = ctx->get_saved_variables()[0];
    const at::Tensor& g = grads[0];
    const int64_t rot = freqs.size(-1);
    at::Tensor cos = at::cos(freqs).to(g.scalar_type());
    at::Tensor sin = at::sin(freqs).to(g.scalar_type());
    at::Tensor grad = at::empty(g.sizes(), g.options());
    at::Tensor gr = g.narrow(-1, 0, rot);
    grad.narrow(-1, 0, rot).copy_(gr * cos + RotateHalf(gr * sin, true));
    if (g.size(-1) > rot) grad.narrow(-1, rot, g.size(-1) - rot).copy_(g.narrow(-1, rot, g.size(-1) - rot));
    return {grad, at::Tensor()};
  }
};

// ---- Bias-dropout-add ----------------------------------------------------------------------

struct FusedBiasDropoutAddFunction : public torch::autograd::Function<FusedBiasDropoutAddFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const c10::optional<at::Tensor>& bias, const at::Tensor& residual,
                            double p) {
    at::Tensor y = bias.has_value() ? x + *bias : x;
    at::Tensor keep = at::empty(y.sizes(), y.options()).bernoulli_(1.0 - p).to(at::kBool);
    at::Tensor out = residual + y * keep * (1.0 / (1.0 - p));
    ctx->saved_data["p"] = p;
    ctx->saved_data["bias"] = bias.has_value();
    ctx->save_for_backward({keep});  // one byte per element, as the compiled fusion keeps
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor keep = ctx->get_saved_variables()[0];
    const double p = ctx->saved_data["p"].toDouble();
    const at::Tensor& g = grads[0];
    at::Tensor grad_x = g * keep * (1.0 / (1.0 - p));
    at::Tensor grad_bias = ctx->saved_data["bias"].toBool() ? SumToLast(grad_x) : at::Tensor();
    return {grad_x, grad_bias, g, at::Tensor()};
  }
};

// ---- Attention -----------------------------------------------------------------------------

// One sequence's q, k, v as [heads, s, d] fp32, k and v repeated to every query head.
struct Sequence {
  at::Tensor q, k, v;
};

Sequence SequenceOf(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t b) {
  const int64_t rep = q.size(2) / k.size(2);
  Sequence s;
  s.q = q.select(1, b).transpose(0, 1).to(at::kFloat);
  s.k = k.select(1, b).transpose(0, 1).to(at::kFloat);
  s.v = v.select(1, b).transpose(0, 1).to(at::kFloat);
  if (rep > 1) {
    s.k = s.k.repeat_interleave(rep, 0);
    s.v = s.v.repeat_interleave(rep, 0);
  }
  return s;
}

// Causal scaled scores of one sequence [heads, s, s], the masked entries -inf.
at::Tensor Scores(const Sequence& s, double scale) {
  at::Tensor scores = at::bmm(s.q, s.k.transpose(1, 2)).mul_(scale);
  const int64_t n = scores.size(-1);
  at::Tensor mask = at::ones({n, n}, scores.options().dtype(at::kBool)).triu_(1);
  return scores.masked_fill_(mask, -std::numeric_limits<float>::infinity());
}

// The keep-mask of one sequence's probabilities, drawn from `gen` (scaled by 1 / (1 - p)).
at::Tensor DropoutScale(const at::Tensor& probs, double p, at::Generator& gen) {
  return at::empty(probs.sizes(), probs.options()).bernoulli_(1.0 - p, gen).div_(1.0 - p);
}

struct FusedAttentionFunction : public torch::autograd::Function<FusedAttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale, double p) {
    const int64_t s = q.size(0), b = q.size(1), n = q.size(2), dv = v.size(3);
    at::Tensor out = at::empty({s, b, n, dv}, q.options());
    at::Tensor lse = at::empty({b, n, s}, q.options().dtype(at::kFloat));
    // Dropout: the backward replays the mask from the generator's state at this point (a host
    // object, as a kernel's RNG seed and offset), never from a saved mask.
    at::Generator gen = at::globalContext().defaultGenerator(q.device());
    if (p > 0) {
      std::lock_guard<std::mutex> lock(gen.mutex());
      ctx->saved_data["gen"] = gen.clone();
    }
    for (int64_t i = 0; i < b; ++i) {
      Sequence seq = SequenceOf(q, k, v, i);
      at::Tensor scores = Scores(seq, scale);
      at::Tensor l = at::logsumexp(scores, -1, /*keepdim=*/true);
      at::Tensor probs = scores.sub_(l).exp_();
      if (p > 0) probs.mul_(DropoutScale(probs, p, gen));
      out.select(1, i).copy_(at::bmm(probs, seq.v).transpose(0, 1));
      lse.select(0, i).copy_(l.squeeze(-1));
    }
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["p"] = p;
    ctx->save_for_backward({q, k, v, out, lse});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const double scale = ctx->saved_data["scale"].toDouble();
    const double p = ctx->saved_data["p"].toDouble();
    at::Generator gen;
    if (p > 0) gen = ctx->saved_data["gen"].toGenerator().clone();
    const int64_t b = q.size(1), n = q.size(2), g = k.size(2);
    at::Tensor dq = at::empty(q.sizes(), q.options());
    at::Tensor dk = at::empty(k.sizes(), k.options());
    at::Tensor dv = at::empty(v.sizes(), v.options());
    for (int64_t i = 0; i < b; ++i) {
      Sequence seq = SequenceOf(q, k, v, i);
      at::Tensor probs = Scores(seq, scale).sub_(lse.select(0, i).unsqueeze(-1)).exp_();
      at::Tensor drop = p > 0 ? DropoutScale(probs, p, gen) : at::Tensor();
      at::Tensor dout = grads[0].select(1, i).transpose(0, 1).to(at::kFloat);     // [n, s, dv]
      at::Tensor o = out.select(1, i).transpose(0, 1).to(at::kFloat);
      at::Tensor dropped = drop.defined() ? probs * drop : probs;
      at::Tensor dv_heads = at::bmm(dropped.transpose(1, 2), dout);                // [n, s, dv]
      at::Tensor dprobs = at::bmm(dout, seq.v.transpose(1, 2));                    // [n, s, s]
      if (drop.defined()) dprobs.mul_(drop);
      // softmax backward: P (dP - rowsum(dO * O))
      at::Tensor ds = dprobs.sub_((dout * o).sum(-1, /*keepdim=*/true)).mul_(probs).mul_(scale);
      at::Tensor dq_heads = at::bmm(ds, seq.k);
      at::Tensor dk_heads = at::bmm(ds.transpose(1, 2), seq.q);
      const int64_t s = dq_heads.size(1);
      // Heads of one query group add into the group's k and v gradients.
      dk_heads = dk_heads.view({g, n / g, s, -1}).sum(1);
      dv_heads = dv_heads.view({g, n / g, s, -1}).sum(1);
      dq.select(1, i).copy_(dq_heads.transpose(0, 1));
      dk.select(1, i).copy_(dk_heads.transpose(0, 1));
      dv.select(1, i).copy_(dv_heads.transpose(0, 1));
    }
    return {dq, dk, dv, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor FusedSwiglu(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& probs) {
  return FusedSwigluFunction::apply(x, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt,
                                    probs.defined() ? c10::optional<at::Tensor>(probs) : c10::nullopt);
}

at::Tensor FusedRope(const at::Tensor& t, const at::Tensor& freqs) {
  return FusedRopeFunction::apply(t, freqs);
}

at::Tensor FusedBiasDropoutAdd(const at::Tensor& x, const at::Tensor& bias,
                               const at::Tensor& residual, double p) {
  if (p <= 0.0) return residual + (bias.defined() ? x + bias : x);  // no mask: nothing saved
  return FusedBiasDropoutAddFunction::apply(
      x, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt, residual, p);
}

at::Tensor FusedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          double scale, double p) {
  return FusedAttentionFunction::apply(q, k, v, scale, p);
}

void TeAttentionInputs(at::Tensor& q, at::Tensor& k, at::Tensor& v) {
  q = q.contiguous();
  k = k.contiguous();
  v = v.contiguous();
}

}  // namespace remat::engine
