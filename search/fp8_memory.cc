#include "search/fp8_memory.h"

namespace remat::search {
namespace {

// Scale bytes per element of one FP8 copy.
double ScaleBytes(const std::string& recipe) {
  if (recipe == "mxfp8") return 1.0 / 32;         // E8M0 per 32 elements (mxfp8_tensor.py)
  if (recipe == "blockwise") return 4.0 / 128;    // fp32 per 1 x 128 block of an activation
  return 0;                                       // delayed, tensorwise: one fp32 per tensor
}

// Scale bytes per element of one FP8 weight copy: blockwise weights use 128 x 128 blocks.
double WeightScaleBytes(const std::string& recipe) {
  if (recipe == "blockwise") return 4.0 / (128 * 128);
  return ScaleBytes(recipe);
}

}  // namespace

bool Fp8On(const ModelSpec& m) { return !m.fp8.empty(); }

double Fp8SavedBytesPerElement(const ModelSpec& m) { return 1 + ScaleBytes(m.fp8_recipe); }

double Fp8ExtraBytesPerLinearWeight(const SearchSpec& spec) {
  if (!Fp8On(spec.model)) return 0;
  const double copy = 1 + WeightScaleBytes(spec.model.fp8_recipe);  // one FP8 copy of a weight
  const double bf16_weight = 2;
  if (spec.train.fp8_param_gather) return (copy - bf16_weight) + copy;  // FP8 weight + transpose
  return 2 * copy;  // workspace: rowwise data + columnwise transpose, beside the bf16 weight
}

}  // namespace remat::search
