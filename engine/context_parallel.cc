#include "engine/context_parallel.h"

#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

namespace remat::engine {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

constexpr int kKvTag = 0, kGradTag = 1;

const Runtime& RuntimeAt(int64_t address) { return *reinterpret_cast<const Runtime*>(address); }

DataType WireType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DataType::kFloat32;
    case at::kBFloat16: return DataType::kBFloat16;
    default: throw std::invalid_argument("context parallel: unsupported activation dtype");
  }
}

// ---- Per-step attention (fp32 math, [b, n, s, d] layout) ----------------------------------------

// [s, b, h, d] -> fp32 [b, n, s, d], each of the h key/value heads repeated for its n / h query
// heads (Megatron's group-major order, as the unfused attention's repeat_interleave).
at::Tensor ToHeads(const at::Tensor& x, int64_t n) {
  at::Tensor t = x.permute({1, 2, 0, 3}).to(at::kFloat);
  const int64_t h = x.size(2);
  return n == h ? t : t.repeat_interleave(n / h, 1);
}

// The gradient of ToHeads: fp32 [b, n, s, d] -> fp32 [s, b, h, d] (contiguous).
at::Tensor FromHeadsGrad(const at::Tensor& g, int64_t h) {
  const int64_t b = g.size(0), n = g.size(1), s = g.size(2), d = g.size(3);
  at::Tensor t = n == h ? g : g.reshape({b, h, n / h, s, d}).sum(2);
  return t.permute({2, 0, 1, 3}).contiguous();
}

