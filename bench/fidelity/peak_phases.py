#!/usr/bin/env python3
"""Where Megatron Core's allocated peak is, phase by phase, for one fidelity family and policy.

The fidelity bench compares each policy's change of the allocated peak against the control; when
the control's peak sits at a different point of the step than the policy's (the loss against a
layer's backward), a difference in that one transient reads as a miss under every label. This
probe runs the family's model through the megatron driver's own Session (worker/megatron_driver/
runner.py: the same build, batches and steps as the bench) and splits each step's peak into
segments, resetting the allocator's peak at each boundary:

  forward    step start (zero_grad) -> entry of the loss (compute_language_model_loss)
  loss_fwd   the cross-entropy's forward (native fused or unfused, as the spec says)
  loss_bwd   end of the loss's forward -> the gradient of the logits (the cross-entropy's backward
             and the schedule's own loss arithmetic)
  head_bwd   the logits' gradient -> the last layer output's gradient (output layer, final norm)
  layerN_bwd the gradient of layer N's output -> that of layer N-1's (layer 0: -> optimizer.step)
  optimizer  optimizer.step

Each segment: the allocated bytes at its start and its peak (MiB). One JSON line per step on
stdout and a table of the last step. One policy per process: Megatron Core's MoE layers leave
memory behind when a process runs several (bench/fidelity/megatron_side.py).

  peak_phases.py --megatron DIR --family moe-seq-fused --policy 'selective:[]' [--steps 2]

With --cross-entropy it measures the loss alone instead: Megatron Core's native fused
cross-entropy (megatron/core/fusions/fused_cross_entropy.py, torch.compile'd) against its unfused
vocab_parallel_cross_entropy (megatron/core/tensor_parallel/cross_entropy.py) on the family's
bf16 logits [s, 1, V]: the allocated bytes each adds above the logits in its forward and its
backward (peak) and what it holds between them (the softmax), three runs each (the first compiles).
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "worker"))

import fidelity  # noqa: E402
from megatron_side import _free_port  # noqa: E402

MIB = 2 ** 20


def live_at_peak(trace, top=16):
    """From a CUDA caching-allocator trace (torch.cuda.memory._snapshot()'s device trace: events
    with action, addr, size, frames), the allocations made in the trace that are live when their
    total is highest: (peak bytes, [(bytes, count, where)] largest first). `where` is the
    innermost frame outside torch (file:line function) and the blocks' size."""
    live, total, best, best_i = {}, 0, 0, -1
    for i, ev in enumerate(trace):
        if ev.get("action") == "alloc":
            live[ev["addr"]] = ev["size"]
            total += ev["size"]
            if total > best:
                best, best_i = total, i
        elif ev.get("action") in ("free_requested", "free_completed") and ev["addr"] in live:
            total -= live.pop(ev["addr"])
    held = {}
    for ev in trace[:best_i + 1]:
        if ev.get("action") == "alloc":
            held[ev["addr"]] = ev
        elif ev.get("action") in ("free_requested", "free_completed"):
            held.pop(ev["addr"], None)
    # By frame and block size: the autograd engine's allocations have no Python frames, so the
    # size tells them apart (e.g. a [s, V] logits-sized buffer).
    groups = {}
    for ev in held.values():
        key = "%s [%.2f MiB each]" % (_where(ev.get("frames") or []), ev["size"] / MIB)
        size, count = groups.get(key, (0, 0))
        groups[key] = (size + ev["size"], count + 1)
    rows = sorted(((b, c, k) for k, (b, c) in groups.items()), reverse=True)
    return best, rows[:top]


def _where(frames):
    for f in frames:
        name = f.get("filename", "")
        if "/torch/" not in name and "<" not in name:
            return "%s:%s %s" % ("/".join(name.split("/")[-3:]), f.get("line"), f.get("name"))
    return "(torch) " + (frames[0].get("name", "?") if frames else "?")


