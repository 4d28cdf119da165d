#include "engine/moe_dispatch.h"

#include <torch/csrc/autograd/custom_function.h>

#include <numeric>
#include <stdexcept>

namespace remat::engine {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

int64_t Sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

bool AllEqual(const std::vector<int64_t>& v) {
  for (int64_t x : v) {
    if (x != v.front()) return false;
  }
  return true;
}

int64_t RowElems(const at::Tensor& x) {
  int64_t n = 1;
  for (int64_t d = 1; d < x.dim(); ++d) n *= x.size(d);
  return n;
}

std::vector<size_t> Elems(const std::vector<int64_t>& rows, int64_t row_elems) {
  std::vector<size_t> out;
  for (int64_t r : rows) out.push_back(static_cast<size_t>(r * row_elems));
  return out;
}

at::Tensor WithRows(const at::Tensor& x, int64_t rows) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = rows;
  return at::empty(shape, x.options());
}

// Megatron's gather_from_sequence_parallel_region with output_split_sizes: member j's rows
// (sizes[j] of them) concatenated in member order. Equal sizes are one all-gather; unequal ones
// an all-to-all that sends this rank's rows to every member.
at::Tensor GatherRowsRaw(const Runtime& rt, const Group& g, const at::Tensor& x,
                         const std::vector<int64_t>& sizes) {
  at::Tensor in = x.contiguous();
  at::Tensor out = WithRows(in, Sum(sizes));
  const int64_t row = RowElems(in);
  if (AllEqual(sizes)) {
    rt.comm->AllGather(g, in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()),
                       CollectiveType(in.scalar_type()));
    return out;
  }
  at::Tensor copies = in.repeat({g.size(), 1}).contiguous();  // transient: freed at once
  std::vector<int64_t> mine(g.size(), in.size(0));
  rt.comm->AllToAll(g, copies.data_ptr(), Elems(mine, row), out.data_ptr(), Elems(sizes, row),
                    CollectiveType(in.scalar_type()));
  return out;
}

// Megatron's reduce_scatter_to_sequence_parallel_region with input_split_sizes: `x` holds every
// member's rows (sizes[j] for member j, in member order); each member gets the sum over the
// group of its rows.
at::Tensor ScatterRowsRaw(const Runtime& rt, const Group& g, const at::Tensor& x,
                          const std::vector<int64_t>& sizes) {
  at::Tensor in = x.contiguous();
  const int64_t row = RowElems(in);
  const int64_t mine = sizes[g.rank];
  at::Tensor out = WithRows(in, mine);
  if (AllEqual(sizes)) {
    rt.comm->ReduceScatter(g, in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                           CollectiveType(in.scalar_type()));
    return out;
  }
  at::Tensor parts = WithRows(in, mine * g.size());
  std::vector<int64_t> each(g.size(), mine);
  rt.comm->AllToAll(g, in.data_ptr(), Elems(sizes, row), parts.data_ptr(), Elems(each, row),
                    CollectiveType(in.scalar_type()));
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] = mine;
  shape.insert(shape.begin(), g.size());
  return parts.view(shape).sum(0);
}

const Group& GroupOf(AutogradContext* ctx) {
  return *reinterpret_cast<const Group*>(ctx->saved_data["group"].toInt());
}
const Runtime& RuntimeOf(AutogradContext* ctx) {
  return *reinterpret_cast<const Runtime*>(ctx->saved_data["rt"].toInt());
}

void SaveContext(AutogradContext* ctx, const Runtime& rt, const Group& g,
                 const std::vector<int64_t>& sizes) {
  ctx->saved_data["rt"] = reinterpret_cast<int64_t>(&rt);
  ctx->saved_data["group"] = reinterpret_cast<int64_t>(&g);
  ctx->saved_data["sizes"] = sizes;
}