// Scores of q [b, n, sq, d] against k [b, n, sk, d], causal bottom-right aligned (query i of the
// block sits at key position sk - sq + i) when `causal`.
at::Tensor Scores(const at::Tensor& q, const at::Tensor& k, double scale, bool causal) {
  at::Tensor s = at::matmul(q, k.transpose(-1, -2)).mul_(scale);
  if (causal) {
    const int64_t sq = q.size(2), sk = k.size(2);
    at::Tensor masked =
        at::ones({sq, sk}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(sk - sq + 1);
    s.masked_fill_(masked, -std::numeric_limits<float>::infinity());
  }
  return s;
}

struct Partial {
  at::Tensor out;  // fp32 [b, n, sq, dv]
  at::Tensor lse;  // fp32 [b, n, sq]
};

Partial AttendBlock(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                    bool causal) {
  at::Tensor s = Scores(q, k, scale, causal);
  at::Tensor lse = at::logsumexp(s, -1);
  s.sub_(lse.unsqueeze(-1)).exp_();
  return {at::matmul(s, v), lse};
}

// Folds a partial result into the running output and log-sum-exp (views of the rows it covers).
void Merge(at::Tensor out, at::Tensor lse, const Partial& part) {
  at::Tensor merged = at::logaddexp(lse, part.lse);
  out.mul_((lse - merged).exp_().unsqueeze(-1));
  out.add_(part.out * (part.lse - merged).exp_().unsqueeze(-1));
  lse.copy_(merged);
}

// Adds one block's gradients into dq, dk, dv (views), from the final output's log-sum-exp and
// delta = rowsum(dout * out), as a flash kernel's backward recomputes the probabilities.
void BlockGrad(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& delta,
               double scale, bool causal, at::Tensor dq, at::Tensor dk, at::Tensor dv) {
  at::Tensor p = Scores(q, k, scale, causal);
  p.sub_(lse.unsqueeze(-1)).exp_();
  dv.add_(at::matmul(p.transpose(-1, -2), dout));
  at::Tensor ds = at::matmul(dout, v.transpose(-1, -2));
  ds.sub_(delta.unsqueeze(-1)).mul_(p);
  p = at::Tensor();
  dq.add_(at::matmul(ds, k), scale);
  dk.add_(at::matmul(ds.transpose(-1, -2), q), scale);
}

// fp32 [b, n, s, dv] -> [s, b, n * dv] in `dtype` (contiguous).
at::Tensor ContextOf(const at::Tensor& out, at::ScalarType dtype) {
  const int64_t b = out.size(0), n = out.size(1), s = out.size(2), dv = out.size(3);
  return out.permute({2, 0, 1, 3}).to(dtype).contiguous().view({s, b, n * dv});
}

// dout [s, b, n * dv] -> fp32 [b, n, s, dv].
at::Tensor HeadsOfContext(const at::Tensor& x, int64_t n) {
  return x.reshape({x.size(0), x.size(1), n, -1}).permute({1, 2, 0, 3}).to(at::kFloat);
}

// ---- Chunk order ------------------------------------------------------------------------------

// Chunk c (of 2 x CP, natural order) sits at position Slot(c) of the rank-ordered concatenation
// of every rank's local sequence (rank r: chunks r, 2 x CP - 1 - r).
int64_t Slot(int64_t c, int64_t cp) { return c < cp ? 2 * c : 2 * (2 * cp - 1 - c) + 1; }

// Reorders dim 0 of x (2 x CP chunks) from rank order to natural order, or back.
at::Tensor Reorder(const at::Tensor& x, int64_t cp, bool to_natural) {
  std::vector<int64_t> index(2 * cp);
  for (int64_t c = 0; c < 2 * cp; ++c) {
    if (to_natural) {
      index[c] = Slot(c, cp);
    } else {
      index[Slot(c, cp)] = c;
    }
  }
  std::vector<int64_t> shape = x.sizes().vec();
  std::vector<int64_t> chunked = shape;
  chunked[0] = 2 * cp;
  chunked.insert(chunked.begin() + 1, shape[0] / (2 * cp));
  at::Tensor idx = at::tensor(index, at::TensorOptions().dtype(at::kLong)).to(x.device());
  return x.reshape(chunked).index_select(0, idx).reshape(shape);
}

// ---- p2p: the KV ring ----------------------------------------------------------------------------

// What step `i` of rank `r`'s ring attends: the KV chunks of rank r - i (mod CP).
enum class RingStep { kDiagonal, kFirstKvChunk, kSecondQueryChunk };
RingStep StepOf(int i, int r) {
  if (i == 0) return RingStep::kDiagonal;
  return i <= r ? RingStep::kFirstKvChunk : RingStep::kSecondQueryChunk;
}

// k and v of a packed KV buffer (TE's kv = cat(k.view(-1), v.view(-1))).
std::pair<at::Tensor, at::Tensor> Unpack(const at::Tensor& kv, at::IntArrayRef k_shape,
                                         at::IntArrayRef v_shape) {
  const int64_t nk = c10::multiply_integers(k_shape);
  return {kv.narrow(0, 0, nk).view(k_shape), kv.narrow(0, nk, kv.numel() - nk).view(v_shape)};
}

void RingExchange(const Runtime& rt, const std::vector<std::pair<at::Tensor, at::Tensor>>& pairs) {
  // Each pair: (what goes to the next rank, the buffer for what comes from the previous one).
  const int cp = rt.cp.size(), next = (rt.cp.rank + 1) % cp, prev = (rt.cp.rank + cp - 1) % cp;
  std::vector<PeerTransfer> batch;
  int tag = kKvTag;
  for (const auto& [send, recv] : pairs) {
    batch.push_back(PeerTransfer{true, next, tag, send.data_ptr(), static_cast<size_t>(send.numel()),
                                 WireType(send.scalar_type())});
    batch.push_back(PeerTransfer{false, prev, tag, recv.data_ptr(), static_cast<size_t>(recv.numel()),
                                 WireType(recv.scalar_type())});
    ++tag;
  }
  rt.comm->SendRecv(rt.cp, batch);
}

struct RingAttentionFunction : public torch::autograd::Function<RingAttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, int64_t rt_address, double scale) {
    const Runtime& rt = RuntimeAt(rt_address);
    const int cp = rt.cp.size(), r = rt.cp.rank;
    const int64_t n = q.size(2), sl = q.size(0), half = sl / 2, b = q.size(1), dv = v.size(3);
    at::Tensor kv = at::cat({k.reshape({-1}), v.reshape({-1})});  // saved and sent, as TE's
    at::Tensor qf = ToHeads(q, n);
    at::Tensor out = at::zeros({b, n, sl, dv}, qf.options());
    at::Tensor lse = at::full({b, n, sl}, -std::numeric_limits<float>::infinity(), qf.options());
    at::Tensor current = kv;
    for (int i = 0; i < cp; ++i) {
      at::Tensor next;
      if (i + 1 < cp) {
        next = at::empty_like(kv);
        RingExchange(rt, {{current, next}});
      }
      auto [kc, vc] = Unpack(current, k.sizes(), v.sizes());
      at::Tensor kf = ToHeads(kc, n), vf = ToHeads(vc, n);
      switch (StepOf(i, r)) {
        case RingStep::kDiagonal:
          Merge(out, lse, AttendBlock(qf, kf, vf, scale, /*causal=*/true));
          break;
        case RingStep::kFirstKvChunk:
          Merge(out, lse, AttendBlock(qf, kf.narrow(2, 0, half), vf.narrow(2, 0, half), scale, false));
          break;
        case RingStep::kSecondQueryChunk:
          Merge(out.narrow(2, half, sl - half), lse.narrow(2, half, sl - half),
                AttendBlock(qf.narrow(2, half, sl - half), kf, vf, scale, false));
          break;
      }
      current = next;
    }
    at::Tensor context = ContextOf(out, q.scalar_type());
    ctx->save_for_backward({q, kv, context, lse});
    ctx->saved_data["rt"] = rt_address;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["k_shape"] = k.sizes().vec();
    ctx->saved_data["v_shape"] = v.sizes().vec();
    return context;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Runtime& rt = RuntimeAt(ctx->saved_data["rt"].toInt());
    const double scale = ctx->saved_data["scale"].toDouble();
    const std::vector<int64_t> k_shape = ctx->saved_data["k_shape"].toIntVector();
    const std::vector<int64_t> v_shape = ctx->saved_data["v_shape"].toIntVector();
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor& q = saved[0];
    const at::Tensor& kv = saved[1];
    const int cp = rt.cp.size(), r = rt.cp.rank;
    const int64_t n = q.size(2), sl = q.size(0), half = sl / 2, g = k_shape[2];
    at::Tensor qf = ToHeads(q, n);
    at::Tensor dout = HeadsOfContext(grads[0], n);
    at::Tensor lse = saved[3];
    at::Tensor delta = (dout * HeadsOfContext(saved[2], n)).sum(-1);
    at::Tensor dq = at::zeros_like(qf);
    at::Tensor current = kv;
    at::Tensor dkv = at::zeros({kv.numel()}, kv.options().dtype(at::kFloat));
    for (int i = 0; i < cp; ++i) {
      auto [kc, vc] = Unpack(current, k_shape, v_shape);
      at::Tensor kf = ToHeads(kc, n), vf = ToHeads(vc, n);
      at::Tensor dk = at::zeros_like(kf), dv = at::zeros_like(vf);
      switch (StepOf(i, r)) {
        case RingStep::kDiagonal:
          BlockGrad(qf, kf, vf, dout, lse, delta, scale, true, dq, dk, dv);
          break;
        case RingStep::kFirstKvChunk:
          BlockGrad(qf, kf.narrow(2, 0, half), vf.narrow(2, 0, half), dout, lse, delta, scale,
                    false, dq, dk.narrow(2, 0, half), dv.narrow(2, 0, half));
          break;
        case RingStep::kSecondQueryChunk: {
          const int64_t m = sl - half;
          BlockGrad(qf.narrow(2, half, m), kf, vf, dout.narrow(2, half, m), lse.narrow(2, half, m),
                    delta.narrow(2, half, m), scale, false, dq.narrow(2, half, m), dk, dv);
          break;
        }
      }
      dkv.add_(at::cat({FromHeadsGrad(dk, g).reshape({-1}), FromHeadsGrad(dv, g).reshape({-1})}));
      // The KV chunk goes on round the ring with the gradient gathered for it so far; after the
      // last step the gradient reaches the chunk's owner (the next rank).
      at::Tensor next_dkv = at::empty_like(dkv);
      if (i + 1 < cp) {
        at::Tensor next = at::empty_like(kv);
        RingExchange(rt, {{current, next}, {dkv, next_dkv}});
        current = next;
      } else {
        RingExchange(rt, {{dkv, next_dkv}});
      }
      dkv = next_dkv;
    }
    auto [dk, dv] = Unpack(dkv, k_shape, v_shape);
    const at::ScalarType dtype = q.scalar_type();
    return {dq.permute({2, 0, 1, 3}).to(dtype).contiguous(), dk.to(dtype), dv.to(dtype),
            at::Tensor(), at::Tensor()};
  }
};

