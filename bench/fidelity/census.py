#!/usr/bin/env python3
"""What Megatron Core keeps for backward, policy by policy: one forward of a fidelity family's
model under torch.autograd.graph.saved_tensors_hooks, every saved CUDA tensor attributed to the
innermost module running when it was saved, counted once per storage at its size after the
forward (an output-discarding checkpoint has freed its outputs by then); parameters excluded.
Prints, per (module, shape, dtype) group, the bytes each policy keeps, and the groups where a
pair of labels does not drop what its two single labels drop together (the fidelity bench's
sub-additive pairs). Needs torch with CUDA and Megatron Core.

  census.py --megatron DIR --family mla --policies 'selective:[];selective:[layernorm];...'
            [--layers N] > census.txt
"""

import argparse
import collections
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "worker"))

import fidelity  # noqa: E402
from megatron_side import _free_port  # noqa: E402


def census(session, plan, torch):
    """{(module, shape, dtype): bytes} of what one forward keeps, and the allocator's delta."""
    session._shims(plan)  # pylint: disable=protected-access
    _, model, _, _ = session._build(plan)  # pylint: disable=protected-access
    batch = session._batches(plan)[0]  # pylint: disable=protected-access
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    stack, saved = ["(outside)"], []

    def pre(module, _inputs):
        stack.append(getattr(module, "_census_name", type(module).__name__))

    def post(_module, _inputs, _output):
        stack.pop()

    handles = []
    for name, module in model.named_modules():
        module._census_name = name or "(model)"  # pylint: disable=protected-access
        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))

    def pack(t):
        if t.is_cuda:
            saved.append((stack[-1], t))
        return t

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    torch.cuda.synchronize()
    delta = torch.cuda.memory_allocated() - before
    groups, seen = collections.Counter(), set()
    for where, t in saved:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in params or key in seen or storage.nbytes() == 0:
            continue
        seen.add(key)
        groups[(where, tuple(t.shape), str(t.dtype).replace("torch.", ""))] += storage.nbytes()
    for h in handles:
        h.remove()
    del out, saved, model
    return groups, delta


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--megatron", required=True)
    p.add_argument("--family", default="mla")
    p.add_argument("--policies", required=True)
    p.add_argument("--layers", type=int, default=0)
    a = p.parse_args()
    sys.path.insert(0, a.megatron)
    import torch  # noqa: PLC0415
    from megatron_driver import mapping, runner  # noqa: PLC0415

    spec = fidelity.spec_of(a.family)
    if a.layers:
        spec["model"]["num_layers"] = a.layers
    policies = a.policies.split(";")
    session, kept, deltas = None, {}, {}
    for policy in policies:
        plan = mapping.map_trial(spec, policy, have_te=False, have_apex=False)
        if session is None:
            session = runner.Session(plan["parallel"], 0, 1, "tcp://127.0.0.1:%d" % _free_port(), 300,
                                     lambda m: print("#", m, file=sys.stderr))
        kept[policy], deltas[policy] = census(session, plan, torch)
        torch.cuda.empty_cache()
        print("%-40s kept %10.1f MiB (census)  allocator delta %10.1f MiB" % (
            policy, sum(kept[policy].values()) / 2**20, deltas[policy] / 2**20), flush=True)
    keys = sorted(set().union(*kept.values()))
    control = policies[0]
    print("\nper group, MiB kept (first policy: %s)" % control)
    print("%-60s %-22s %-9s" % ("module", "shape", "dtype") +
          "".join("%14s" % q.replace("selective:", "")[:13] for q in policies))
    for k in keys:
        row = [kept[q].get(k, 0) / 2**20 for q in policies]
        if max(row) - min(row) < 0.01:
            continue
        print("%-60s %-22s %-9s" % (k[0][-60:], str(k[1])[:22], k[2]) +
              "".join("%14.2f" % v for v in row))
    # Sub-additive pairs: what the pair keeps against control - drop(a) - drop(b).
    print("\npairs: MiB the pair keeps beyond (control - both single drops)")
    for pair in policies:
        labels = pair[len("selective:["):-1].split(",") if pair.startswith("selective:[") else []
        if len(labels) != 2:
            continue
        singles = ["selective:[%s]" % lab for lab in labels]
        if not all(s in kept for s in singles):
            continue
        total = 0.0
        for k in keys:
            c = kept[control].get(k, 0)
            expect = c - (c - kept[singles[0]].get(k, 0)) - (c - kept[singles[1]].get(k, 0))
            extra = kept[pair].get(k, 0) - expect
            if abs(extra) >= 0.01 * 2**20:
                print("  %-30s %-55s %-20s %9.2f" % (pair, k[0][-55:], str(k[1])[:20],
                                                     extra / 2**20))
            total += extra
        print("  %-30s total %9.2f MiB" % (pair, total / 2**20))
    if session is not None:
        session.close()


if __name__ == "__main__":
    main()
