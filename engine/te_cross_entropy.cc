#include "engine/te_cross_entropy.h"

#include <torch/csrc/autograd/custom_function.h>

namespace remat::engine {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

struct TeCrossEntropyFunction : public torch::autograd::Function<TeCrossEntropyFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target, int64_t vocab_start, int64_t rt_addr) {
    const auto* rt = reinterpret_cast<const Runtime*>(rt_addr);
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    // TE's grad_input: an fp32 buffer the kernel fills from the (bf16) logits.
    at::Tensor grad = logits.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    VocabParallelSoftmax s = SoftmaxInPlace(*rt, grad, target, vocab_start);
    // d loss / d logits = softmax - one_hot(target), computed now: the targets are not kept.
    at::Tensor inside = s.outside.logical_not().to(at::kFloat).unsqueeze(-1);
    grad.scatter_add_(-1, s.local.unsqueeze(-1), inside.neg());
    ctx->save_for_backward({grad});
    return s.loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor grad = ctx->get_saved_variables()[0];
    grad.mul_(grads[0].unsqueeze(-1));  // in place, as TE's element_mul kernel
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor TeVocabParallelCrossEntropy(const Runtime& rt, const at::Tensor& logits,
                                       const at::Tensor& target, int64_t vocab_start) {
  return TeCrossEntropyFunction::apply(logits, target, vocab_start,
                                       reinterpret_cast<int64_t>(&rt));
}

}  // namespace remat::engine
