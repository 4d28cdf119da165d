#include "search/fp8_support.h"

namespace remat::search {
namespace {

// Whether every FP8 GEMM of a dense layer has dimensions divisible by 16, as Hopper's FP8 GEMM
// (and Transformer Engine's assertion on FP8 inputs) wants: the tokens of a micro-batch on one
// rank, and each linear's local input and output features.
bool Fp8Aligned(const SearchSpec& spec) {
  const ModelSpec& m = spec.model;
  const int tp = spec.parallel.tensor_model_parallel_size;
  const int cp = spec.parallel.context_parallel_size;
  const int64_t tokens = static_cast<int64_t>(m.seq_length / cp) * spec.train.micro_batch_size;
  const int64_t d = m.EffectiveKvChannels();
  const int64_t ffn = m.EffectiveFfnHiddenSize();
  const int64_t dims[] = {tokens,
                          m.hidden_size,
                          (m.num_attention_heads + 2LL * m.EffectiveQueryGroups()) * d / tp,
                          m.num_attention_heads * d / tp,
                          (m.gated_linear_unit ? 2 : 1) * ffn / tp,
                          ffn / tp};
  for (int64_t v : dims) {
    if (v % 16 != 0) return false;
  }
  return true;
}

}  // namespace

std::string Fp8BuiltinProblem(const SearchSpec& spec) {
  const ModelSpec& m = spec.model;
  if (m.fp8.empty()) return "";
  const std::string tail = "; plan and validate it, or run it with the megatron or command backend";
  if (spec.search.device == Device::kCpu) {
    return "model.fp8: the builtin engine runs FP8 linears only on a CUDA GPU of compute "
           "capability 8.9 or later (search.device is cpu)" +
           tail;
  }
  if (m.transformer_impl != TransformerImpl::kTransformerEngine) {
    return "model.fp8: Megatron's FP8 linears are Transformer Engine's; the builtin engine runs "
           "them with transformer_impl: transformer_engine only" +
           tail;
  }
  if (m.fp8_recipe == "mxfp8") {
    // Transformer Engine: MXFP8 needs compute capability 10.0 (NVIDIA/TransformerEngine
    // transformer_engine/pytorch/quantization.py at d0067d0, _compute_mxfp8_support).
    return "model.fp8_recipe: mxfp8 needs a Blackwell GPU (compute capability 10.0) in "
           "Transformer Engine, and the builtin engine runs tensorwise and delayed only" +
           tail;
  }
  if (m.fp8_recipe == "blockwise" || m.fp8_recipe == "custom") {
    return "model.fp8_recipe: " + m.fp8_recipe +
           " is not run by the builtin engine (it runs tensorwise and delayed)" + tail;
  }
  if (spec.train.fp8_param_gather) {
    return "train.fp8_param_gather: FP8 parameters are not run by the builtin engine (its FP8 "
           "linears keep bf16 weights and an FP8 workspace)" +
           tail;
  }
  if (m.multi_latent_attention) {
    return "model.fp8: FP8 with multi_latent_attention is not run by the builtin engine (MLA's FP8 "
           "projections are not modelled)" +
           tail;
  }
  if (m.IsMoe()) {
    // Each expert's token count would have to be padded to 16 for its FP8 GEMMs (Megatron's
    // moe_router_padding_for_quantization); not implemented.
    return "model.fp8: FP8 with mixture-of-experts layers is not run by the builtin engine (its "
           "experts' token counts are not padded for FP8 GEMMs)" +
           tail;
  }
  if (!Fp8Aligned(spec)) {
    return "model.fp8: FP8 GEMMs need the tokens per micro-batch (seq_length / CP x "
           "micro_batch_size) and every linear's local features divisible by 16" +
           tail;
  }
  if (spec.parallel.sequence_parallel && spec.parallel.tensor_model_parallel_size > 1) {
    return "model.fp8: FP8 with sequence_parallel is not run by the builtin engine yet (the FP8 "
           "input all-gather is not implemented)" +
           tail;
  }
  return "";
}

}  // namespace remat::search
