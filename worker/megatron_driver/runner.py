"""Runs trials with Megatron Core itself: GPTModel on the local layer spec, Megatron's DDP,
optimizer and no-pipelining schedule, the policy applied through TransformerConfig's recompute
settings (the plan from mapping.map_trial). Needs torch with CUDA and Megatron Core on sys.path;
everything that imports them is inside functions, so the rest of the driver imports without them.

Measurement, as the builtin engine's (README "Measurement conventions"): peaks over the whole
trial (model build, optimizer initialisation, every step) from the caching allocator's
max_memory_allocated / max_memory_reserved after reset_peak_memory_stats; each step timed between
two device synchronisations; the memory budget enforced on the device with
torch.cuda.set_per_process_memory_fraction (a policy over it hits an out-of-memory error, status
oom). Static bytes: what stays allocated after the first step (weights, fp32 main gradients,
optimizer state, persistent buffers).
"""

import gc
import time

from . import metrics
from . import shims


def params_dtype(plan):
    import torch  # noqa: PLC0415
    return torch.bfloat16 if plan["train"]["precision"] == "bf16" else torch.float32


def transformer_config(plan, **overrides):
    """Megatron Core's TransformerConfig (MLATransformerConfig for MLA) of a plan: the mapping's
    keyword arguments, `overrides` over them, and the names the mapping leaves to the runner
    (activation, dtype, attention backend) resolved. Its __post_init__ applies Megatron Core's
    own rules (bench/gpu/check_apply_strings.py builds one per policy and recipe with it)."""
    import torch  # noqa: PLC0415
    from megatron.core.transformer.enums import AttnBackend  # noqa: PLC0415
    from megatron.core.transformer.transformer_config import (  # noqa: PLC0415
        MLATransformerConfig,
        TransformerConfig,
    )
    kwargs = dict(plan["config"])
    kwargs.update(overrides)
    kwargs["params_dtype"] = params_dtype(plan)
    kwargs["activation_func"] = {"silu": torch.nn.functional.silu,
                                 "gelu": torch.nn.functional.gelu}[kwargs["activation_func"]]
    kwargs["attention_backend"] = AttnBackend[kwargs["attention_backend"]]
    config_class = (MLATransformerConfig if plan["config_class"] == "MLATransformerConfig"
                    else TransformerConfig)
    return config_class(**kwargs)


