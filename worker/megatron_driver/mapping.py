"""The remat spec and policy mapped to Megatron Core's settings: pure Python, no torch.

The spec's field names are Megatron Core's already, so most fields pass through; what this module
decides is (1) which settings the driver adds so that Megatron Core runs the model the builtin
engine stands for (local layer spec, the fusions the spec asks for that run without Transformer
Engine, SwiGLU = silu, plain RoPE for MLA, top-k router
without auxiliary loss, the spec's token dispatcher), and (2) what the driver cannot run, refused with
the reason (`Unsupported`), never run as something else.

A spec is the YAML spec's structure as a dict ({"model": {...}, "train": {...}, "parallel":
{...}, "search": {...}}), as the worker writes it (every field resolved) or as a bench writes it.
A field left out takes Megatron Core's own default: derived defaults (ffn_hidden_size = 4 h,
kv_channels = h / heads, num_query_groups = heads, moe_ffn_hidden_size = ffn_hidden_size) are
left to TransformerConfig.__post_init__, so this module holds no copy of those rules.
"""

import json
import os

LABELS = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
          "gdn_norm_out")

# Labels whose Megatron Core implementation is CheckpointWithoutOutput, which refers to
# Transformer Engine's FP8 state even with FP8 off (the driver's shims.te_fp8_stand_in).
OUTPUT_DISCARDING_LABELS = ("layernorm", "moe_act", "mla_up_proj")

# Megatron-LM pads the vocabulary to a multiple of this times TP (make_vocab_size_divisible_by).
VOCAB_MULTIPLE = 128

# Every spec field's Megatron home and default: a copy of remat's one declaration of its fields
# (`remat fields --json`; a test keeps the copy equal to the declaration).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "declared_fields.json")) as f:
    DECLARED_FIELDS = json.load(f)

# TransformerConfig fields the driver sets itself below (the local layer spec's limits, MLA's and
# the MoE layer's groups, the parallel sizes it initialises); every other TransformerConfig field
# the spec sets away from its declared default reaches TransformerConfig under its own name.
DRIVER_SETS = frozenset((
    "transformer_impl", "attention_backend", "masked_softmax_fusion", "apply_rope_fusion",
    "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
    "context_parallel_size", "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage", "multi_latent_attention", "q_lora_rank", "kv_lora_rank",
    "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "num_moe_experts", "moe_router_topk",
    "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_grouped_gemm",
    "moe_layer_freq", "moe_shared_expert_overlap", "expert_tensor_parallel_size"))


def declared_transformer_config(spec):
    """The TransformerConfig keyword arguments the spec sets: each field whose declared home is
    TransformerConfig, not in DRIVER_SETS, whose value is given and differs from its declared
    default (a default is Megatron Core's own, so leaving it out changes nothing)."""
    out = {}
    for path, field in DECLARED_FIELDS.items():
        section, name = path.split(".", 1)
        if field["home"] != "TransformerConfig" or name in DRIVER_SETS:
            continue
        value = spec.get(section, {}).get(name)
        if value is not None and value != field["default"]:
            out[name] = value
    return out


class Unsupported(Exception):
    """A spec feature or policy the driver cannot run; str() names the field and the reason."""


def parse_policy(text):
    """'selective:[a,b]' | 'none' | 'full:uniform:N' | 'full:block:N' -> dict of recompute
    settings (Megatron names). Raises ValueError naming the problem."""
    text = text.strip()
    if text == "none":
        text = "selective:[]"
    if text.startswith("selective:"):
        body = text[len("selective:"):]
        if not (body.startswith("[") and body.endswith("]")):
            raise ValueError("policy: selective needs a bracketed label list: " + text)
        labels = [x.strip() for x in body[1:-1].split(",") if x.strip()]
        for label in labels:
            if label not in LABELS:
                raise ValueError("policy: unknown recompute label '%s'" % label)
        if len(set(labels)) != len(labels):
            raise ValueError("policy: a label is repeated: " + text)
        return {"recompute_granularity": "selective", "recompute_modules": labels,
                "recompute_method": None, "recompute_num_layers": None}
    parts = text.split(":")
    if len(parts) == 3 and parts[0] == "full" and parts[1] in ("uniform", "block"):
        try:
            n = int(parts[2])
        except ValueError:
            raise ValueError("policy: full recompute needs a layer count: " + text) from None
        if n < 1:
            raise ValueError("policy: recompute_num_layers must be at least 1: " + text)
        return {"recompute_granularity": "full", "recompute_modules": None,
                "recompute_method": parts[1], "recompute_num_layers": n}
    raise ValueError("policy: not a policy string: " + text)


def _get(section, key, default=None):
    value = section.get(key, default)
    return default if value is None else value