// ---- allgather: K and V gathered --------------------------------------------------------------

// Every rank's x [s/CP, b, h, d] in natural sequence order: [s, b, h, d].
at::Tensor GatherSequence(const Runtime& rt, const at::Tensor& x) {
  at::Tensor in = x.contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] *= rt.cp.size();
  at::Tensor out = at::empty(shape, in.options());
  rt.comm->AllGather(rt.cp, in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()),
                     WireType(in.scalar_type()));
  return Reorder(out, rt.cp.size(), /*to_natural=*/true);
}

// The local query chunk j (0 or 1) of rank r is natural chunk ChunkOf(j); it attends the keys up
// to its end, the last chunk-square causal.
int64_t ChunkOf(int j, int r, int cp) { return j == 0 ? r : 2 * cp - 1 - r; }

struct AllGatherAttentionFunction : public torch::autograd::Function<AllGatherAttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, int64_t rt_address, double scale) {
    const Runtime& rt = RuntimeAt(rt_address);
    const int cp = rt.cp.size(), r = rt.cp.rank;
    const int64_t n = q.size(2), sl = q.size(0), c = sl / 2, b = q.size(1), dv = v.size(3);
    at::Tensor kf = ToHeads(GatherSequence(rt, k), n), vf = ToHeads(GatherSequence(rt, v), n);
    at::Tensor qf = ToHeads(q, n);
    at::Tensor out = at::empty({b, n, sl, dv}, qf.options());
    at::Tensor lse = at::empty({b, n, sl}, qf.options());
    for (int j = 0; j < 2; ++j) {
      const int64_t keys = (ChunkOf(j, r, cp) + 1) * c;
      Partial part = AttendBlock(qf.narrow(2, j * c, c), kf.narrow(2, 0, keys),
                                 vf.narrow(2, 0, keys), scale, true);
      out.narrow(2, j * c, c).copy_(part.out);
      lse.narrow(2, j * c, c).copy_(part.lse);
    }
    at::Tensor context = ContextOf(out, q.scalar_type());
    ctx->save_for_backward({q, k, v, context, lse});
    ctx->saved_data["rt"] = rt_address;
    ctx->saved_data["scale"] = scale;
    return context;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Runtime& rt = RuntimeAt(ctx->saved_data["rt"].toInt());
    const double scale = ctx->saved_data["scale"].toDouble();
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &lse = saved[4];
    const int cp = rt.cp.size(), r = rt.cp.rank;
    const int64_t n = q.size(2), sl = q.size(0), c = sl / 2, g = k.size(2);
    at::Tensor kf = ToHeads(GatherSequence(rt, k), n), vf = ToHeads(GatherSequence(rt, v), n);
    at::Tensor qf = ToHeads(q, n);
    at::Tensor dout = HeadsOfContext(grads[0], n);
    at::Tensor delta = (dout * HeadsOfContext(saved[3], n)).sum(-1);
    at::Tensor dq = at::zeros_like(qf), dk = at::zeros_like(kf), dv = at::zeros_like(vf);
    for (int j = 0; j < 2; ++j) {
      const int64_t keys = (ChunkOf(j, r, cp) + 1) * c;
      BlockGrad(qf.narrow(2, j * c, c), kf.narrow(2, 0, keys), vf.narrow(2, 0, keys),
                dout.narrow(2, j * c, c), lse.narrow(2, j * c, c), delta.narrow(2, j * c, c),
                scale, true, dq.narrow(2, j * c, c), dk.narrow(2, 0, keys), dv.narrow(2, 0, keys));
    }
    // Every rank's gradient for every key: summed over the group, each rank keeping its chunks.
    auto scatter = [&](const at::Tensor& grad_heads, const at::Tensor& like) {
      at::Tensor full = Reorder(FromHeadsGrad(grad_heads, g), cp, /*to_natural=*/false);
      at::Tensor mine = at::empty(like.sizes(), full.options());
      rt.comm->ReduceScatter(rt.cp, full.data_ptr(), mine.data_ptr(),
                             static_cast<size_t>(mine.numel()), DataType::kFloat32);
      return mine.to(like.scalar_type());
    };
    const at::ScalarType dtype = q.scalar_type();
    return {dq.permute({2, 0, 1, 3}).to(dtype).contiguous(), scatter(dk, k), scatter(dv, v),
            at::Tensor(), at::Tensor()};
  }
};