class Recorder:
    """Closes a segment at each boundary: its start's allocated bytes and its peak. With
    `history_step`, records the allocator's history over that step (what is live at its peak)."""

    def __init__(self, torch, history_step=-1):
        self.torch = torch
        self.steps = []
        self.segments = None
        self.name = None
        self.start = 0
        self.layer_seen = set()
        self.history_step = history_step
        self.history = None

    def begin_step(self):
        self.segments = []
        self.layer_seen = set()
        if len(self.steps) == self.history_step:
            self.torch.cuda.memory._record_memory_history(  # pylint: disable=protected-access
                max_entries=500000, stacks="python")
        self._open("forward")

    def boundary(self, next_name):
        """Ends the open segment and opens `next_name` (None: the step is done)."""
        torch = self.torch
        if self.segments is None:
            return
        self.segments.append({"segment": self.name, "start_mib": self.start / MIB,
                              "peak_mib": torch.cuda.max_memory_allocated() / MIB})
        if next_name is None:
            if len(self.steps) == self.history_step:
                mem = torch.cuda.memory
                snap = mem._snapshot()  # pylint: disable=protected-access
                mem._record_memory_history(enabled=None)  # pylint: disable=protected-access
                traces = snap.get("device_traces") or [[]]
                self.history = live_at_peak(traces[torch.cuda.current_device()])
            self.steps.append(self.segments)
            self.segments = None
            return
        self._open(next_name)

    def _open(self, name):
        torch = self.torch
        self.name = name
        self.start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()


def instrument(session_cls, rec, torch):
    """A Session whose builds hook the loss, the layers' outputs and the optimizer step."""
    from megatron.core.models.common.language_module.language_module import (  # noqa: PLC0415
        LanguageModule,
    )
    from megatron.core.transformer.transformer_layer import TransformerLayer  # noqa: PLC0415

    original_loss = LanguageModule.compute_language_model_loss

    def loss(self, labels, logits):
        rec.boundary("loss_fwd")
        if logits.requires_grad:
            logits.register_hook(lambda g: rec.boundary("head_bwd"))
        out = original_loss(self, labels, logits)
        rec.boundary("loss_bwd")
        return out

    LanguageModule.compute_language_model_loss = loss

    class Probed(session_cls):
        def _build(self, plan):
            config, model, optimizer, notes = super()._build(plan)
            layers = [m for m in model.modules() if isinstance(m, TransformerLayer)]
            for i, layer in enumerate(layers):
                layer.register_forward_hook(_layer_hook(rec, i, len(layers)))
            original_step = optimizer.step
            original_zero = optimizer.zero_grad

            def step(*args, **kwargs):
                rec.boundary("optimizer")
                out = original_step(*args, **kwargs)
                rec.boundary(None)
                return out

            def zero_grad(*args, **kwargs):
                out = original_zero(*args, **kwargs)
                rec.begin_step()
                return out

            optimizer.step = step
            optimizer.zero_grad = zero_grad
            return config, model, optimizer, notes

    return Probed


def _layer_hook(rec, index, count):
    def hook(_module, _inputs, output):
        # The first call of a step is the layer's forward; a recompute calls it again.
        if rec.segments is None or index in rec.layer_seen:
            return
        rec.layer_seen.add(index)
        hidden = output[0] if isinstance(output, tuple) else output
        if hidden.requires_grad:
            nxt = "layer%d_bwd" % index
            hidden.register_hook(lambda g: rec.boundary(nxt))
    del count
    return hook


