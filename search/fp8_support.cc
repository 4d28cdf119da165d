#include "search/fp8_support.h"

namespace remat::search {

std::string Fp8BuiltinProblem(const SearchSpec& spec) {
  const ModelSpec& m = spec.model;
  if (m.fp8.empty()) return "";
  const std::string tail = "; plan and validate it, or run it with the megatron or command backend";
  if (spec.search.device == Device::kCpu) {
    return "model.fp8: the builtin engine runs FP8 linears only on a CUDA GPU of compute "
           "capability 8.9 or later (search.device is cpu)" + tail;
  }
  if (m.transformer_impl != TransformerImpl::kTransformerEngine) {
    return "model.fp8: Megatron's FP8 linears are Transformer Engine's; the builtin engine runs "
           "them with transformer_impl: transformer_engine only" + tail;
  }
  if (m.fp8_recipe == "mxfp8") {
    // Transformer Engine: MXFP8 needs compute capability 10.0 (NVIDIA/TransformerEngine
    // transformer_engine/pytorch/quantization.py at d0067d0, _compute_mxfp8_support).
    return "model.fp8_recipe: mxfp8 needs a Blackwell GPU (compute capability 10.0) in "
           "Transformer Engine, and the builtin engine runs tensorwise and delayed only" + tail;
  }
  if (m.fp8_recipe == "blockwise" || m.fp8_recipe == "custom") {
    return "model.fp8_recipe: " + m.fp8_recipe +
           " is not run by the builtin engine (it runs tensorwise and delayed)" + tail;
  }
  if (spec.train.fp8_param_gather) {
    return "train.fp8_param_gather: FP8 parameters are not run by the builtin engine (its FP8 "
           "linears keep bf16 weights and an FP8 workspace)" + tail;
  }
  if (m.multi_latent_attention) {
    return "model.fp8: FP8 with multi_latent_attention is not run by the builtin engine (MLA's FP8 "
           "projections are not modelled)" + tail;
  }
  if (m.IsMoe() && m.moe_grouped_gemm) {
    return "model.fp8: FP8 grouped-GEMM experts are not run by the builtin engine (sequential "
           "experts are: moe_grouped_gemm false)" + tail;
  }
  if (spec.parallel.sequence_parallel && spec.parallel.tensor_model_parallel_size > 1) {
    return "model.fp8: FP8 with sequence_parallel is not run by the builtin engine yet (the FP8 "
           "input all-gather is not implemented)" + tail;
  }
  return "";
}

}  // namespace remat::search