// ---- a2a: Ulysses ---------------------------------------------------------------------------------

// [s/CP, b, h, d] (local order) -> [s, b, h/CP, d] (natural order, this rank's heads), or back.
at::Tensor ExchangeSequenceAndHeads(const Runtime& rt, const at::Tensor& x, bool to_heads) {
  const int64_t cp = rt.cp.size();
  at::Tensor in;
  std::vector<int64_t> part;  // one peer's block
  if (to_heads) {
    const int64_t sl = x.size(0), b = x.size(1), h = x.size(2), d = x.size(3);
    part = {sl, b, h / cp, d};
    // Head block j goes to rank j.
    in = x.reshape({sl, b, cp, h / cp, d}).permute({2, 0, 1, 3, 4}).contiguous();
  } else {
    const int64_t s = x.size(0), b = x.size(1), hl = x.size(2), d = x.size(3);
    part = {s / cp, b, hl, d};
    // Rank j's sequence chunks go back to rank j.
    in = Reorder(x, cp, /*to_natural=*/false).contiguous();
  }
  at::Tensor out = at::empty_like(in);
  const size_t per_peer = static_cast<size_t>(in.numel() / cp);
  const std::vector<size_t> counts(cp, per_peer);
  rt.comm->AllToAll(rt.cp, in.data_ptr(), counts, out.data_ptr(), counts,
                    WireType(in.scalar_type()));
  if (to_heads) {
    // Blocks from each rank: its local sequence of this rank's heads.
    return Reorder(out.view({cp * part[0], part[1], part[2], part[3]}), cp, /*to_natural=*/true);
  }
  // Blocks from each rank: this rank's sequence for that rank's heads.
  return out.view({cp, part[0], part[1], part[2], part[3]})
      .permute({1, 2, 0, 3, 4})
      .reshape({part[0], part[1], cp * part[2], part[3]});
}

