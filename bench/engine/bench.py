"""remat's trial engine against the same model in eager PyTorch, on one GPU, in one run.

For three example models at realistic sizes (dense GQA, MLA, grouped MoE with shared experts) it
runs every valid recompute policy with both engines (remat-bench-engine: the C++ engine, all
policies of a model in one process; twin.py: the PyTorch twin, likewise), then runs the C++ engine
at a second depth to measure activation bytes per layer, and prints:
  1. per policy: step time remat / PyTorch, peak allocated and reserved remat / PyTorch, losses;
  2. per policy: measured activation bytes per layer ((peak - static) at 4 layers minus at 2
     layers, halved) against the search core's memory model.
Goal: step time <= 1.0x PyTorch's, peaks within 3%, activation bytes within 10%.

Usage: python3 bench.py --build BUILD_DIR --out OUT_DIR [--models dense,mla,moe] [--quick]
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

COMMON_TRAIN = {"micro_batch_size": 1, "precision": "bf16", "seed": 1234}
COMMON_SEARCH = {"memory_budget_gib": 120, "warmup_steps": 1, "measure_steps": 2, "device": "cuda"}

# Every field spelled out: the twin reads this structure as JSON and applies no defaults.
BASE_MODEL = {
    "num_layers": 4,
    "normalization": "RMSNorm",
    "gated_linear_unit": True,
    "attention_backend": "unfused",
    "attention_dropout": 0.0,
    "hidden_dropout": 0.0,
    "attention_softmax_in_fp32": True,
    "add_bias_linear": False,
    "position_embedding_type": "rope",
    "share_embeddings_and_output_weights": False,
}

MODELS = {
    # Llama-3-8B's layer shape (examples/llama3-8b-proxy.yaml).
    "dense": {
        "hidden_size": 4096, "num_attention_heads": 32, "num_query_groups": 8,
        "ffn_hidden_size": 14336, "seq_length": 4096, "vocab_size": 128256,
    },
    # DeepSeek-V2-Lite's attention (MLA, no q compression) with its dense first-layer MLP, so the
    # policy set stays at 24 (with its MoE layers it would be 136, too many for one run).
    "mla": {
        "hidden_size": 2048, "num_attention_heads": 16, "ffn_hidden_size": 10944,
        "seq_length": 4096, "vocab_size": 102400, "multi_latent_attention": True,
        "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128,
    },
    # Qwen1.5-MoE-A2.7B's shape (examples/qwen-moe-proxy.yaml): every layer grouped MoE.
    "moe": {
        "hidden_size": 2048, "num_attention_heads": 16, "ffn_hidden_size": 5632,
        "seq_length": 4096, "vocab_size": 151936, "num_moe_experts": 60, "moe_router_topk": 4,
        "moe_ffn_hidden_size": 1408, "moe_shared_expert_intermediate_size": 5632,
        "moe_grouped_gemm": True, "moe_layer_freq": 1,
    },
}


def make_spec(name, layers):
    model = dict(BASE_MODEL)
    model.update(MODELS[name])
    model["num_layers"] = layers
    return {"name": f"bench-{name}-{layers}", "model": model, "train": dict(COMMON_TRAIN),
            "search": dict(COMMON_SEARCH)}


def to_yaml(spec):
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return str(v)
    lines = [f"name: {spec['name']}"]
    for section in ("model", "train", "search"):
        lines.append(f"{section}:")
        for k, v in spec[section].items():
            lines.append(f"  {k}: {value(v)}")
    return "\n".join(lines) + "\n"


def write_spec(out, spec):
    yaml_path = os.path.join(out, spec["name"] + ".yaml")
    json_path = os.path.join(out, spec["name"] + ".json")
    with open(yaml_path, "w") as f:
        f.write(to_yaml(spec))
    with open(json_path, "w") as f:
        json.dump(spec, f, indent=1)
    return yaml_path, json_path


def run_lines(cmd, log_path):
    """Runs a command that prints one JSON object per line; returns them by policy."""
    start = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    with open(log_path, "a") as log:
        log.write(proc.stdout)
    if proc.returncode != 0:
        sys.stderr.write(f"error: {' '.join(cmd[:2])} exited {proc.returncode}; see {log_path}\n")
    results = {}
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            results[r["policy"]] = r
    print(f"  {os.path.basename(cmd[0]) if 'python' not in cmd[0] else 'twin.py'}: "
          f"{len(results)} trials in {time.time() - start:.0f} s", flush=True)
    return results


def gib(x):
    return x / 2 ** 30


def ratio(a, b):
    return a / b if b else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="dense,mla,moe")
    ap.add_argument("--quick", action="store_true", help="control, single labels and full:uniform:1 only")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    engine = os.path.join(args.build, "bin", "remat-bench-engine")
    estimate = os.path.join(args.build, "bin", "remat-bench-estimate")
    twin = os.path.join(HERE, "twin.py")

    report = {}
    for name in args.models.split(","):
        print(f"== {name}", flush=True)
        deep = make_spec(name, 4)
        shallow = make_spec(name, 2)
        deep_yaml, deep_json = write_spec(args.out, deep)
        shallow_yaml, _ = write_spec(args.out, shallow)
        est = json.loads(subprocess.check_output([estimate, "--spec", deep_yaml]))
        policies = est["valid_policies"]
        singles = [p for p in policies
                   if p == "selective:[]" or p == "full:uniform:1" or
                   (p.startswith("selective:[") and "," not in p)]
        if args.quick:
            policies = singles
        plist = ";".join(policies)
        remat = run_lines([engine, "--spec", deep_yaml, "--policies", plist],
                          os.path.join(args.out, f"{name}-remat.log"))
        torch_ = run_lines([sys.executable, twin, "--spec", deep_json, "--policies", plist],
                           os.path.join(args.out, f"{name}-twin.log"))
        # Depth pair for activation bytes per layer (C++ engine, the control and single labels).
        depth_list = ";".join(singles)
        remat2 = run_lines([engine, "--spec", shallow_yaml, "--policies", depth_list],
                           os.path.join(args.out, f"{name}-remat-depth2.log"))
        est4 = json.loads(subprocess.check_output([estimate, "--spec", deep_yaml, "--policies", depth_list]))
        est2 = json.loads(subprocess.check_output([estimate, "--spec", shallow_yaml, "--policies", depth_list]))
        report[name] = {"policies": policies, "singles": singles, "remat": remat, "torch": torch_,
                        "remat2": remat2, "est4": est4, "est2": est2}

    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(report, f, indent=1)
    print_tables(report)
    return 0


def print_tables(report):
    worst_time, worst_peak, worst_act = 0.0, 0.0, 0.0
    print()
    print("Step time and peak memory, remat engine / eager PyTorch twin (same GPU, same run)")
    hdr = (f"{'model':6} {'policy':52} {'remat s':>8} {'torch s':>8} {'time x':>7} "
           f"{'remat GiB':>9} {'torch GiB':>9} {'alloc x':>8} {'resv x':>7} {'loss r/t':>17}")
    print(hdr)
    print("-" * len(hdr))
    for name, rep in report.items():
        for p in rep["policies"]:
            r, t = rep["remat"].get(p), rep["torch"].get(p)
            if not r or not t or r["status"] != "ok" or t["status"] != "ok":
                rs = r["status"] + " " + r.get("message", "")[:40] if r else "missing"
                ts = t["status"] + " " + t.get("message", "")[:40] if t else "missing"
                print(f"{name:6} {p:52} remat: {rs} | torch: {ts}")
                continue
            tx = ratio(r["step_time_s"], t["step_time_s"])
            ax = ratio(r["peak_allocated_bytes"], t["peak_allocated_bytes"])
            vx = ratio(r["peak_reserved_bytes"], t["peak_reserved_bytes"])
            worst_time = max(worst_time, tx)
            worst_peak = max(worst_peak, abs(ax - 1))
            print(f"{name:6} {p:52} {r['step_time_s']:8.4f} {t['step_time_s']:8.4f} {tx:7.3f} "
                  f"{gib(r['peak_allocated_bytes']):9.2f} {gib(t['peak_allocated_bytes']):9.2f} "
                  f"{ax:8.4f} {vx:7.4f} {r['loss']:8.4f}/{t['loss']:8.4f}")
    print()
    print("Activation bytes per layer: measured ((peak - static) at 4 layers - at 2 layers) / 2")
    print("against the memory model (search::EstimateMemory layer bytes, same difference; the")
    print("control also against search::EstimateLayerActivations of one layer)")
    hdr = f"{'model':6} {'policy':34} {'measured MiB':>13} {'model MiB':>10} {'model/meas':>10} {'EstimateLayerActivations MiB':>29}"
    print(hdr)
    print("-" * len(hdr))
    for name, rep in report.items():
        for p in rep["singles"]:
            a, b = rep["remat"].get(p), rep["remat2"].get(p)
            e4 = rep["est4"]["estimates"].get(p)
            e2 = rep["est2"]["estimates"].get(p)
            if not a or not b or a["status"] != "ok" or b["status"] != "ok" or not e4 or not e2:
                print(f"{name:6} {p:34} (not measured)")
                continue
            measured = ((a["peak_allocated_bytes"] - a["static_bytes"]) -
                        (b["peak_allocated_bytes"] - b["static_bytes"])) / 2
            modeled = (e4["layer_activation_bytes"] - e2["layer_activation_bytes"]) / 2
            layer = ""
            if p == "selective:[]":
                layers = rep["est4"]["layers"]
                layer = f"{sum(layers) / len(layers) / 2 ** 20:29.1f}"
            rel = ratio(modeled, measured)
            worst_act = max(worst_act, abs(rel - 1))
            print(f"{name:6} {p:34} {measured / 2 ** 20:13.1f} {modeled / 2 ** 20:10.1f} {rel:10.3f} {layer}")
    print()
    print(f"worst step-time ratio {worst_time:.3f} (goal <= 1.0); worst peak deviation "
          f"{100 * worst_peak:.2f}% (goal <= 3%); worst activation-model deviation "
          f"{100 * worst_act:.1f}% (goal <= 10%)")


if __name__ == "__main__":
    sys.exit(main())
