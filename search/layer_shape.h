// The shapes one transformer layer has on one rank, and its forward FLOPs by region: what the
// memory and FLOP model (search/memory_model.cc) and the static memory (search/static_memory.cc)
// compute from. Internal to remat_search. Thread-safety: pure functions.
#pragma once

#include "search/spec.h"

namespace remat::search {

// Elementwise FLOPs per element, for the labels whose replay is elementwise only (layernorm,
// moe_act). Rough operation counts; docs/memory-model.md explains them.
inline constexpr double kLayerNormFlops = 8;  // mean, variance, normalise, scale, shift
inline constexpr double kRmsNormFlops = 5;    // square, mean, rsqrt, normalise, scale
inline constexpr double kGeluFlops = 8;       // tanh approximation
inline constexpr double kSiluFlops = 4;       // exp, add, divide, multiply

// The shape of one micro-batch on one rank. Sizes are doubles: products overflow 32 bits and
// every result is a byte or FLOP count anyway.
struct Dims {
  double e = 2;                // bytes per activation element: 2 (bf16) or 4 (fp32)
  double s = 0, b = 0, h = 0;  // s: the sequence this rank holds (seq_length / CP)
  double s_kv = 0;    // keys each query attends over: the whole sequence (ring attention under CP)
  double tokens = 0;  // s * b: tokens of full-sequence tensors (attention, MLP internals)
  double seq_tokens = 0;  // tokens of sequence-level tensors (norms, residual): tokens / t with SP
  double t = 1;           // tensor parallel size
  double heads = 0;       // attention heads on this rank
  double groups = 0;      // query groups on this rank
  double d = 0;           // kv_channels (head dim of standard attention)
  double ffn = 0;         // dense FFN width on this rank
  bool glu = false;
  bool sp = false;
};

Dims MakeDims(const SearchSpec& spec);

// The MoE shape on this rank, balanced routing.
struct MoeDims {
  double experts = 0;        // all experts
  double local_experts = 0;  // experts on this rank
  double topk = 0;
  double routed_tokens = 0;  // tokens this rank's router sees
  double expert_tokens =
      0;                  // token copies this rank's experts process (routed_tokens * topk * ETP)
  double ffn = 0;         // expert FFN width on this rank
  double shared_ffn = 0;  // shared-expert FFN width on this rank
};

MoeDims MakeMoeDims(const SearchSpec& spec, const Dims& x);

// Forward FLOPs of one layer on this rank, by region (what each label replays).
struct LayerFlops {
  double attn_linear = 0;  // QKV / MLA projections and the output projection
  double mla_up = 0;       // part of attn_linear: MLA up-projections (mla_up_proj replays these)
  double core = 0;         // core attention (causal: half the score matrix)
  double norms = 0;        // both norms, elementwise
  double mlp = 0;          // dense MLP GEMMs + activation
  double router = 0;
  double experts = 0;  // routed expert GEMMs
  double moe_act = 0;  // routed expert activation (+ probability scaling), elementwise
  double shared = 0;   // shared-expert GEMMs + activation

  double Moe() const { return router + experts + moe_act + shared; }
  double Forward() const { return attn_linear + core + norms + mlp + Moe(); }
};

// FLOPs per element of the MLP activation: SwiGLU (silu and the product) or GELU.
double ActivationFlops(bool glu);

LayerFlops EstimateLayerFlops(const SearchSpec& spec, int layer);

}  // namespace remat::search
