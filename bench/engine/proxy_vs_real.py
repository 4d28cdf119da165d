#!/usr/bin/env python3
"""Layout proxies against real multi-rank trials on CPU ranks, for every valid policy
(docs/layout-proxies.md, "Validation on CPU ranks").

    bench/engine/proxy_vs_real.py BUILD_BIN [LAYOUT ...] [--policies N]

For each layout (default: the four of tests/engine/layout_proxy_engine_test.cc, the same tiny
specs; also cp2-tp2-pp2, tp2-ep2-pp2-etp1 and tp2-ep2-pp2-etp2, 8 ranks each), asks
remat-bench-estimate for every valid policy, runs the real trial (one remat-trial process per
rank over TCP) and every rank alone with stand-in collectives (remat-trial --stand-in),
and prints one row per policy: the largest |proxy - real| / real over the ranks of the allocated
peak, with the rank it came from, and whether the static bytes were equal on every rank; then
the largest difference per layout. --policies N keeps the first N policies of each layout.
Exit 1 when any rank is off by 2% or more. Standard library only.
"""
import json
import os
import subprocess
import sys
import tempfile
import threading


def spec_yaml(parallel, model_extra="", train_extra="", layers=2, seq=32):
    return ("name: tiny-layout\nmodel:\n  num_layers: %d\n  hidden_size: 64\n"
            "  num_attention_heads: 4\n  num_query_groups: 2\n  ffn_hidden_size: 128\n"
            "  gated_linear_unit: true\n  normalization: RMSNorm\n  seq_length: %d\n"
            "  vocab_size: 256\n  attention_dropout: 0.0\n  hidden_dropout: 0.0\n"
            "  add_bias_linear: false\n  position_embedding_type: rope\n%s"
            "train:\n  micro_batch_size: 2\n  global_batch_size: 8\n  precision: fp32\n%s"
            "parallel:\n%s"
            "search:\n  memory_budget_gib: 1\n  warmup_steps: 1\n  warmup_max_steps: 1\n"
            "  steady_window: 1\n  measure_steps: 1\n  noise_target: 0\n"
            "  device: cpu\n") % (layers, seq, model_extra, train_extra, parallel)


EXPERT_GRID = ("  tensor_model_parallel_size: 2\n  sequence_parallel: true\n"
               "  pipeline_model_parallel_size: 2\n  data_parallel_size: 2\n"
               "  expert_model_parallel_size: 2\n  expert_tensor_parallel_size: %d\n")
MOE_LINES = ("  num_moe_experts: 4\n  moe_router_topk: 2\n  moe_ffn_hidden_size: 64\n"
             "  moe_shared_expert_intermediate_size: 32\n  moe_grouped_gemm: true\n"
             "  moe_token_dispatcher_type: alltoall\n")

LAYOUTS = {
    "tp2-pp2": (spec_yaml("  tensor_model_parallel_size: 2\n  pipeline_model_parallel_size: 2\n"
                          "  sequence_parallel: true\n",
                          "  share_embeddings_and_output_weights: true\n", layers=4), 4),
    "pp4-vpp2": (spec_yaml("  pipeline_model_parallel_size: 4\n"
                           "  virtual_pipeline_model_parallel_size: 2\n", layers=8), 4),
    "ep2-dp4": (spec_yaml("  data_parallel_size: 4\n  expert_model_parallel_size: 2\n",
                          "  num_moe_experts: 4\n  moe_router_topk: 2\n  moe_ffn_hidden_size: 64\n"
                          "  moe_grouped_gemm: true\n"
                          "  moe_token_dispatcher_type: alltoall\n", seq=256), 4),
    "tp2-sp-dp2-distopt": (spec_yaml("  tensor_model_parallel_size: 2\n  sequence_parallel: true\n"
                                     "  data_parallel_size: 2\n",
                                     train_extra="  use_distributed_optimizer: true\n"), 4),
    # Not in the default set (8 ranks each, about 10 minutes apiece on two cores): context
    # parallelism with TP and PP, and MoE with TP on Megatron's expert grid, ETP 1 and 2
    # (tests/engine/moe_layout_proxy_test.cc's grid, 512 tokens per rank and micro-batch).
    "cp2-tp2-pp2": (spec_yaml("  tensor_model_parallel_size: 2\n  sequence_parallel: true\n"
                              "  context_parallel_size: 2\n  pipeline_model_parallel_size: 2\n",
                              "  attention_backend: flash\n", layers=4, seq=64), 8),
    "tp2-ep2-pp2-etp1": (spec_yaml(EXPERT_GRID % 1, MOE_LINES, layers=2, seq=512), 8),
    "tp2-ep2-pp2-etp2": (spec_yaml(EXPERT_GRID % 2, MOE_LINES, layers=2, seq=512), 8),
}
DEFAULT_LAYOUTS = ["tp2-pp2", "pp4-vpp2", "ep2-dp4", "tp2-sp-dp2-distopt"]


