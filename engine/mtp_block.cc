#include "engine/mtp_block.h"

#include <torch/csrc/autograd/custom_function.h>

namespace remat::engine {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// roll_tensor(shifts=-1, dims=-1): one position left along the sequence, the last one zeroed.
at::Tensor RollLeft(const at::Tensor& t) {
  at::Tensor rolled = t.roll(-1, -1);
  rolled.select(-1, t.size(-1) - 1).fill_(0);
  return rolled;
}

struct MtpLossScaler : public torch::autograd::Function<MtpLossScaler> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& main, const at::Tensor&) {
    return main.clone();
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], grads[0]};
  }
};

}  // namespace

MtpOutput MtpLoss(const Runtime& rt, const search::SearchSpec&,
                  const std::vector<ModelParams::MtpParams>& layers, bool checkpoint_whole,
                  const MtpHooks& hooks, const at::Tensor& decoder_hidden,
                  const at::Tensor& tokens, const at::Tensor& labels) {
  const bool sp = rt.sequence_parallel;
  at::Tensor ids = tokens;
  std::vector<at::Tensor> hiddens = {decoder_hidden};
  for (const ModelParams::MtpParams& p : layers) {
    ids = RollLeft(ids);
    at::Tensor embedding = hooks.embed(ids);
    // Regions may be replayed in backward, after this frame is gone: capture values only.
    const ModelParams::MtpParams mp = p;
    const MtpHooks h = hooks;
    const Runtime* runtime = &rt;
    Region layer = [mp, h, runtime, sp](const std::vector<at::Tensor>& in) {
      at::Tensor e = h.norm(in[1], mp.enorm_w, mp.enorm_b);
      at::Tensor x = h.norm(in[0], mp.hnorm_w, mp.hnorm_b);
      x = at::cat({e, x}, -1);
      x = Linear(*runtime, x, h.param(mp.eh_proj), at::Tensor(), LinearMode::kColumn);
      x = GatherFromTensorParallel(*runtime, x);
      if (sp) x = ScatterToSequenceParallel(*runtime, x);
      x = h.layer(mp.layer, x);
      return std::vector<at::Tensor>{h.norm(x, mp.final_w, mp.final_b)};
    };
    const at::Tensor& previous = hiddens.back();
    hiddens.push_back(checkpoint_whole ? Checkpoint(rt, layer, {previous, embedding}).at(0)
                                       : layer({previous, embedding}).at(0));
  }
  // The block hands on the decoder's and every depth's hidden states concatenated along the
  // sequence, and process_mtp_loss chunks them again: every head reads a view of that one copy.
  std::vector<at::Tensor> heads = at::cat(hiddens, 0).chunk(static_cast<int64_t>(hiddens.size()), 0);
  at::Tensor mtp_labels = labels;
  at::Tensor mask = at::ones(labels.sizes(), labels.options().dtype(at::kFloat));
  at::Tensor total;
  for (size_t k = 1; k < heads.size(); ++k) {
    mtp_labels = RollLeft(mtp_labels);
    mask = RollLeft(mask);
    at::Tensor losses = hooks.head_loss(heads[k], mtp_labels.transpose(0, 1).contiguous());
    at::Tensor loss = (losses * mask.transpose(0, 1)).sum() / mask.sum().clamp_min(1);
    total = total.defined() ? total + loss : loss;
  }
  const double scale = kMtpLossScalingFactor / static_cast<double>(layers.size());
  return {heads[0], total * scale};
}

at::Tensor AddMtpLoss(const at::Tensor& main, const at::Tensor& mtp) {
  return MtpLossScaler::apply(main, mtp);
}

}  // namespace remat::engine
