"""Stand-ins for defects of Megatron Core's local (non-Transformer-Engine) layers, applied by the
driver before it builds a model. Each changes no arithmetic and no tensor that autograd saves; each
is named in the trial's log and in docs/fidelity.md. They live here, never in the builtin engine.

te_fp8_stand_in
    megatron/core/tensor_parallel/random.py: CheckpointWithoutOutput (the `layernorm`, `moe_act`
    and `mla_up_proj` recompute) sets `self.fp8 = fp8 is not None`, which is True for its default
    `fp8=False`, and then calls Transformer Engine's FP8GlobalStateManager,
    activation_recompute_forward and fp8_autocast, names that are bound only when TE imports.
    Without TE the first such recompute fails with a NameError. The stand-in binds those names in
    that module to FP8-off equivalents: FP8 is never enabled, the contexts do nothing.

mla_core_attention_channels
    megatron/core/transformer/multi_latent_attention.py builds its core attention with
    `k_channels=` and `v_channels=` (what TEDotProductAttention takes); the local spec's
    DotProductAttention takes neither, so MLA fails to build. The stand-in is a DotProductAttention
    that accepts them and, since MLA's value head (v_head_dim) differs from config.kv_channels,
    sizes its output view by v_channels; MLA passes its own softmax scale, so nothing else
    depends on k_channels.

fused_torch_adam
    megatron/core/optimizer/__init__.py falls back to torch.optim.AdamW when neither Transformer
    Engine nor Apex imports. Torch's default AdamW step on CUDA is the foreach implementation,
    whose intermediate lists (e.g. the square roots of exp_avg_sq) are about one fp32 copy of the
    parameters at the optimizer step: ~11 GiB on the 2.8-billion-parameter MoE example, a peak
    that TE's and Apex's FusedAdam (what a Megatron job runs) never allocate. The stand-in turns
    each torch Adam/AdamW parameter group to torch's fused kernel (foreach off) before the first
    step: the same update in place, without the temporaries. Not applied when TE or Apex provide
    the optimizer.

Needs torch and Megatron Core (import inside the functions).
"""

import contextlib


def apply_te_fp8_stand_in():
    """Binds the TE names CheckpointWithoutOutput uses, when TE is absent. Returns a note."""
    from megatron.core.tensor_parallel import random as mcore_random  # noqa: PLC0415

    if getattr(mcore_random, "HAVE_TE", False):
        return "te_fp8_stand_in: Transformer Engine present, not needed"

    class FP8GlobalStateManager:  # pylint: disable=too-few-public-methods
        """FP8 off: the only state a run without Transformer Engine can be in."""

        @staticmethod
        def is_fp8_enabled():
            return False

        @staticmethod
        def get_fp8_recipe():
            return None

    def activation_recompute_forward(activation_recompute=False, recompute_phase=False):
        del activation_recompute, recompute_phase
        return contextlib.nullcontext()

    def fp8_autocast(enabled=False, fp8_recipe=None, **kwargs):
        del fp8_recipe, kwargs
        if enabled:
            raise RuntimeError("fp8_autocast stand-in: FP8 needs Transformer Engine")
        return contextlib.nullcontext()

    mcore_random.FP8GlobalStateManager = FP8GlobalStateManager
    mcore_random.activation_recompute_forward = activation_recompute_forward
    mcore_random.fp8_autocast = fp8_autocast
    return "te_fp8_stand_in: TE's FP8 names bound to FP8-off stand-ins in tensor_parallel.random"


def mla_core_attention_class():
    """The DotProductAttention that accepts MLA's k_channels / v_channels."""
    from megatron.core.transformer.dot_product_attention import (  # noqa: PLC0415
        DotProductAttention,
    )

    class MlaDotProductAttention(DotProductAttention):
        """DotProductAttention for MLA: q/k heads of k_channels, v heads of v_channels."""

        def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
            del k_channels  # MLA passes softmax_scale; the scores' head size comes from q and k
            super().__init__(*args, **kwargs)
            if v_channels is not None:
                self.hidden_size_per_partition = (
                    self.num_attention_heads_per_partition * v_channels)

    return MlaDotProductAttention


def patch_mla_layer_spec(layer_spec):
    """Puts the MLA core attention stand-in into a local MLA layer spec. Returns a note."""
    attention = layer_spec.submodules.self_attention.submodules
    attention.core_attention = mla_core_attention_class()
    return ("mla_core_attention_channels: MLA core attention = DotProductAttention taking "
            "k_channels/v_channels")


def drop_mla_q_norm(layer_spec):
    """An MLA layer spec without q compression: its q_layernorm becomes IdentityOp (the local
    spec's qk_layernorm flag builds both norms, and Megatron Core refuses a q norm that no
    q_lora_rank consumes). Returns a note."""
    from megatron.core.transformer.identity_op import IdentityOp  # noqa: PLC0415

    layer_spec.submodules.self_attention.submodules.q_layernorm = IdentityOp
    return "mla_no_q_norm: q_lora_rank null, so no q norm (kv norm kept)"


def use_fused_torch_adam(optimizer):
    """Switches the torch Adam/AdamW optimizers inside Megatron's `optimizer` (a chained or a
    mixed-precision optimizer) to torch's fused step. Call before the first step (the fused step
    keeps its step counters on the device, created at the first step). Returns a note."""
    import torch  # noqa: PLC0415

    found, switched, todo = [], 0, [optimizer]
    while todo:
        o = todo.pop()
        if isinstance(o, torch.optim.Optimizer):
            found.append(o)
            continue
        todo.extend(getattr(o, "chained_optimizers", None) or [])
        inner = getattr(o, "optimizer", None)
        if inner is not None and inner is not o:
            todo.append(inner)
    adams = [o for o in found if isinstance(o, (torch.optim.Adam, torch.optim.AdamW))]
    for o in adams:
        for group in o.param_groups:
            if "fused" in group:
                group["foreach"] = False
                group["fused"] = True
                switched += 1
    return ("fused_torch_adam: %d parameter groups of %d torch Adam optimizers on the fused step"
            "%s" % (switched, len(adams), "" if len(adams) == len(found) else
                    " (%d other optimizers left as they are)" % (len(found) - len(adams))))