def padded_vocab_size(vocab_size, tp):
    unit = VOCAB_MULTIPLE * tp
    return ((vocab_size + unit - 1) // unit) * unit


def is_moe_layer(model, i):
    """Layer i (0-based) is MoE, by moe_layer_pattern (a 0/1 list) or moe_layer_freq."""
    if not model.get("num_moe_experts"):
        return False
    pattern = model.get("moe_layer_pattern") or []
    if pattern:
        return i < len(pattern) and pattern[i] == 1
    freq = _get(model, "moe_layer_freq", 1)
    if isinstance(freq, list):
        return i < len(freq) and freq[i] == 1
    return freq > 0 and i % freq == 0


def map_trial(spec, policy_text, have_te=False, have_apex=False):
    """The driver's plan for one trial: a dict with
      config_class  "TransformerConfig" | "MLATransformerConfig"
      config        TransformerConfig keyword arguments (plain values; "activation_func" and
                    "params_dtype" are names the runner resolves: "silu"/"gelu", "bf16"/"fp32")
      layer_spec    get_gpt_layer_local_spec keyword arguments
      model         GPTModel keyword arguments
      train         micro_batch_size, num_microbatches, precision, seed, use_distributed_optimizer
      parallel      tp, pp, cp, ep, dp, world_size
      run           warmup_steps, warmup_max_steps (the run lasts warmup_max_steps +
                    measure_step_cap), measure_steps, measure_step_cap, budget_bytes, proxy
                    (True at a proxy depth)
      shims         the shims.py stand-ins this trial needs
    Raises Unsupported (field: reason) or ValueError (a malformed policy)."""
    model = spec.get("model", {})
    train = spec.get("train", {})
    par = spec.get("parallel", {})
    search = spec.get("search", {})
    recompute = parse_policy(policy_text)

    for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size"):
        if not isinstance(model.get(key), int) or model[key] <= 0:
            raise Unsupported("model.%s: required, a positive integer" % key)

    tp = _get(par, "tensor_model_parallel_size", 1)
    pp = _get(par, "pipeline_model_parallel_size", 1)
    cp = _get(par, "context_parallel_size", 1)
    ep = _get(par, "expert_model_parallel_size", 1)
    dp = _get(par, "data_parallel_size", 1)
    sp = bool(_get(par, "sequence_parallel", False))
    if pp > 1 or (_get(par, "virtual_pipeline_model_parallel_size", 1) or 1) > 1:
        raise Unsupported("parallel.pipeline_model_parallel_size: the megatron backend runs "
                          "Megatron Core's no-pipelining schedule only (PP = 1)")
    if cp > 1:
        raise Unsupported("parallel.context_parallel_size: Megatron Core's local "
                          "DotProductAttention refuses context parallelism (it needs Transformer "
                          "Engine's attention)")
    if sp and not have_apex:
        raise Unsupported("parallel.sequence_parallel: without Apex the local layer spec's norm is "
                          "WrappedTorchNorm (torch's LayerNorm/RMSNorm), which refuses sequence "
                          "parallelism")
    if search.get("device") == "cpu":
        raise Unsupported("search.device: the megatron backend runs on CUDA only")
    if _get(model, "attention_backend", "unfused") != "unfused":
        raise Unsupported("model.attention_backend: the local (non-TE) layer spec has only the "
                          "unfused DotProductAttention; fused/flash attention in Megatron Core "
                          "needs Transformer Engine")
    if model.get("experimental_attention_variant"):
        raise Unsupported("model.experimental_attention_variant: Gated DeltaNet layers are not "
                          "built by the driver")
    if _get(model, "fp8", ""):
        raise Unsupported("model.fp8: the driver builds Megatron Core's local (non-TE) layer spec, "
                          "which has no FP8; refused rather than measured in 16 bits")
    for key, ran in (("transformer_impl", "local"), ("apply_rope_fusion", False),
                     ("masked_softmax_fusion", False)):
        if _get(model, key, ran) != ran:
            raise Unsupported("model.%s: the driver builds Megatron Core's local layer spec without "
                              "Transformer Engine or Apex, which runs %s = %r only"
                              % (key, key, ran))
    # The native cross-entropy fusion is jit-fused torch (Megatron-LM
    # megatron/core/fusions/fused_cross_entropy.py at d98e8a6) and passes through; the te one
    # calls Transformer Engine's parallel cross-entropy.
    if _get(model, "cross_entropy_loss_fusion", False) and not have_te and \
            _get(model, "cross_entropy_fusion_impl", "native") != "native":
        raise Unsupported("model.cross_entropy_fusion_impl: te needs Transformer Engine's parallel "
                          "cross-entropy, which is not installed; native runs without it")
    for key in ("use_precision_aware_optimizer", "use_megatron_fsdp"):
        if _get(train, key, False):
            raise Unsupported("train.%s: needs Transformer Engine's FusedAdam or Megatron-FSDP, "
                              "which the driver does not set up" % key)
    if _get(model, "cuda_graph_impl", "none") != "none":
        raise Unsupported("model.cuda_graph_impl: the driver does not capture CUDA graphs; "
                          "refused rather than measured eagerly")
    if _get(model, "cpu_offloading", False):
        raise Unsupported("model.cpu_offloading: not run by the driver (it conflicts with "
                          "recompute, which is what a trial measures)")
    moe = bool(model.get("num_moe_experts"))
    if moe and _get(model, "moe_grouped_gemm", False):
        raise Unsupported("model.moe_grouped_gemm: Megatron Core's local layer spec builds "
                          "SequentialMLP experts only; its grouped-GEMM experts are Transformer "
                          "Engine's TEGroupedMLP")
    if moe and _get(model, "moe_shared_expert_overlap", False):
        raise Unsupported("model.moe_shared_expert_overlap: needs a token dispatcher overlap the "
                          "driver does not set up")
    if ep > 1 and not moe:
        raise Unsupported("parallel.expert_model_parallel_size: a dense model has no experts")
    if moe and _get(model, "moe_token_dispatcher_type", "allgather") == "flex":
        raise Unsupported("model.moe_token_dispatcher_type: flex needs DeepEP or HybridEP, which "
                          "the driver does not set up")
    # Expert tensor parallelism: null is Megatron's own default (TP); parallel_state builds the
    # expert grid from it.
    etp = par.get("expert_tensor_parallel_size") or None

    labels = recompute["recompute_modules"] or []
    num_layers = model["num_layers"]
    has_dense_layer = any(not is_moe_layer(model, i) for i in range(num_layers))
    if ("mlp" in labels and has_dense_layer and _get(model, "add_bias_linear", True)):
        raise Unsupported(
            "policy: Megatron Core's mlp recompute with linear biases (add_bias_linear) ran out "
            "of memory in its nested checkpoint on the local layer spec (seen on an H200); "
            "refused rather than measured wrong")
    if "gdn_norm_out" in labels:
        raise Unsupported("policy: gdn_norm_out needs a Gated DeltaNet model")
    if recompute["recompute_granularity"] == "full" and \
            recompute["recompute_num_layers"] > num_layers:
        raise Unsupported("policy: recompute_num_layers %d exceeds model.num_layers %d"
                          % (recompute["recompute_num_layers"], num_layers))

    precision = _get(train, "precision", "bf16")
    if precision not in ("bf16", "fp32"):
        raise Unsupported("train.precision: must be bf16 or fp32")
    gated = bool(_get(model, "gated_linear_unit", False))
    mla = bool(_get(model, "multi_latent_attention", False))
    normalization = _get(model, "normalization", "LayerNorm")
    # Absent: MLATransformerConfig's (and remat's) default of 512; null, or the 0 the protobuf
    # JSON the worker writes carries for null: no q compression.
    q_lora_rank = model.get("q_lora_rank", 512) or None

    config = declared_transformer_config(spec)
    config.update({
        # The spec's SwiGLU is GLU with swish; TransformerConfig's default activation is gelu.
        "activation_func": "silu" if gated else "gelu",
        "normalization": normalization,
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": 1,
        "context_parallel_size": 1,
        "expert_model_parallel_size": ep,
        "sequence_parallel": sp,
        "bf16": precision == "bf16",
        "params_dtype": precision,
        "transformer_impl": "local",
        "attention_backend": "local",
        # The spec's jit-fused bias + activation and bias + dropout + add (Megatron Core's own,
        # no Transformer Engine or Apex needed) pass through; the other fusions off, as the local
        # spec runs.
        "masked_softmax_fusion": False,
        "apply_rope_fusion": False,
        "gradient_accumulation_fusion": False,
        "persist_layer_norm": False,
    })
    if mla:
        config.pop("kv_channels", None)
    if etp:
        config["expert_tensor_parallel_size"] = etp
    config.update(recompute)
    if recompute["recompute_granularity"] == "selective":
        config.pop("recompute_method")
        config.pop("recompute_num_layers")
    else:
        config.pop("recompute_modules")

    if mla:
        config.update({
            "multi_latent_attention": True,
            "q_lora_rank": q_lora_rank,
            "kv_lora_rank": _get(model, "kv_lora_rank", 512),
            "qk_head_dim": _get(model, "qk_head_dim", 128),
            "qk_pos_emb_head_dim": _get(model, "qk_pos_emb_head_dim", 64),
            "v_head_dim": _get(model, "v_head_dim", 128),
            "rope_type": "rope",  # the engine's plain RoPE (MLATransformerConfig's default: yarn)
            # DeepSeek's norms of the compressed q and kv, which the engine's MLA has; the local
            # spec builds them only with qk_layernorm (else IdentityOp).
            "qk_layernorm": True,
        })
    if moe:
        freq = model.get("moe_layer_pattern") or _get(model, "moe_layer_freq", 1)
        config.update({
            "num_moe_experts": model["num_moe_experts"],
            "moe_router_topk": _get(model, "moe_router_topk", 2),
            "moe_grouped_gemm": False,
            "moe_layer_freq": freq,
            # The engine's router: top-k then softmax, no auxiliary loss.
            "moe_router_load_balancing_type": "none",
            "moe_aux_loss_coeff": 0.0,
            "moe_permute_fusion": False,
            "moe_shared_expert_overlap": False,
        })
        if model.get("moe_ffn_hidden_size") is not None:
            config["moe_ffn_hidden_size"] = model["moe_ffn_hidden_size"]
        if model.get("moe_shared_expert_intermediate_size"):
            config["moe_shared_expert_intermediate_size"] = \
                model["moe_shared_expert_intermediate_size"]

    position = _get(model, "position_embedding_type", "learned_absolute")
    shims = []
    if not have_te and any(label in OUTPUT_DISCARDING_LABELS for label in labels):
        shims.append("te_fp8_stand_in")
    if mla:
        shims.append("mla_core_attention_channels")
        if q_lora_rank is None:
            # Without q compression there is no compressed q to normalise, and Megatron Core
            # refuses a q_layernorm it would not use; the local spec has one flag for both norms.
            shims.append("mla_no_q_norm")

    mb = _get(train, "micro_batch_size", 1)
    gbs = train.get("global_batch_size") or mb * dp
    if gbs % (mb * dp) != 0:
        raise Unsupported("train.global_batch_size: must be a multiple of micro_batch_size x "
                          "data_parallel_size")
    budget_gib = float(_get(search, "memory_budget_gib", 80))
    seed = train.get("seed", 1234)
    return {
        "config_class": "MLATransformerConfig" if mla else "TransformerConfig",
        "config": config,
        "layer_spec": {
            "num_experts": model["num_moe_experts"] if moe else None,
            "moe_grouped_gemm": False,
            "multi_latent_attention": mla,
            "qk_layernorm": mla,
            "normalization": normalization,
        },
        "model": {
            "vocab_size": padded_vocab_size(model["vocab_size"], tp),
            "max_sequence_length": model["seq_length"],
            "position_embedding_type": position,
            "share_embeddings_and_output_weights":
                bool(_get(model, "share_embeddings_and_output_weights", False)),
        },
        "train": {
            "micro_batch_size": mb,
            "num_microbatches": gbs // (mb * dp),
            "seq_length": model["seq_length"],
            "vocab_size": model["vocab_size"],
            "precision": precision,
            "seed": int(seed),
            "use_distributed_optimizer": bool(_get(train, "use_distributed_optimizer", False)),
            "grad_reduce_in_fp32": bool(_get(train, "grad_reduce_in_fp32", True)),
        },
        "parallel": {"tp": tp, "pp": 1, "cp": 1, "ep": ep, "etp": etp, "dp": dp,
                     "world_size": tp * dp},
        "run": {
            "warmup_steps": int(_get(search, "warmup_steps", 2)),
            # The worker finds where the warm-up ended with the steady-state rule
            # (search/steady_state.h) on the reported step times, so the run lasts for the
            # longest warm-up the rule allows, as the command backend's does.
            "warmup_max_steps": max(int(_get(search, "warmup_steps", 2)),
                                    int(_get(search, "warmup_max_steps", 8))),
            "measure_steps": int(_get(search, "measure_steps", 5)),
            # The most steps the worker's adaptive measurement may take (search/noise.h's
            # MeasureStepCap): the run lasts for them, the worker picks the steps it needs.
            "measure_step_cap": measure_step_cap(search),
            "budget_bytes": int(budget_gib * (1 << 30)),
        },
        "shims": shims,
    }


def measure_step_cap(search):
    """search/noise.h's MeasureStepCap: measure_steps when noise_target is 0, else the larger of
    measure_steps and max_measure_steps."""
    measure = int(_get(search, "measure_steps", 5))
    if float(_get(search, "noise_target", 0.02)) == 0:
        return measure
    return max(measure, int(_get(search, "max_measure_steps", 20)))


def megatron_settings_line(plan):
    """The recompute settings as Megatron names, for logs: 'recompute_granularity=selective
    recompute_modules=[core_attn]'."""
    c = plan["config"]
    if c["recompute_granularity"] == "selective":
        return "recompute_granularity=selective recompute_modules=[%s]" % ",".join(
            c["recompute_modules"])
    return "recompute_granularity=full recompute_method=%s recompute_num_layers=%d" % (
        c["recompute_method"], c["recompute_num_layers"])
