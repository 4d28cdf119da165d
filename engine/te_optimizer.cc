#include "engine/te_optimizer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace remat::engine {
namespace {

at::ScalarType TorchType(search::DType d) {
  switch (d) {
    case search::DType::kFp32: return at::kFloat;
    case search::DType::kBf16: return at::kBFloat16;
    case search::DType::kFp16: return at::kHalf;
    case search::DType::kFp8: break;
  }
  throw std::invalid_argument("fp8 optimizer state is not run by the builtin engine");
}

// Elements per chunk of the non-fp32 update: a fused Adam updates in registers, with no
// temporaries; the chunks' temporaries (about 50 bytes per element) stay far below the
// activations this way (CPU: 200 KiB; a GPU: 200 MiB, in fewer, larger launches).
int64_t ChunkElements(const at::Tensor& t) { return t.is_cuda() ? (int64_t{1} << 22) : 4096; }
constexpr int64_t kTwo16 = 65536;
constexpr int64_t kTwo31 = 2147483648LL;
constexpr int64_t kTwo32 = 4294967296LL;

// A chunk of `t` as fp32: the chunk itself when `t` is fp32 (updated in place), else a copy.
at::Tensor AsFloat(const at::Tensor& t) { return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat); }

// Writes `value` back into `storage` unless it already is the storage.
void WriteBack(at::Tensor& storage, const at::Tensor& value) {
  if (!value.is_same(storage)) storage.copy_(value);
}

}  // namespace

at::ScalarType OptimizerDTypes::MasterStorage() const {
  switch (master) {
    case MasterWeights::kRemainder: return at::kShort;
    case MasterWeights::kFp16: return at::kHalf;
    case MasterWeights::kNone:
    case MasterWeights::kFp32: break;
  }
  return at::kFloat;
}

uint64_t OptimizerDTypes::StaticBytes(int64_t numel, int64_t state_numel) const {
  const uint64_t per_element = c10::elementSize(param) + c10::elementSize(grad);
  uint64_t per_state = c10::elementSize(exp_avg) + c10::elementSize(exp_avg_sq);
  if (master != MasterWeights::kNone) per_state += c10::elementSize(MasterStorage());
  return static_cast<uint64_t>(numel) * per_element + static_cast<uint64_t>(state_numel) * per_state;
}

OptimizerDTypes OptimizerDTypesOf(const search::SearchSpec& spec) {
  const search::TrainSpec& t = spec.train;
  OptimizerDTypes d;
  if (t.precision == search::Precision::kFp32) return d;  // fp32 throughout (as the memory model)
  d.param = at::kBFloat16;
  d.grad = t.grad_reduce_in_fp32 ? at::kFloat : at::kBFloat16;
  d.master = MasterWeights::kFp32;
  if (t.use_precision_aware_optimizer) {
    d.precision_aware = true;
    d.master = t.main_params_dtype == search::DType::kFp16 ? MasterWeights::kFp16
                                                           : MasterWeights::kRemainder;
    d.exp_avg = TorchType(t.exp_avg_dtype);
    d.exp_avg_sq = TorchType(t.exp_avg_sq_dtype);
  }
  return d;
}

at::Tensor MasterFromRemainder(const at::Tensor& param, const at::Tensor& remainder) {
  at::Tensor hi = param.contiguous().view(at::kShort).to(at::kLong).remainder(kTwo16);
  at::Tensor bits = (hi * kTwo16 + remainder.to(at::kLong)).remainder(kTwo32);
  bits = bits - (bits >= kTwo31).to(at::kLong) * kTwo32;
  return bits.to(at::kInt).view(at::kFloat);
}

void SplitMaster(const at::Tensor& master, at::Tensor param, at::Tensor remainder) {
  at::Tensor bits = master.contiguous().view(at::kInt).to(at::kLong).remainder(kTwo32);
  // Adding half a unit of the low 16 bits to the pattern rounds the magnitude to nearest (ties
  // away from zero) for either sign; the remainder is then within int16.
  at::Tensor hi = at::div(bits + kTwo16 / 2, kTwo16, "floor").remainder(kTwo16);
  at::Tensor rem = bits - hi * kTwo16;
  rem = rem - (rem >= kTwo31).to(at::kLong) * kTwo32;  // only a wrapped carry (NaN patterns)
  param.view(at::kShort).copy_((hi - (hi >= kTwo16 / 2).to(at::kLong) * kTwo16).to(at::kShort));
  remainder.copy_(rem.to(at::kShort));
}

void InitMasterWeights(const OptimizerDTypes& types, const at::Tensor& param, at::Tensor& master) {
  switch (types.master) {
    case MasterWeights::kNone: return;
    case MasterWeights::kRemainder: master.zero_(); return;  // master == the bf16 value exactly
    case MasterWeights::kFp32:
    case MasterWeights::kFp16: master.copy_(param); return;
  }
}

void AdamUpdate(const OptimizerDTypes& types, const AdamHyper& h, at::Tensor grad,
                const at::Tensor& coef, at::Tensor param, at::Tensor master, at::Tensor exp_avg,
                at::Tensor exp_avg_sq) {
  const double bc1 = 1.0 - std::pow(h.beta1, h.step);
  const double bc2 = 1.0 - std::pow(h.beta2, h.step);
  const bool fp32_master = types.master == MasterWeights::kNone || types.master == MasterWeights::kFp32;
  const bool in_place = grad.scalar_type() == at::kFloat && fp32_master &&
                        exp_avg.scalar_type() == at::kFloat && exp_avg_sq.scalar_type() == at::kFloat;
  const int64_t n = grad.numel();
  const int64_t step = in_place ? std::max<int64_t>(n, 1) : ChunkElements(grad);
  for (int64_t lo = 0; lo < n; lo += step) {
    const int64_t len = std::min(step, n - lo);
    at::Tensor p = param.narrow(0, lo, len);
    at::Tensor g = AsFloat(grad.narrow(0, lo, len));
    at::Tensor m_store = exp_avg.narrow(0, lo, len), v_store = exp_avg_sq.narrow(0, lo, len);
    at::Tensor m = AsFloat(m_store), v = AsFloat(v_store);
    at::Tensor w_store = types.master == MasterWeights::kNone ? p : master.narrow(0, lo, len);
    at::Tensor w = types.master == MasterWeights::kRemainder ? MasterFromRemainder(p, w_store)
                                                              : AsFloat(w_store);
    g.mul_(coef);
    w.mul_(1.0 - h.lr * h.weight_decay);
    m.mul_(h.beta1).add_(g, 1.0 - h.beta1);
    v.mul_(h.beta2).addcmul_(g, g, 1.0 - h.beta2);
    g.copy_(v).sqrt_().div_(std::sqrt(bc2)).add_(h.eps);  // the spent gradient: the denominator
    w.addcdiv_(m, g, -h.lr / bc1);
    WriteBack(m_store, m);
    WriteBack(v_store, v);
    if (types.master == MasterWeights::kRemainder) {
      SplitMaster(w, p, w_store);
    } else {
      WriteBack(w_store, w);
      if (types.master != MasterWeights::kNone) p.copy_(w);
    }
  }
}

}  // namespace remat::engine