struct SequenceToHeadsFunction : public torch::autograd::Function<SequenceToHeadsFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t rt_address,
                            bool to_heads) {
    ctx->saved_data["rt"] = rt_address;
    ctx->saved_data["to_heads"] = to_heads;
    return ExchangeSequenceAndHeads(RuntimeAt(rt_address), x, to_heads);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool to_heads = ctx->saved_data["to_heads"].toBool();
    return {ExchangeSequenceAndHeads(RuntimeAt(ctx->saved_data["rt"].toInt()), grads[0], !to_heads),
            at::Tensor(), at::Tensor()};
  }
};

// Whole-sequence causal attention of [s, b, heads, d] tensors -> [s, b, n, dv], saving q, k, v,
// the output and the log-sum-exp (a fused kernel's saved set).
struct LocalAttentionFunction : public torch::autograd::Function<LocalAttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale) {
    const int64_t n = q.size(2);
    Partial part = AttendBlock(ToHeads(q, n), ToHeads(k, n), ToHeads(v, n), scale, true);
    at::Tensor out = part.out.permute({2, 0, 1, 3}).to(q.scalar_type()).contiguous();
    ctx->save_for_backward({q, k, v, out, part.lse});
    ctx->saved_data["scale"] = scale;
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const double scale = ctx->saved_data["scale"].toDouble();
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &lse = saved[4];
    const int64_t n = q.size(2), g = k.size(2);
    at::Tensor qf = ToHeads(q, n), kf = ToHeads(k, n), vf = ToHeads(v, n);
    at::Tensor dout = ToHeads(grads[0], n);
    at::Tensor delta = (dout * ToHeads(saved[3], n)).sum(-1);
    at::Tensor dq = at::zeros_like(qf), dk = at::zeros_like(kf), dv = at::zeros_like(vf);
    BlockGrad(qf, kf, vf, dout, lse, delta, scale, true, dq, dk, dv);
    const at::ScalarType dtype = q.scalar_type();
    return {dq.permute({2, 0, 1, 3}).to(dtype).contiguous(), FromHeadsGrad(dk, g).to(dtype),
            FromHeadsGrad(dv, g).to(dtype), at::Tensor()};
  }
};

