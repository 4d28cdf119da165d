"""The Transformer Engine layer and bf16 gradients in remat's engine against the memory model.

For Llama-3-8B's layer shape (bench.py's "dense", bf16, seq 4096, micro-batch 1) in three
variants: the local unfused layer, the fused local layer (fused SwiGLU, RoPE, bias-dropout-add,
flash attention) and the Transformer Engine layer (transformer_impl transformer_engine, the
same fusions, grad_reduce_in_fp32 false, the precision-aware optimizer with bf16 moments), it runs
the control, the single labels and full:uniform:1 with remat-bench-engine at 4 and 2 layers and
prints per policy: activation bytes per layer measured ((peak - static) at 4 layers minus at 2,
halved) against the memory model (search::EstimateMemory, same difference), the static bytes
measured against the model's, and the loss.

The variants fp8-tensorwise and fp8-delayed are the TE layer with FP8 linears (hybrid format):
their activation bytes and static bytes (with the FP8 weight workspaces) against the model's FP8
terms (search/fp8_memory.h).

Usage: python3 te_layer.py --build BUILD_DIR --out OUT_DIR [--tiny] [--variants te,fp8-delayed]
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (make_spec, write_spec, run_lines)

FUSED = {"attention_backend": "flash", "bias_activation_fusion": True, "apply_rope_fusion": True,
         "bias_dropout_fusion": True, "cross_entropy_loss_fusion": True}
VARIANTS = {
    "local": ({}, {}),
    "fused": (FUSED, {}),
    "te": (dict(FUSED, transformer_impl="transformer_engine"),
           {"grad_reduce_in_fp32": False, "use_distributed_optimizer": True,
            "use_precision_aware_optimizer": True, "main_grads_dtype": "bf16",
            "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}),
}
# The TE layer with FP8 linears (engine/fp8_linear.h): hybrid format, each recipe the engine runs.
for _recipe in ("tensorwise", "delayed"):
    VARIANTS[f"fp8-{_recipe}"] = (dict(VARIANTS["te"][0], fp8="hybrid", fp8_recipe=_recipe),
                                  VARIANTS["te"][1])


# --tiny: a CPU smoke run of this script (hidden 64, seq 128), not a measurement.
TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 2, "ffn_hidden_size": 128,
        "seq_length": 128, "vocab_size": 512}


def spec_of(variant, layers, tiny):
    model_extra, train_extra = VARIANTS[variant]
    spec = bench.make_spec("dense", layers)
    spec["name"] = f"te-{variant}-{layers}"
    spec["model"].update(model_extra)
    spec["train"].update(train_extra)
    if tiny:
        spec["model"].update(TINY)
        spec["search"].update({"device": "cpu", "memory_budget_gib": 1})
    return spec


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run with a tiny model")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated subset of " + ", ".join(VARIANTS))
    ap.add_argument("--policies", default="",
                    help="semicolon-separated policies (default: the control, each single label "
                         "and full:uniform:1)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    engine = os.path.join(args.build, "bin", "remat-bench-engine")
    estimate = os.path.join(args.build, "bin", "remat-bench-estimate")
    rows = []
    for variant in args.variants.split(","):
        deep, _ = bench.write_spec(args.out, spec_of(variant, 4, args.tiny))
        shallow, _ = bench.write_spec(args.out, spec_of(variant, 2, args.tiny))
        valid = json.loads(subprocess.check_output([estimate, "--spec", deep]))["valid_policies"]
        singles = [p for p in valid if p in ("selective:[]", "full:uniform:1") or
                   (p.startswith("selective:[") and "," not in p)]
        if args.policies:
            singles = [p for p in args.policies.split(";") if p in valid]
        plist = ";".join(singles)
        r4 = bench.run_lines([engine, "--spec", deep, "--policies", plist],
                             os.path.join(args.out, f"{variant}-4.log"))
        r2 = bench.run_lines([engine, "--spec", shallow, "--policies", plist],
                             os.path.join(args.out, f"{variant}-2.log"))
        e4 = json.loads(subprocess.check_output([estimate, "--spec", deep, "--policies", plist]))
        e2 = json.loads(subprocess.check_output([estimate, "--spec", shallow, "--policies", plist]))
        for p in singles:
            a, b = r4.get(p), r2.get(p)
            if not a or not b or a["status"] != "ok" or b["status"] != "ok":
                rows.append((variant, p, "failed", a and a.get("message", "")))
                continue
            held4 = a["peak_allocated_bytes"] - a["ranks"][0]["static_bytes"]
            held2 = b["peak_allocated_bytes"] - b["ranks"][0]["static_bytes"]
            measured = (held4 - held2) / 2
            modelled = (e4["estimates"][p]["layer_activation_bytes"] -
                        e2["estimates"][p]["layer_activation_bytes"]) / 2
            static_model = e4["estimates"][p]["static_bytes"]
            rows.append((variant, p, measured, modelled, a["ranks"][0]["static_bytes"],
                         static_model, a["loss"]))
    with open(os.path.join(args.out, "te_layer.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'variant':14} {'policy':28} {'measured MiB':>13} {'model MiB':>10} {'model/meas':>10} "
          f"{'static GiB':>10} {'model GiB':>10} {'loss':>8}")
    for row in rows:
        if row[2] == "failed":
            print(f"{row[0]:14} {row[1]:28} failed: {row[3]}")
            continue
        v, p, meas, mod, st, stm, loss = row
        print(f"{v:14} {p:28} {meas / 2**20:13.1f} {mod / 2**20:10.1f} {mod / meas:10.3f} "
              f"{st / 2**30:10.3f} {stm / 2**30:10.3f} {loss:8.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