// Gather forward, reduce-scatter backward (and the reverse): nothing is saved for backward.
struct GatherRowsFunction : public torch::autograd::Function<GatherRowsFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t rt, int64_t g,
                            const std::vector<int64_t>& sizes) {
    SaveContext(ctx, *reinterpret_cast<const Runtime*>(rt), *reinterpret_cast<const Group*>(g),
                sizes);
    return GatherRowsRaw(RuntimeOf(ctx), GroupOf(ctx), x, sizes);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    return {ScatterRowsRaw(RuntimeOf(ctx), GroupOf(ctx), grads[0], sizes), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

struct ScatterRowsFunction : public torch::autograd::Function<ScatterRowsFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t rt, int64_t g,
                            const std::vector<int64_t>& sizes) {
    SaveContext(ctx, *reinterpret_cast<const Runtime*>(rt), *reinterpret_cast<const Group*>(g),
                sizes);
    return ScatterRowsRaw(RuntimeOf(ctx), GroupOf(ctx), x, sizes);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    return {GatherRowsRaw(RuntimeOf(ctx), GroupOf(ctx), grads[0], sizes), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

at::Tensor GatherRows(const Runtime& rt, const Group& g, const at::Tensor& x,
                      const std::vector<int64_t>& sizes) {
  if (g.size() <= 1) return x;
  return GatherRowsFunction::apply(x, reinterpret_cast<int64_t>(&rt),
                                   reinterpret_cast<int64_t>(&g), sizes);
}

at::Tensor ScatterRows(const Runtime& rt, const Group& g, const at::Tensor& x,
                       const std::vector<int64_t>& sizes) {
  if (g.size() <= 1) return x;
  return ScatterRowsFunction::apply(x, reinterpret_cast<int64_t>(&rt),
                                    reinterpret_cast<int64_t>(&g), sizes);
}

std::vector<int64_t> HostLongs(const at::Tensor& t) {
  at::Tensor host = t.to(at::kCPU).to(at::kLong).contiguous();
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
}

at::Tensor IndexTensor(const std::vector<int64_t>& v, const at::Device& device) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(device);
}

// Megatron's permute (moe_utils.py, unfused): the token indices of each expert's tokens,
// expert-major, and the tokens and probabilities in that order.
struct Permuted {
  at::Tensor sorted;  // [routed] token index of each row
  at::Tensor tokens;  // [routed, hidden]
  at::Tensor probs;   // [routed]
  std::vector<int64_t> counts;  // per expert
};

Permuted Permute(const at::Tensor& hs, const at::Tensor& map, const at::Tensor& probs) {
  const int64_t experts = map.size(1), num_tokens = hs.size(0);
  Permuted p;
  p.counts = HostLongs(map.sum(0));
  at::Tensor map_t = map.t().contiguous();
  at::Tensor token_idx = at::arange(num_tokens, hs.options().dtype(at::kLong))
                             .unsqueeze(0).expand({experts, -1});
  p.sorted = token_idx.masked_select(map_t);
  p.probs = probs.t().contiguous().masked_select(map_t);
  p.tokens = hs.index_select(0, p.sorted);
  return p;
}

// Megatron's unpermute: each expert output row added into its token's row.
at::Tensor Unpermute(const at::Tensor& out, const at::Tensor& sorted, int64_t num_tokens) {
  const int64_t hidden = out.size(1);
  return at::zeros({num_tokens, hidden}, out.options())
      .scatter_add(0, sorted.unsqueeze(1).expand({-1, hidden}), out);
}

at::Tensor RoutingMap(const at::Tensor& top_idx, int64_t tokens, int64_t experts) {
  return at::zeros({tokens, experts}, top_idx.options().dtype(at::kBool))
      .scatter(1, top_idx, true);
}

at::Tensor AllGatherDispatch(const Runtime& rt, const at::Tensor& hs, const at::Tensor& probs,
                             const at::Tensor& top_idx, const LocalExperts& experts) {
  const Group& g = rt.expert_tp_ep;
  const int64_t num_experts = probs.size(1), local = num_experts / rt.ep_size();
  at::Tensor all_hs = hs, all_probs = probs, all_idx = top_idx;
  if (g.size() > 1) {
    const std::vector<int64_t> equal(g.size(), hs.size(0));
    {
      at::NoGradGuard no_grad;
      at::Tensor mine = top_idx.contiguous();
      all_idx = WithRows(mine, hs.size(0) * g.size());
      rt.comm->AllGatherRouting(g, mine.data_ptr<int64_t>(), all_idx.data_ptr<int64_t>(),
                                static_cast<size_t>(mine.numel()),
                                Collectives::Routing::kExpertIndices, num_experts, local);
    }
    all_probs = GatherRows(rt, g, probs, equal);
    all_hs = GatherRows(rt, g, hs, equal);
  }
  at::Tensor map = RoutingMap(all_idx, all_hs.size(0), num_experts);
  if (local != num_experts) {
    const int64_t first = rt.ep_rank() * local;
    map = map.narrow(1, first, local);
    all_probs = all_probs.narrow(1, first, local);
  }
  Permuted p = Permute(all_hs, map, all_probs);
  at::Tensor out = Unpermute(experts(p.tokens, p.counts, p.probs), p.sorted, all_hs.size(0));
  if (g.size() > 1) out = ScatterRows(rt, g, out, std::vector<int64_t>(g.size(), hs.size(0)));
  return out;
}

at::Tensor AllToAllDispatch(const Runtime& rt, const at::Tensor& hs, const at::Tensor& probs,
                            const at::Tensor& top_idx, const LocalExperts& experts) {
  const int64_t num_experts = probs.size(1);
  const int ep = rt.ep_size(), etp = rt.etp_size();
  const int64_t local = num_experts / ep;
  Permuted p = Permute(hs, RoutingMap(top_idx, hs.size(0), num_experts), probs);
  if (ep * etp == 1) return Unpermute(experts(p.tokens, p.counts, p.probs), p.sorted, hs.size(0));

  // Every ETP x EP member's per-expert counts; member m = t + ETP x s (expert TP fastest).
  std::vector<int64_t> all(static_cast<size_t>(num_experts) * ep * etp);
  {
    at::Tensor mine = IndexTensor(p.counts, hs.device());
    at::Tensor gathered = at::empty({num_experts * ep * etp}, mine.options());
    rt.comm->AllGatherRouting(rt.expert_tp_ep, mine.data_ptr<int64_t>(),
                              gathered.data_ptr<int64_t>(), static_cast<size_t>(num_experts),
                              Collectives::Routing::kCountsPerExpert, num_experts, local);
    all = HostLongs(gathered);
  }
  // n(t, s, i): tokens that member (t, s) routes to this rank's local expert i.
  const int64_t first = rt.ep_rank() * local;
  auto n = [&](int t, int s, int64_t i) { return all[(s * etp + t) * num_experts + first + i]; };
  std::vector<int64_t> send(ep, 0), recv(ep, 0), tp_rows(etp, 0), local_counts(local, 0);
  for (int64_t e = 0; e < num_experts; ++e) send[e / local] += p.counts[e];
  for (int t = 0; t < etp; ++t) {
    for (int s = 0; s < ep; ++s) {
      for (int64_t i = 0; i < local; ++i) {
        if (t == rt.etp_rank()) recv[s] += n(t, s, i);
        tp_rows[t] += n(t, s, i);
        local_counts[i] += n(t, s, i);
      }
    }
  }
  at::Tensor tokens = p.tokens, token_probs = p.probs.unsqueeze(-1);
  if (ep > 1) {
    tokens = AllToAllRows(rt, tokens, send, recv);
    token_probs = AllToAllRows(rt, token_probs, send, recv);
  }
  tokens = GatherRows(rt, rt.expert_tp, tokens, tp_rows);
  token_probs = GatherRows(rt, rt.expert_tp, token_probs, tp_rows).squeeze(-1);
  // Rows arrive as chunks (t, s, i); the experts take them local-expert-major (Megatron's
  // sort_chunks_by_idxs; skipped with one local expert, as Megatron skips it).
  at::Tensor out;
  if (local > 1) {
    std::vector<int64_t> start(static_cast<size_t>(etp) * ep * local), order;
    int64_t offset = 0;
    for (int t = 0; t < etp; ++t) {
      for (int s = 0; s < ep; ++s) {
        for (int64_t i = 0; i < local; ++i) {
          start[(t * ep + s) * local + i] = offset;
          offset += n(t, s, i);
        }
      }
    }
    order.reserve(offset);
    for (int64_t i = 0; i < local; ++i) {
      for (int t = 0; t < etp; ++t) {
        for (int s = 0; s < ep; ++s) {
          const int64_t begin = start[(t * ep + s) * local + i];
          for (int64_t k = 0; k < n(t, s, i); ++k) order.push_back(begin + k);
        }
      }
    }
    std::vector<int64_t> inverse(order.size());
    for (size_t k = 0; k < order.size(); ++k) inverse[order[k]] = static_cast<int64_t>(k);
    at::Tensor by_expert = IndexTensor(order, hs.device());
    at::Tensor by_source = IndexTensor(inverse, hs.device());
    out = experts(tokens.index_select(0, by_expert), local_counts,
                  token_probs.index_select(0, by_expert))
              .index_select(0, by_source);
  } else {
    out = experts(tokens, local_counts, token_probs);
  }
  out = ScatterRows(rt, rt.expert_tp, out, tp_rows);
  if (ep > 1) out = AllToAllRows(rt, out, recv, send);
  return Unpermute(out, p.sorted, hs.size(0));
}

}  // namespace

at::Tensor DispatchToExperts(const Runtime& rt, search::MoeTokenDispatcher dispatcher,
                             const at::Tensor& hs, const at::Tensor& probs,
                             const at::Tensor& top_idx, const LocalExperts& experts) {
  if (dispatcher == search::MoeTokenDispatcher::kAllgather) {
    return AllGatherDispatch(rt, hs, probs, top_idx, experts);
  }
  return AllToAllDispatch(rt, hs, probs, top_idx, experts);  // flex: modelled as all-to-all
}

at::Tensor ExpertShard(const Runtime& rt, const at::Tensor& full, const ParamInfo& p) {
  if (p.expert_view.empty()) return full;
  at::Tensor v = full.reshape(p.expert_view);
  if (p.expert_dim >= 0 && rt.ep_size() > 1) {
    const int64_t part = v.size(p.expert_dim) / rt.ep_size();
    v = v.narrow(p.expert_dim, part * rt.ep_rank(), part);
  }
  if (p.etp_dim >= 0 && rt.etp_size() > 1) {
    const int64_t part = v.size(p.etp_dim) / rt.etp_size();
    v = v.narrow(p.etp_dim, part * rt.etp_rank(), part);
  }
  return v.contiguous().view(p.shape);
}

}  // namespace remat::engine