at::Tensor UlyssesAttention(const Runtime& rt, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale) {
  const int64_t address = reinterpret_cast<int64_t>(&rt);
  auto to_heads = [&](const at::Tensor& x) { return SequenceToHeadsFunction::apply(x, address, true); };
  at::Tensor out = LocalAttentionFunction::apply(to_heads(q), to_heads(k), to_heads(v), scale);
  out = SequenceToHeadsFunction::apply(out, address, false);  // [s/CP, b, n, dv]
  return out.reshape({out.size(0), out.size(1), -1});
}

}  // namespace

at::Tensor LocalSequence(const Runtime& rt, const at::Tensor& x, int64_t dim) {
  const int cp = rt.cp_size();
  if (cp == 1) return x;
  const int r = rt.cp_rank();
  const int64_t c = x.size(dim) / (2 * cp);
  return at::cat({x.narrow(dim, r * c, c), x.narrow(dim, (2 * cp - 1 - r) * c, c)}, dim);
}

at::Tensor LocalPositions(const Runtime& rt, int64_t seq, const at::TensorOptions& options) {
  return LocalSequence(rt, at::arange(seq, options), 0);
}

at::Tensor ContextParallelAttention(const Runtime& rt, const at::Tensor& q, const at::Tensor& k,
                                    const at::Tensor& v, double scale) {
  const int64_t address = reinterpret_cast<int64_t>(&rt);
  switch (rt.cp_comm_type) {
    case search::CpCommType::kP2p:
      return RingAttentionFunction::apply(q, k, v, address, scale);
    case search::CpCommType::kAllGather:
      return AllGatherAttentionFunction::apply(q, k, v, address, scale);
    case search::CpCommType::kA2a:
      return UlyssesAttention(rt, q, k, v, scale);
    case search::CpCommType::kA2aP2p:
      break;
  }
  throw std::invalid_argument("parallel.cp_comm_type: a2a+p2p is not supported by this engine");
}

}  // namespace remat::engine
