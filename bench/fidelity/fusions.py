#!/usr/bin/env python3
"""Megatron Core's own peaks with the settings a recipe turns on that its local layer runs
without Transformer Engine (bias_activation_fusion, bias_dropout_fusion, bf16 gradient buffers),
on the fidelity bench's dense family, beside remat's plan of the same specs.

  # on the GPU machine (torch with CUDA), from the repository root, Megatron Core carried as for
  # bench/fidelity/run.sh:
  python3 bench/fidelity/fusions.py --megatron-path .carry/megatron-lm --out "$OUT"
  # here, with the plan's figures (remat plan --json on the same specs):
  python3 bench/fidelity/fusions.py --compare "$OUT/fusions.jsonl" --remat build/bin/remat

Variants: the control spec, bias_activation_fusion, grad_reduce_in_fp32 false; policies
selective:[] and selective:[mlp]. Printed: each variant's measured allocated peak, its change
against the control spec, and the plan's change (the plan's absolute peak adds the caching
allocator's view of static memory the same way for every variant, so changes are compared).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import fidelity  # noqa: E402

VARIANTS = {
    "control": ({}, {}),
    "bias_activation_fusion": ({"bias_activation_fusion": True}, {}),
    "bf16_grads": ({}, {"grad_reduce_in_fp32": False}),
}
POLICIES = ["selective:[]", "selective:[mlp]"]
GIB = float(1 << 30)


def specs():
    out = {}
    for name, (model, train) in VARIANTS.items():
        spec = fidelity.spec_of("dense")
        spec["name"] = "fusions-" + name
        spec["model"].update(model)
        spec["train"].update(train)
        out[name] = spec
    return out


def measure(args):
    plan = [{"family": name, "spec": spec, "policies": POLICIES} for name, spec in specs().items()]
    os.makedirs(args.out, exist_ok=True)
    plan_path = os.path.join(args.out, "fusions-plan.json")
    with open(plan_path, "w") as f:
        json.dump(plan, f)
    jsonl = os.path.join(args.out, "fusions.jsonl")
    return subprocess.call([sys.executable, os.path.join(HERE, "megatron_side.py"), "--plan",
                            plan_path, "--jsonl", jsonl, "--megatron-path", args.megatron_path])


def planned(remat, spec):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(fidelity.to_yaml(spec))
        path = f.name
    try:
        text = subprocess.check_output([remat, "plan", path, "--json"], text=True)
    finally:
        os.unlink(path)
    return {c["policy"]: c["predicted_peak_bytes"] for c in json.loads(text)["candidates"]}


def compare(args):
    measured = {}
    with open(args.compare) as f:
        for line in f:
            r = json.loads(line)
            if r.get("status") == "ok":
                measured[(r["family"], r["policy"])] = r["rank"]["peak_allocated_bytes"]
    plans = {name: planned(args.remat, spec) for name, spec in specs().items()}
    print("| variant | policy | Megatron Core peak (GiB) | change vs control | plan's change |")
    print("| --- | --- | --- | --- | --- |")
    for name in VARIANTS:
        for policy in POLICIES:
            m = measured.get((name, policy))
            m0 = measured.get(("control", policy))
            p, p0 = plans[name].get(policy), plans["control"].get(policy)
            if m is None or m0 is None:
                print("| %s | `%s` | not run | | |" % (name, policy))
                continue
            print("| %s | `%s` | %.3f | %+.3f | %+.3f |"
                  % (name, policy, m / GIB, (m - m0) / GIB, (p - p0) / GIB))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--megatron-path")
    p.add_argument("--out")
    p.add_argument("--compare", help="a fusions.jsonl to set beside the plan")
    p.add_argument("--remat", default="build/bin/remat")
    args = p.parse_args()
    if args.compare:
        compare(args)
        return 0
    if not args.megatron_path or not args.out:
        p.error("--megatron-path and --out are needed to measure")
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