def cross_entropy(session, spec, torch):
    """The loss alone, fused native against unfused (see the module comment)."""
    from megatron.core import parallel_state, tensor_parallel  # noqa: PLC0415
    from megatron.core.fusions.fused_cross_entropy import (  # noqa: PLC0415
        fused_vocab_parallel_cross_entropy,
    )

    del session
    tp = parallel_state.get_tensor_model_parallel_group()
    s, v = spec["model"]["seq_length"], spec["model"]["vocab_size"]
    impls = {
        "native-fused": lambda x, t: fused_vocab_parallel_cross_entropy(x, t, tp),
        "unfused": lambda x, t: tensor_parallel.vocab_parallel_cross_entropy(x, t, tp_group=tp),
    }
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    target = torch.randint(0, v, (s, 1), device="cuda", generator=gen)
    for run in range(3):
        for name, fn in impls.items():
            base_x = torch.randn(s, 1, v, device="cuda", dtype=torch.bfloat16, generator=gen)
            x = base_x.clone().requires_grad_(True)
            # The logits as the model has them: a non-leaf, so no .grad is kept.
            logits = x * 1
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            loss = fn(logits, target)
            torch.cuda.synchronize()
            fwd_peak = torch.cuda.max_memory_allocated() - base
            held = torch.cuda.memory_allocated() - base
            del logits
            held_after_free = torch.cuda.memory_allocated() - base
            torch.cuda.reset_peak_memory_stats()
            grads = torch.autograd.grad(loss.sum(), x)
            torch.cuda.synchronize()
            bwd_peak = torch.cuda.max_memory_allocated() - base
            print(json.dumps({"cross_entropy": name, "run": run, "fwd_peak_mib": fwd_peak / MIB,
                              "held_mib": held / MIB, "held_without_logits_mib":
                              held_after_free / MIB, "bwd_peak_mib": bwd_peak / MIB,
                              "logits_mib": s * v * 2 / MIB}))
            print("# %-12s run %d: forward +%.0f MiB, holds %.0f (%.0f without the bf16 logits), "
                  "backward peak +%.0f MiB (over the same base)" % (
                      name, run, fwd_peak / MIB, held / MIB, held_after_free / MIB,
                      bwd_peak / MIB), flush=True)
            del loss, grads, x, base_x
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--megatron", required=True)
    p.add_argument("--family", default="moe-seq-fused")
    p.add_argument("--policy", default="selective:[]")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--layers", type=int, default=0)
    p.add_argument("--cross-entropy", action="store_true")
    p.add_argument("--live-at-peak", action="store_true",
                   help="record the last step's allocations: what is live at its peak, by frame")
    a = p.parse_args()
    sys.path.insert(0, a.megatron)
    import torch  # noqa: PLC0415
    from megatron_driver import mapping, runner  # noqa: PLC0415

    spec = fidelity.spec_of(a.family)
    if a.layers:
        spec["model"]["num_layers"] = a.layers
    spec["search"]["warmup_steps"] = spec["search"]["warmup_max_steps"] = 1
    spec["search"]["measure_steps"] = max(1, a.steps - 1)
    spec["search"]["noise_target"] = 0  # exactly --steps steps (no extra steps for noise)
    plan = mapping.map_trial(spec, a.policy, have_te=False, have_apex=False)
    if a.cross_entropy:
        session = runner.Session(plan["parallel"], 0, 1, "tcp://127.0.0.1:%d" % _free_port(),
                                 300, lambda m: print("#", m, file=sys.stderr))
        rc = cross_entropy(session, spec, torch)
        session.close()
        return rc
    rec = Recorder(torch, a.steps - 1 if a.live_at_peak else -1)
    session_cls = instrument(runner.Session, rec, torch)
    session = session_cls(plan["parallel"], 0, 1, "tcp://127.0.0.1:%d" % _free_port(), 300,
                          lambda m: print("#", m, file=sys.stderr))
    entry = session.run(plan)
    session.close()
    for i, segs in enumerate(rec.steps):
        print(json.dumps({"family": a.family, "policy": a.policy, "step": i,
                          "status": entry.get("status"), "segments": segs}))
    if not rec.steps:
        print("# no step completed: %s %s" % (entry.get("status"), entry.get("message")))
        return 1
    last = rec.steps[-1]
    top = max(last, key=lambda s: s["peak_mib"])
    print("# %s %s, last step: peak %.0f MiB in %s" % (a.family, a.policy, top["peak_mib"],
                                                        top["segment"]))
    for s in last:
        print("#   %-12s start %9.1f  peak %9.1f  (+%.1f)" % (
            s["segment"], s["start_mib"], s["peak_mib"], s["peak_mib"] - s["start_mib"]))
    if rec.history is not None:
        best, rows = rec.history
        print("# live at the last step's peak, allocated during the step: %.1f MiB" % (best / MIB))
        for size, count, where in rows:
            print("#   %9.1f MiB %5d x  %s" % (size / MIB, count, where))
    return 0


if __name__ == "__main__":
    sys.exit(main())