class Session:
    """One process's Megatron Core state: torch.distributed (NCCL) and Megatron's parallel
    groups, set up once; then any number of trials, each with a fresh model and optimizer."""

    def __init__(self, parallel, rank, world_size, init_method, collective_timeout_s, log):
        import datetime  # noqa: PLC0415

        import torch  # noqa: PLC0415
        from megatron.core import parallel_state  # noqa: PLC0415

        self.torch = torch
        self.log = log
        self.rank = rank
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device: Megatron Core trials need a GPU")
        torch.cuda.set_device(rank % torch.cuda.device_count())
        if world_size != parallel["world_size"]:
            raise RuntimeError("world size %d does not match the spec's TP x DP = %d"
                               % (world_size, parallel["world_size"]))
        torch.distributed.init_process_group(
            backend="nccl", init_method=init_method, world_size=world_size, rank=rank,
            timeout=datetime.timedelta(seconds=collective_timeout_s))
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=parallel["tp"],
            pipeline_model_parallel_size=1,
            context_parallel_size=1,
            expert_model_parallel_size=parallel["ep"],
            expert_tensor_parallel_size=parallel.get("etp"),
            create_gloo_process_groups=False)
        self.parallel = parallel
        self.applied_shims = set()

    def close(self):
        from megatron.core import parallel_state  # noqa: PLC0415

        parallel_state.destroy_model_parallel()
        if self.torch.distributed.is_initialized():
            self.torch.distributed.destroy_process_group()

    def _shims(self, plan):
        notes = []
        if "te_fp8_stand_in" in plan["shims"] and "te_fp8_stand_in" not in self.applied_shims:
            notes.append(shims.apply_te_fp8_stand_in())
            self.applied_shims.add("te_fp8_stand_in")
        return notes

    def _build(self, plan):
        torch = self.torch
        from megatron.core import tensor_parallel  # noqa: PLC0415
        from megatron.core.distributed import (  # noqa: PLC0415
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.models.gpt import GPTModel  # noqa: PLC0415
        from megatron.core.models.gpt.gpt_layer_specs import (  # noqa: PLC0415
            get_gpt_layer_local_spec,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa
        from megatron.core.transformer.module import Float16Module  # noqa: PLC0415

        notes = []
        train = plan["train"]
        dtype = params_dtype(plan)
        config = transformer_config(plan)

        layer_spec = get_gpt_layer_local_spec(**plan["layer_spec"])
        if "mla_core_attention_channels" in plan["shims"]:
            notes.append(shims.patch_mla_layer_spec(layer_spec))
        if "mla_no_q_norm" in plan["shims"]:
            notes.append(shims.drop_mla_q_norm(layer_spec))

        torch.manual_seed(train["seed"])
        tensor_parallel.model_parallel_cuda_manual_seed(train["seed"])
        model = GPTModel(config=config, transformer_layer_spec=layer_spec, pre_process=True,
                         post_process=True, parallel_output=True, **plan["model"])
        model.cuda(torch.cuda.current_device())
        if config.bf16:
            model = Float16Module(config, model)
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=train.get("grad_reduce_in_fp32", True), overlap_grad_reduce=False,
            use_distributed_optimizer=train["use_distributed_optimizer"])
        model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
        opt_config = OptimizerConfig(
            optimizer="adam", lr=1e-4, weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.95,
            clip_grad=1.0, bf16=config.bf16, params_dtype=dtype,
            use_distributed_optimizer=train["use_distributed_optimizer"])
        optimizer = get_megatron_optimizer(opt_config, [model], use_gloo_process_groups=False)
        from megatron.core import optimizer as mcore_optimizer  # noqa: PLC0415
        if getattr(mcore_optimizer, "USING_PYTORCH_OPTIMIZER", False):
            notes.append(shims.use_fused_torch_adam(optimizer))
        config.finalize_model_grads_func = finalize_model_grads
        config.grad_scale_func = optimizer.scale_loss
        config.no_sync_func = model.no_sync
        return config, model, optimizer, notes

    def _batches(self, plan):
        """One fixed micro-batch per micro-batch slot: tokens drawn from the trial's seed and the
        data-parallel rank (the ranks of one TP group must see the same tokens)."""
        torch = self.torch
        from megatron.core import parallel_state  # noqa: PLC0415

        train = plan["train"]
        gen = torch.Generator(device="cuda")
        gen.manual_seed(train["seed"] + 1000 * parallel_state.get_data_parallel_rank())
        mb, s = train["micro_batch_size"], train["seq_length"]
        out = []
        for _ in range(train["num_microbatches"]):
            tokens = torch.randint(0, train["vocab_size"], (mb, s + 1), device="cuda",
                                   generator=gen)
            out.append({
                "tokens": tokens[:, :-1].contiguous(),
                "labels": tokens[:, 1:].contiguous(),
                "position_ids": torch.arange(s, device="cuda").unsqueeze(0).expand(mb, -1),
                "loss_mask": torch.ones(mb, s, device="cuda", dtype=torch.float32),
            })
        return out

    def _steps(self, plan, rec, setup_start):
        """Builds the model and optimizer and runs the steps, filling `rec`. The model lives in
        this frame only, so it is gone once this returns or raises."""
        torch = self.torch
        from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: PLC0415

        _, model, optimizer, build_notes = self._build(plan)
        for note in build_notes:
            self.log(note)
        batches = self._batches(plan)
        forward_backward = get_forward_backward_func()

        def loss_func(loss_mask, output_tensor):
            loss = torch.sum(output_tensor.float().view(-1) * loss_mask.view(-1))
            loss = loss / loss_mask.sum()
            return loss, {"lm loss": loss.detach()}

        def forward_step(data_iterator, module):
            batch = next(data_iterator)
            out = module(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
            return out, lambda output: loss_func(batch["loss_mask"], output)

        if setup_start is not None:
            rec["setup_s"] = time.monotonic() - setup_start
        steps = plan["run"]["warmup_max_steps"] + plan["run"].get(
            "measure_step_cap", plan["run"]["measure_steps"])
        for i in range(steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.zero_grad_buffer()
            optimizer.zero_grad()
            reduced = forward_backward(
                forward_step_func=forward_step, data_iterator=iter(batches), model=[model],
                num_microbatches=len(batches), seq_length=plan["train"]["seq_length"],
                micro_batch_size=plan["train"]["micro_batch_size"], forward_only=False)
            _, grad_norm, _ = optimizer.step()
            torch.cuda.synchronize()
            rec["step_times"].append(time.perf_counter() - t0)
            if reduced:
                rec["losses"].append(float(sum(r["lm loss"] for r in reduced) / len(reduced)))
            rec["grad_norms"].append(float(grad_norm) if grad_norm is not None else 0.0)
            if i == 0:
                rec["static_bytes"] = torch.cuda.memory_allocated()

    def run(self, plan, setup_start=None):
        """Runs one trial; returns a metrics.rank_entry dict (never raises for an OOM)."""
        torch = self.torch
        from megatron.core import parallel_state  # noqa: PLC0415

        notes = self._shims(plan)
        for note in notes:
            self.log(note)
        # A fresh global memory buffer (the unfused attention's baddbmm input): allocated by this
        # trial's first forward and counted in its peak, as in a process of its own.
        parallel_state.destroy_global_memory_buffer()
        parallel_state._set_global_memory_buffer()  # pylint: disable=protected-access
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        budget = plan["run"]["budget_bytes"]
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total))
        retries0 = torch.cuda.memory_stats().get("num_alloc_retries", 0)
        rec = {"step_times": [], "losses": [], "grad_norms": [], "static_bytes": 0,
               "setup_s": None}
        status, message, failing = "ok", "", 0
        try:
            self._steps(plan, rec, setup_start)
        except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
            # An allocation over the budget is OutOfMemoryError; cuBLAS or NCCL running out of
            # device memory say so in a RuntimeError. Anything else is the caller's failure.
            if not isinstance(exc, torch.cuda.OutOfMemoryError) and \
                    "out of memory" not in str(exc).lower():
                raise
            status, message = "oom", str(exc).splitlines()[0][:400]
            failing = metrics.failing_request_bytes(str(exc))
        gc.collect()  # the model and optimizer lived in _steps' frame only
        stats = torch.cuda.memory_stats()
        entry = metrics.rank_entry(
            self.rank, status=status, message=message,
            peak_allocated_bytes=torch.cuda.max_memory_allocated(),
            peak_reserved_bytes=torch.cuda.max_memory_reserved(),
            step_times_s=rec["step_times"], losses=rec["losses"], grad_norms=rec["grad_norms"],
            static_bytes=rec["static_bytes"],
            alloc_retries=stats.get("num_alloc_retries", 0) - retries0,
            failing_request_bytes=failing, setup_s=rec["setup_s"])
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0)
        return entry