def run_json(cmd):
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"status": "failed", "message": out.stdout[-300:]}


def real_ranks(trial, spec, policy, world, work):
    rendezvous = tempfile.mkdtemp(prefix="rv-", dir=work)
    results = [None] * world

    def one(r):
        results[r] = run_json([trial, "--spec", spec, "--policy", policy, "--rank", str(r),
                               "--world-size", str(world), "--rendezvous", rendezvous,
                               "--collective-timeout", "120", "--json"])

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    bin_dir, rest = argv[1], argv[2:]
    limit = None
    if "--policies" in rest:
        i = rest.index("--policies")
        limit = int(rest[i + 1])
        rest = rest[:i] + rest[i + 2:]
    names = rest or DEFAULT_LAYOUTS
    trial = os.path.join(bin_dir, "remat-trial")
    work = tempfile.mkdtemp(prefix="remat-proxy-vs-real-")
    worst_all = 0.0
    summary = []
    print("| layout | policy | real peak MiB (max rank) | worst rank | proxy / real - 1 | static equal |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for name in names:
        text, world = LAYOUTS[name]
        spec = os.path.join(work, name + ".yaml")
        open(spec, "w").write(text)
        estimate = json.loads(subprocess.check_output(
            [os.path.join(bin_dir, "remat-bench-estimate"), "--spec", spec]))
        policies = estimate["valid_policies"][:limit]
        worst_layout = 0.0
        for policy in policies:
            real = real_ranks(trial, spec, policy, world, work)
            worst, worst_rank, static_equal, peak = 0.0, -1, True, 0
            for r in range(world):
                proxy = run_json([trial, "--spec", spec, "--policy", policy, "--stand-in",
                                  "--rank", str(r), "--world-size", str(world), "--json"])
                if real[r]["status"] != "ok" or proxy["status"] != "ok":
                    print("| %s | %s | rank %d: real %s, proxy %s |" % (
                        name, policy, r, real[r].get("message", real[r]["status"]),
                        proxy.get("message", proxy["status"])))
                    worst = float("inf")
                    continue
                a = real[r]["ranks"][0]["peak_allocated_bytes"]
                b = proxy["ranks"][0]["peak_allocated_bytes"]
                peak = max(peak, a)
                diff = b / a - 1
                if abs(diff) >= abs(worst):
                    worst, worst_rank = diff, r
                static_equal &= real[r]["ranks"][0]["static_bytes"] == proxy["ranks"][0]["static_bytes"]
            print("| %s | `%s` | %.3f | %d | %+.2f%% | %s |" % (
                name, policy, peak / 2**20, worst_rank, 100 * worst, "yes" if static_equal else "NO"))
            sys.stdout.flush()
            worst_layout = max(worst_layout, abs(worst))
        summary.append((name, len(policies), worst_layout))
        worst_all = max(worst_all, worst_layout)
    print()
    print("| layout | ranks | policies | largest abs(proxy / real - 1) over ranks and policies |")
    print("| --- | ---: | ---: | ---: |")
    for name, n, w in summary:
        print("| %s | %d | %d | %.2f%% |" % (name, LAYOUTS[name][1], n, 100 * w))
    return 1 if worst_all >= 0.02 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
