#include "search/memory_model.h"

#include <algorithm>

#include "search/layer_recompute.h"
#include "search/layer_shape.h"
#include "search/mtp_model.h"
#include "search/pipeline.h"
#include "search/pipeline_layout.h"
#include "search/static_memory.h"

namespace remat::search {
namespace {

// Megatron pads the vocabulary to a multiple of 128 * TP (make_vocab_size_divisible_by = 128);
// the embedding, the output layer, the logits and the FLOP formula all use the padded size.
double PaddedVocab(const SearchSpec& spec) { return static_cast<double>(PaddedVocabSize(spec)); }

// Activations outside the layers, and the backward working sets around them.
struct OuterActivations {
  double embedding = 0;    // token ids, vocab-parallel mask, embedding dropout mask
  double final_norm = 0;   // final norm's input and statistics, output layer's input
  double logits = 0;       // the fp32 softmax the cross-entropy keeps
  double logits_work = 0;  // peak above everything held while the loss backward runs
  double loss_forward_work = 0;  // peak above everything held (softmax included) in its forward
  double embedding_work = 0;
};

OuterActivations EstimateOuter(const SearchSpec& spec) {
  const ModelSpec& m = spec.model;
  const Dims x = MakeDims(spec);
  const double vocab = PaddedVocab(spec);
  OuterActivations o;
  o.embedding =
      8 * x.tokens + (x.t > 1 ? x.tokens : 0) + (m.hidden_dropout > 0 ? x.seq_tokens * x.h : 0);
  o.embedding_work =
      x.e * vocab * x.h / x.t + (m.position_embedding_type == PositionEmbedding::kLearnedAbsolute
                                     ? x.e * x.s_kv * x.h  // the whole position table's gradient
                                     : 0);
  o.final_norm = 2 * x.e * x.seq_tokens * x.h + NormStatsBytes(m) * x.seq_tokens;
  // Megatron's vocab-parallel cross-entropy upcasts the logits to fp32, computes the softmax in
  // place and keeps it (plus the target mask and indices); the bf16 logits are then freed.
  const double logit_elems = x.tokens * vocab / x.t;
  o.logits = 4 * logit_elems + 9 * x.tokens;
  // Backward: the fp32 gradient is written into the kept softmax; autograd casts it to the
  // logits' dtype (a copy) before the output layer's backward makes its input and weight
  // gradients.
  const double output_grads = x.e * vocab * x.h / x.t + x.e * x.tokens * x.h;
  if (x.e != 4) {
    o.logits_work = std::max(x.e * logit_elems, x.e * logit_elems + output_grads - 4 * logit_elems);
  } else {
    o.logits_work = output_grads;
  }
  // Forward: the logits in their dtype live beside their fp32 copy (the same tensor in fp32).
  // Megatron's native fusion runs the softmax under torch.compile, whose functionalized in-place
  // update writes one more fp32 logits buffer before copying it back (engine/ops.h SoftmaxExp;
  // measured on an H200, docs/fidelity.md). Transformer Engine's kernel writes into its gradient
  // buffer, the kept one.
  o.loss_forward_work = x.e != 4 ? x.e * logit_elems : 0;
  if (m.cross_entropy_loss_fusion &&
      m.cross_entropy_fusion_impl == CrossEntropyFusionImpl::kNative) {
    o.loss_forward_work += 4 * logit_elems;
  }
  return o;
}

// cuBLAS's workspace on a Hopper GPU: PyTorch gives each (handle, stream) pair one, from the
// caching allocator, at its first GEMM, and keeps it (CUBLAS_WORKSPACE_CONFIG's default ":4096:8"
// on sm90; cuBLASLt shares it). Handles are per thread: the forward's thread and autograd's
// device thread each hold one (pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp).
constexpr double kCublasWorkspaceBytes = 4096.0 * 1024 * 8;
constexpr int kGemmThreads = 2;

double PersistentBufferBytes(const SearchSpec& spec, int pp_rank) {
  const double workspaces = spec.search.OnCuda() ? kGemmThreads * kCublasWorkspaceBytes : 0;
  if (spec.model.attention_backend != AttentionBackend::kUnfused ||
      StageLayerCount(spec, pp_rank) == 0) {
    return workspaces;
  }
  const Dims x = MakeDims(spec);
  // Megatron's global memory buffer for the baddbmm input, [b * heads, s, s], kept across steps.
  return workspaces + x.e * x.b * x.heads * x.s * x.s_kv;
}

// One micro-batch through one model chunk under a policy: what it holds for backward and the
// highest its own backward reaches (both above everything else the rank holds).
struct ChunkEstimate {
  double activation = 0;        // held between its forward and its backward
  double layer_activation = 0;  // the part held by transformer layers
  double logits = 0;            // the part held for the loss (last chunk of the last stage)
  double backward_peak = 0;     // highest live bytes during its backward (>= activation)
  double recompute_flops = 0;   // extra forward FLOPs its backward replays
};

ChunkEstimate EstimateChunk(const SearchSpec& spec, const Policy& policy, const StageChunk& chunk) {
  const ModelSpec& m = spec.model;
  const int layers = chunk.num_layers;
  const double t = std::max(1, spec.parallel.tensor_model_parallel_size);
  ChunkEstimate est;

  std::vector<LayerActivations> acts(layers);
  std::vector<LayerWork> work(layers);
  std::vector<double> kept(layers);
  for (int i = 0; i < layers; ++i) {
    acts[i] = EstimateLayerActivations(spec, chunk.first_layer + i);
    work[i] = EstimateLayerWork(spec, chunk.first_layer + i);
  }
  // Megatron applies recompute_num_layers to each model chunk (one TransformerBlock) alone.

  const bool full = policy.IsFull();
  const int n = full ? std::clamp(policy.num_layers, 1, std::max(1, layers)) : 0;
  const bool uniform = full && policy.method == RecomputeMethod::kUniform;
  // A checkpointed layer group keeps only its input; distribute_saved_activations splits that
  // input over the TP group (Megatron allows it without sequence parallelism).
  const bool distribute = m.distribute_saved_activations && !spec.parallel.sequence_parallel;
  auto checkpoint_input = [&](int i) { return acts[i].input / (distribute ? t : 1); };
  std::vector<Discard> discard(layers);
  for (int i = 0; i < layers; ++i) {
    const int global = chunk.first_layer + i;
    const LayerFlops flops = EstimateLayerFlops(spec, global);
    if (uniform) {
      kept[i] = i % n == 0 ? checkpoint_input(i) : 0;
      est.recompute_flops += flops.Forward();
    } else if (full && i < n) {
      kept[i] = checkpoint_input(i);
      est.recompute_flops += flops.Forward();
    } else {
      discard[i] = SelectiveDiscard(spec, policy, acts[i], global);
      kept[i] = acts[i].Total() - discard[i].Total();
      est.recompute_flops += SelectiveFlops(spec, policy, flops, global);
    }
    est.layer_activation += kept[i];
  }
  // MTP layers: their transformer layer (the last decoder layer's kind) under the policy, where
  // Megatron Core's MTP block checkpoints it under full:uniform and skips recompute under
  // full:block; then their own norms, eh_proj input and head (search/mtp_model.h).
  const OuterActivations outer = EstimateOuter(spec);
  double mtp_inner = 0, mtp_outer = 0, mtp_backward = 0;
  for (int k = 0; k < chunk.mtp_layers; ++k) {
    const int inner = MtpInnerLayer(spec);
    const LayerActivations a = EstimateLayerActivations(spec, inner);
    const LayerWork w = EstimateLayerWork(spec, inner);
    double kept_inner = a.Total();
    double backward = 0;  // its backward's peak above what is held then
    if (uniform) {
      kept_inner = 0;  // inside the MTP layer's checkpoint, which keeps its inputs only
      est.recompute_flops += EstimateLayerFlops(spec, inner).Forward();
      // The checkpoint replays the layer whole, with eh_proj's input (the [s, b, 2h]
      // concatenation) and final_layernorm (its input and output).
      const Dims x = MakeDims(spec);
      backward = a.Total() + 2 * x.e * x.seq_tokens * x.h + outer.final_norm +
                 SelectiveLayerBackward(a, w, Discard{});
    } else {
      // Selective labels act inside the layer as in a decoder layer, each half's region
      // replayed in that half's backward; full:block keeps the layer whole (no discards).
      const Discard d = full ? Discard{} : SelectiveDiscard(spec, policy, a, inner);
      kept_inner -= d.Total();
      if (!full) {
        est.recompute_flops += SelectiveFlops(spec, policy, EstimateLayerFlops(spec, inner), inner);
      }
      backward = SelectiveLayerBackward(a, w, d);
    }
    est.layer_activation += kept_inner;
    est.logits += outer.logits;
    mtp_inner += kept_inner;
    mtp_outer += MtpHeldBytes(spec, outer.final_norm, outer.logits, uniform);
    mtp_backward = std::max(mtp_backward, backward);
  }

  const double embedding = chunk.has_embedding ? outer.embedding : 0;
  const double final_norm = chunk.has_loss ? outer.final_norm : 0;
  if (chunk.has_loss) est.logits += outer.logits;
  est.activation = embedding + est.layer_activation + final_norm +
                   (chunk.has_loss ? outer.logits : 0) + mtp_outer;

  // Walk the backward pass: the loss, then the layers from last to first, each freeing what it
  // held once done. A recomputed region is live again while its layer's backward runs.
  double held = est.activation;
  double peak = held;
  if (chunk.has_loss || chunk.mtp_layers > 0) {
    peak = std::max(peak, held + std::max(outer.logits_work, outer.loss_forward_work));
  }
  held -= (chunk.has_loss ? outer.logits : 0) + final_norm;
  if (chunk.mtp_layers > 0) {  // the MTP layers' backward runs first: their head, then the layer
    // Their heads' backward has freed their logits before the layers' replay.
    const double mtp_logits = chunk.mtp_layers * outer.logits;
    peak = std::max(peak, held - mtp_logits + mtp_backward);
    held -= mtp_inner + mtp_outer;
  }
  // A checkpointed layer re-runs its whole forward at once, then runs its backward as a layer
  // that discarded nothing.
  auto layer_work = [&](int i) { return SelectiveLayerBackward(acts[i], work[i], Discard{}); };
  for (int i = layers - 1; i >= 0; --i) {
    if (uniform) {
      if (i % n != 0) continue;  // handled at the group's first layer
      const int end = std::min(i + n, layers);
      double replay = -kept[i];
      for (int j = i; j < end; ++j) replay += acts[j].Total();
      peak = std::max(peak, held + replay + layer_work(end - 1));
    } else if (full && i < n) {
      peak = std::max(peak, held + acts[i].Total() - kept[i] + layer_work(i));
    } else {
      peak = std::max(peak, held + SelectiveLayerBackward(acts[i], work[i], discard[i]));
    }
    held -= kept[i];
  }
  if (chunk.has_embedding) peak = std::max(peak, held + outer.embedding_work);
  est.backward_peak = peak;
  return est;
}

StageMemory EstimateStage(const SearchSpec& spec, const Policy& policy, int pp_rank) {
  StageMemory st;
  st.stage = pp_rank;
  const ParamCount params = CountParams(spec, pp_rank);
  st.parameters = params.dense + params.expert;
  st.static_bytes = StaticParameterBytes(spec, params) + PersistentBufferBytes(spec, pp_rank);
  std::vector<ChunkEstimate> chunks;
  for (const StageChunk& c : ChunksOf(spec, pp_rank)) {
    chunks.push_back(EstimateChunk(spec, policy, c));
    st.layers += c.num_layers;
    st.microbatch_activation_bytes += chunks.back().activation;
    st.recompute_flops += chunks.back().recompute_flops * spec.NumMicrobatches();
  }
  // The peak comes just before one of the schedule's backwards: everything in flight is held,
  // and the backward's own working set comes on top of its micro-batch.
  double best = -1;
  for (const InFlightState& state : InFlightStates(spec, pp_rank)) {
    double held = 0, layers = 0, logits = 0;
    int in_flight = 0;
    for (size_t c = 0; c < chunks.size(); ++c) {
      held += state.live_per_chunk[c] * chunks[c].activation;
      layers += state.live_per_chunk[c] * chunks[c].layer_activation;
      logits += state.live_per_chunk[c] * chunks[c].logits;
      in_flight += state.live_per_chunk[c];
    }
    const ChunkEstimate& running = chunks[state.backward_chunk];
    const double peak = held - running.activation + running.backward_peak;
    if (peak > best) {
      best = peak;
      st.activation_bytes = held;
      st.layer_activation_bytes = layers;
      st.logits_bytes = logits;
      st.in_flight = in_flight;
    }
  }
  st.transient_bytes = std::max(0.0, best - st.activation_bytes);
  st.peak_bytes = st.static_bytes + st.activation_bytes + st.transient_bytes;
  return st;
}

}  // namespace

MemoryEstimate EstimateMemory(const SearchSpec& spec, const Policy& policy) {
  MemoryEstimate est;
  est.model_flops = ModelFlopsPerStep(spec);
  const int pp = std::max(1, spec.parallel.pipeline_model_parallel_size);
  for (int p = 0; p < pp; ++p) {
    est.stages.push_back(EstimateStage(spec, policy, p));
    if (est.stages[p].peak_bytes > est.stages[est.peak_stage].peak_bytes) est.peak_stage = p;
  }
  const StageMemory& top = est.stages[est.peak_stage];
  est.parameters = top.parameters;
  est.buffer_bytes = PersistentBufferBytes(spec, est.peak_stage);
  est.static_bytes = top.static_bytes;
  est.activation_bytes = top.activation_bytes;
  est.layer_activation_bytes = top.layer_activation_bytes;
  est.logits_bytes = top.logits_bytes;
  est.transient_bytes = top.transient_bytes;
  est.peak_bytes = top.peak_bytes;
  est.recompute_flops = top.recompute_flops;
  est.in_flight = top.in_flight;
  return est;
}

double LabelSavingBytes(const SearchSpec& spec, Label label) {
  const Policy policy = Policy::Selective({label});
  double bytes = 0;
  for (const StageChunk& c : ChunksOf(spec, 0)) {
    for (int i = c.first_layer; i < c.first_layer + c.num_layers; ++i) {
      bytes += SelectiveDiscard(spec, policy, EstimateLayerActivations(spec, i), i).Total();
    }
  }
  return bytes;
}

double LabelRecomputeFlops(const SearchSpec& spec, Label label) {
  const Policy policy = Policy::Selective({label});
  double flops = 0;
  for (const StageChunk& c : ChunksOf(spec, 0)) {
    for (int i = c.first_layer; i < c.first_layer + c.num_layers; ++i) {
      flops += SelectiveFlops(spec, policy, EstimateLayerFlops(spec, i), i);
    }
  }
  return flops * spec.NumMicrobatches();
}

double ModelFlopsPerStep(const SearchSpec& spec) {
  // Megatron-LM's num_floating_point_operations (transformer path), for the micro-batches of one
  // step on one data-parallel replica, divided over the ranks of one replica (TP x CP x PP).
  const ModelSpec& m = spec.model;
  const double h = m.hidden_size, a = m.num_attention_heads, s = m.seq_length;
  const double tokens = s * spec.train.micro_batch_size * spec.NumMicrobatches();
  const double s2 = s * tokens;  // b * s^2
  // MTP layers count as layers of the decoder's last layer's kind, and each adds its norms,
  // eh_proj and a second pass through the output layer (training.py at d98e8a6).
  const double mtp = MtpLayerCount(spec);
  const bool last_moe = m.IsMoe() && m.IsMoeLayer(MtpInnerLayer(spec));
  const double layers = m.num_layers + mtp;
  const double moe_layers = m.NumMoeLayers() + (last_moe ? mtp : 0);
  const double dense_layers = layers - moe_layers;
  const double ffn_exp = m.gated_linear_unit ? 3 : 2;
  const double fwd_bwd = 3, fma = 2;

  double attn_token = 0, core = 0;
  if (m.multi_latent_attention) {
    const double qk = m.qk_head_dim, pe = m.qk_pos_emb_head_dim, vd = m.v_head_dim;
    const double kvl = m.kv_lora_rank;
    const double q_term =
        m.q_lora_rank ? *m.q_lora_rank * (h + a * (qk + pe) + 1) : h * a * (qk + pe);
    attn_token = fwd_bwd * fma * (q_term + kvl * (h + a * (qk + vd) + 1) + h * pe + a * vd * h);
    core = fwd_bwd * fma * (a * (qk + pe) / 2 + a * vd / 2);
  } else {
    const double q = m.EffectiveKvChannels() * a;
    const double kv = 1.0 * m.EffectiveKvChannels() * m.EffectiveQueryGroups();
    attn_token = fwd_bwd * fma * (h * (q + 2 * kv) + q * h);
    core = fwd_bwd * fma * q / 2 * 2;  // causal: half the scores; QK^T and PV
  }
  double ffn_term = m.EffectiveFfnHiddenSize() * ffn_exp * dense_layers;
  if (m.IsMoe()) {
    ffn_term += m.EffectiveMoeFfnHiddenSize() * m.moe_router_topk * ffn_exp * moe_layers;
    if (m.HasSharedExperts()) {
      ffn_term += *m.moe_shared_expert_intermediate_size * ffn_exp * moe_layers;
    }
  }
  const double total = tokens * (fwd_bwd * fma * h * ffn_term + attn_token * layers +
                                 fwd_bwd * fma * h * PaddedVocab(spec) * (1 + mtp) +
                                 MtpFlopsPerToken(spec)) +
                       s2 * core * layers;
  const double ranks = std::max(1, spec.parallel.tensor_model_parallel_size) *
                       std::max(1, spec.parallel.context_parallel_size) *
                       std::max(1, spec.parallel.pipeline_model_parallel_size);
  return total / ranks;
}

std::optional<int> SmallestFittingBlock(const SearchSpec& spec, double budget_bytes) {
  for (int n = 1; n <= MaxChunkLayers(spec); ++n) {
    if (EstimateMemory(spec, Policy::Full(RecomputeMethod::kBlock, n)).peak_bytes <= budget_bytes) {
      return n;
    }
  }
  return std::nullopt;
}

double PaperActivationBytesPerLayer(const SearchSpec& spec) {
  const ModelSpec& m = spec.model;
  const double s = m.seq_length, b = spec.train.micro_batch_size, h = m.hidden_size;
  const double a = m.num_attention_heads;
  const double t = std::max(1, spec.parallel.tensor_model_parallel_size);
  const double attn = 5 * a * s / h;
  if (t == 1) return s * b * h * (34 + attn);
  if (spec.parallel.sequence_parallel) return s * b * h * (34 / t + attn / t);
  return s * b * h * (10 + 24 / t + attn / t);
}

int64_t PaddedVocabSize(const SearchSpec& spec) {
  const int64_t divisor = 128LL * std::max(1, spec.parallel.tensor_model_parallel_size);
  const int64_t v = std::max(0, spec.model.vocab_size);
  return (v + divisor - 1) / divisor * divisor;
}

}  // namespace remat::search

