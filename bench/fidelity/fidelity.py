#!/usr/bin/env python3
"""The fidelity bench: the builtin engine held to Megatron Core, policy by policy, on one GPU.

For each model family (dense GQA with unfused attention, MLA, MoE with sequential experts and
shared experts, MoE with grouped experts and shared experts) it runs the matched control
`selective:[]`, every valid single label, every valid two-label pair, `full:uniform:1` and
`full:block:2`, with the builtin engine (remat-bench-engine: all policies of a family in one
process) and with Megatron Core (megatron_side.py: every family in one process, the megatron
backend's own driver code). Per policy it compares the change of the allocated peak against the
control and the extra seconds per step against the control (the recompute's cost).

The fused families (`dense-fused`, `mla-fused`, `moe-seq-fused`, `moe-grouped-fused`) are the
same models with what Megatron Core's local layer fuses without Transformer Engine on both sides
(FUSED_MODEL, FUSED_TRAIN below); each brings its unfused family's control along when that family
is not asked for, so the fusions' own change of static memory and peak is compared too. The
trials run in two phases (phases()): controls, single labels and full:uniform:1 of every family,
then those anchors; then full:block:2 and the pairs, so a time budget cuts the pairs.

Megatron Core's local (non-TE) layer spec has no grouped-GEMM experts (TEGroupedMLP needs
Transformer Engine), so the grouped family's Megatron Core reference is the sequential family's
run (the same model with SequentialMLP experts): it measures how far the engine's grouped experts
are from what Megatron Core keeps, not a grouped-GEMM Megatron run.

  fidelity.py --build BUILD_DIR --megatron DIR --out OUT_DIR [--deadline UNIX_S]
              [--families dense,mla,moe-seq,moe-grouped|dense-fused,...] [--policies 'P1;P2;...']

Writes OUT_DIR/fidelity.json (every figure), OUT_DIR/fidelity.md (the table, bench/fidelity/
to_doc.py), the specs, engine.jsonl / megatron.jsonl and their logs.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import to_doc  # noqa: E402

MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"

TRAIN = {"micro_batch_size": 1, "precision": "bf16", "seed": 1234}
# A fixed warm-up of one step on both sides (the bench reads the steps itself).
SEARCH = {"memory_budget_gib": 130, "warmup_steps": 1, "warmup_max_steps": 1, "steady_window": 1,
          "measure_steps": 4, "device": "cuda"}
BASE = {
    "num_layers": 4, "seq_length": 4096, "vocab_size": 32000, "normalization": "RMSNorm",
    "gated_linear_unit": True, "attention_backend": "unfused", "attention_dropout": 0.0,
    "hidden_dropout": 0.0, "attention_softmax_in_fp32": True, "add_bias_linear": False,
    "position_embedding_type": "rope", "share_embeddings_and_output_weights": False,
}
FAMILIES = {
    # Llama-like dense layer with grouped-query attention.
    "dense": {"hidden_size": 2048, "num_attention_heads": 16, "num_query_groups": 4,
              "ffn_hidden_size": 5632},
    # DeepSeek-V3-like attention (q compressed to 512, Megatron Core's MLATransformerConfig
    # default, and kv to 512) with a dense SwiGLU MLP. Without q compression Megatron Core's local
    # spec cannot be built at this commit (its qk-norm resolver asks for Transformer Engine's
    # fused norm-linear), so that variant is the engine's alone.
    "mla": {"hidden_size": 2048, "num_attention_heads": 16, "ffn_hidden_size": 5632,
            "multi_latent_attention": True, "q_lora_rank": 512, "kv_lora_rank": 512,
            "qk_head_dim": 128,
            "qk_pos_emb_head_dim": 64, "v_head_dim": 128},
    # Every layer MoE: 16 experts, top-4, shared experts.
    "moe-seq": {"hidden_size": 1024, "num_attention_heads": 8, "ffn_hidden_size": 2816,
                "num_moe_experts": 16, "moe_router_topk": 4, "moe_ffn_hidden_size": 704,
                "moe_shared_expert_intermediate_size": 1408, "moe_grouped_gemm": False,
                "moe_layer_freq": 1},
}
FAMILIES["moe-grouped"] = dict(FAMILIES["moe-seq"], moe_grouped_gemm=True)
# The sequential MoE family at 2 and 6 layers: with the 4-layer one, a change of the peak that
# grows with the layers (what each layer keeps for backward) is told from one that does not
# (what is live at the peak in backward), on each side.
FAMILIES["moe-seq-2l"] = dict(FAMILIES["moe-seq"], num_layers=2)
FAMILIES["moe-seq-6l"] = dict(FAMILIES["moe-seq"], num_layers=6)
# Whose Megatron Core run a family is compared with (see the module comment).
MEGATRON_REFERENCE = {"moe-grouped": "moe-seq"}

# The fused families: each family above with what Megatron Core's local layer runs without
# Transformer Engine (Megatron-LM at d98e8a6): the jit-fused bias + SwiGLU
# (megatron/core/fusions/fused_bias_swiglu.py) and bias + dropout + add
# (megatron/core/fusions/fused_bias_dropout.py), the native fused cross-entropy
# (megatron/core/fusions/fused_cross_entropy.py) and bf16 gradient buffers (DDP's
# grad_reduce_in_fp32 false), on both sides. Left out on both: the precision-aware optimizer
# (megatron/core/optimizer/__init__.py passes exp_avg_dtype, master_weights and
# initialize_state to Transformer Engine's FusedAdam, and OptimizerConfig checks for it; torch's
# AdamW, the fallback, has none of them), so Megatron Core cannot run it here and the engine
# runs without it to keep the static memory comparable. Attention stays unfused (the local spec
# has no fused attention).
FUSED_MODEL = {"bias_activation_fusion": True, "bias_dropout_fusion": True,
               "cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "native"}
FUSED_TRAIN = {"grad_reduce_in_fp32": False}
FAMILY_TRAIN = {}
# A fused family's unfused one: its control runs too (as an anchor) when it is not asked for,
# so the fusions' own change of the static memory and the peak is compared on both sides.
UNFUSED = {}
for _base in ("dense", "mla", "moe-seq", "moe-grouped"):
    FAMILIES[_base + "-fused"] = dict(FAMILIES[_base], **FUSED_MODEL)
    FAMILY_TRAIN[_base + "-fused"] = FUSED_TRAIN
    UNFUSED[_base + "-fused"] = _base
MEGATRON_REFERENCE["moe-grouped-fused"] = "moe-seq-fused"
# The fused MLA family at 2 and 6 layers, for the same reason as moe-seq-2l/-6l (no unfused
# anchor: the depth, not the fusions, is what they vary).
FAMILIES["mla-fused-2l"] = dict(FAMILIES["mla-fused"], num_layers=2)
FAMILIES["mla-fused-6l"] = dict(FAMILIES["mla-fused"], num_layers=6)
FAMILY_TRAIN["mla-fused-2l"] = FAMILY_TRAIN["mla-fused-6l"] = FUSED_TRAIN
# In the order a time budget should cut them last to first: MLA's fusions are the dense MLP's.
FUSED_FAMILIES = "dense-fused,moe-seq-fused,moe-grouped-fused,mla-fused"


def spec_of(family):
    model = dict(BASE)
    model.update(FAMILIES[family])
    train = dict(TRAIN)
    train.update(FAMILY_TRAIN.get(family, {}))
    return {"name": "fidelity-" + family, "model": model, "train": train,
            "search": dict(SEARCH)}


def to_yaml(spec):
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        return str(v)
    lines = ["name: " + spec["name"]]
    for section in ("model", "train", "search"):
        lines.append(section + ":")
        lines += ["  %s: %s" % (k, value(v)) for k, v in spec[section].items()]
    return "\n".join(lines) + "\n"


def choose_policies(valid):
    """The control, every single label, every pair, full:uniform:1 and full:block:2, in the
    order of remat's enumeration."""
    chosen = ["selective:[]"]
    for p in valid:
        if p.startswith("selective:[") and p != "selective:[]":
            n = len(p[len("selective:["):-1].split(","))
            if n <= 2:
                chosen.append(p)
    chosen += [p for p in ("full:uniform:1", "full:block:2") if p in valid]
    return chosen


def phases(policies, anchors):
    """The order the trials run in, so that a time budget cuts the least informative ones:
    phase 1 each family's control, single labels and full:uniform:1, each fused family followed
    by its anchors (the unfused controls of fused families not asked for, anchors: family ->
    ["selective:[]"]); phase 2 the rest (full:block:2 and the pairs). `policies`: family -> its
    policies, in the order to run. Returns two dicts family -> policies, in the order they run
    (a family without trials in a phase is left out of it)."""
    def first(p):
        return p in ("selective:[]", "full:uniform:1") or (
            p.startswith("selective:[") and "," not in p)
    one = {}
    for f, ps in policies.items():
        one[f] = [p for p in ps if first(p)]
        base = UNFUSED.get(f)
        for anchor in (base, MEGATRON_REFERENCE.get(base)):
            if anchor in anchors:
                one[anchor] = anchors[anchor]
    for anchor, ps in anchors.items():
        one.setdefault(anchor, ps)
    two = {f: [p for p in ps if not first(p)] for f, ps in policies.items()}
    return [{f: ps for f, ps in d.items() if ps} for d in (one, two)]


def run(cmd, log_path, timeout):
    with open(log_path, "a", encoding="utf-8") as log:
        log.write("$ %s\n" % " ".join(cmd))
        log.flush()
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                                  timeout=max(1, timeout), check=False)
        except subprocess.TimeoutExpired as exc:
            log.write("killed: time budget\n")
            return exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return proc.stdout


def median(xs):
    xs = sorted(xs)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def engine_row(line):
    if line is None:
        return {"status": "not run"}
    row = {"status": line.get("status"), "message": line.get("message", "")}
    if line.get("status") == "ok":
        row.update(peak_allocated_bytes=line["peak_allocated_bytes"],
                   peak_reserved_bytes=line["peak_reserved_bytes"],
                   static_bytes=line.get("static_bytes"),
                   step_time_s=line["step_time_s"], loss=line.get("loss"))
    return row


def megatron_row(line, warmup):
    if line is None:
        return {"status": "not run"}
    row = {"status": line.get("status"), "message": line.get("message", "")}
    rank = line.get("rank")
    if line.get("status") == "ok" and rank:
        steps = rank["step_times_s"][warmup:]
        row.update(peak_allocated_bytes=rank["peak_allocated_bytes"],
                   peak_reserved_bytes=rank["peak_reserved_bytes"],
                   static_bytes=rank.get("static_bytes"),
                   step_time_s=median(steps),
                   loss=rank["losses"][warmup] if len(rank["losses"]) > warmup else None)
    return row


def write_specs(out, family):
    """FAMILY.yaml (the engine's) and FAMILY.json (the driver's) in `out`; returns the spec."""
    spec = spec_of(family)
    with open(os.path.join(out, family + ".yaml"), "w", encoding="utf-8") as f:
        f.write(to_yaml(spec))
    with open(os.path.join(out, family + ".json"), "w", encoding="utf-8") as f:
        json.dump(spec, f, indent=1)
    return spec


def run_engine(a, engine, phase, lines):
    """The engine's trials of one phase: one process per family, all its policies."""
    for fam, pols in phase.items():
        t0 = time.time()
        out = run([engine, "--spec", os.path.join(a.out, fam + ".yaml"), "--policies",
                   ";".join(pols)], os.path.join(a.out, "engine.log"), a.deadline - time.time())
        with open(os.path.join(a.out, "engine.jsonl"), "a", encoding="utf-8") as f:
            for line in out.splitlines():
                if line.startswith("{"):
                    r = json.loads(line)
                    lines[(fam, r["policy"])] = r
                    f.write(json.dumps(dict(r, family=fam)) + "\n")
        print("engine %s (%d policies): %.0f s" % (fam, len(pols), time.time() - t0), flush=True)


def run_megatron(a, specs, phase, n):
    """Megatron Core's trials of one phase: every family in one process (megatron_side.py)."""
    plan = [{"family": fam, "spec": specs[fam], "policies": pols}
            for fam, pols in phase.items() if fam not in MEGATRON_REFERENCE]
    if not plan:
        return
    plan_path = os.path.join(a.out, "megatron-plan-%d.json" % n)
    with open(plan_path, "w", encoding="utf-8") as f:
        json.dump(plan, f, indent=1)
    t0 = time.time()
    run([sys.executable, os.path.join(HERE, "megatron_side.py"), "--plan", plan_path,
         "--jsonl", os.path.join(a.out, "megatron.jsonl"), "--megatron-path", a.megatron,
         "--deadline", str(a.deadline - 15)],
        os.path.join(a.out, "megatron.log"), a.deadline - time.time())
    print("megatron phase %d: %.0f s" % (n, time.time() - t0), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", required=True)
    p.add_argument("--megatron", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--deadline", type=float, default=time.time() + 420)
    p.add_argument("--families", default="dense,mla,moe-seq,moe-grouped",
                   help="also the fused families: " + FUSED_FAMILIES)
    p.add_argument("--policies", default="",
                   help="only these of each family's policies (';'-separated), control first")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    families = [f for f in a.families.split(",") if f]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        print("error: --families: unknown family %s (known: %s)"
              % (unknown[0], ",".join(FAMILIES)), file=sys.stderr)
        return 2
    engine = os.path.join(a.build, "bin", "remat-bench-engine")
    estimate = os.path.join(a.build, "bin", "remat-bench-estimate")

    specs, policies = {}, {}
    for fam in families:
        specs[fam] = write_specs(a.out, fam)
        est = json.loads(subprocess.check_output(
            [estimate, "--spec", os.path.join(a.out, fam + ".yaml")]))
        policies[fam] = choose_policies(est["valid_policies"])
        if a.policies:
            only = set(a.policies.split(";"))
            policies[fam] = [q for q in policies[fam] if q in only]
        print("%s: %d policies" % (fam, len(policies[fam])), flush=True)
    # The unfused controls of fused families whose unfused family is not asked for, with their
    # Megatron Core reference's when that is another family (moe-grouped's is moe-seq's).
    anchors = {}
    for fam in families:
        base = UNFUSED.get(fam)
        for f in (base, MEGATRON_REFERENCE.get(base)):
            if f and f not in families and f not in anchors:
                anchors[f] = ["selective:[]"]
                specs[f] = write_specs(a.out, f)

    # Phase by phase, the engine (fast) and then Megatron Core (see phases()).
    engine_lines = {}
    for n, phase in enumerate(phases(policies, anchors), 1):
        run_engine(a, engine, phase, engine_lines)
        run_megatron(a, specs, phase, n)
    megatron_lines = {}
    jsonl = os.path.join(a.out, "megatron.jsonl")
    if os.path.exists(jsonl):
        with open(jsonl, encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                megatron_lines[(r["family"], r["policy"])] = r

    report = {"megatron_commit": MEGATRON_COMMIT, "date": time.strftime("%Y-%m-%d"),
              "versions": _versions(a.build), "families": []}
    for fam in families + list(anchors):
        ref = MEGATRON_REFERENCE.get(fam, fam)
        rows = []
        for pol in policies.get(fam, anchors.get(fam)):
            rows.append({"policy": pol,
                         "engine": engine_row(engine_lines.get((fam, pol))),
                         "megatron": megatron_row(megatron_lines.get((ref, pol)),
                                                  SEARCH["warmup_steps"])})
        report["families"].append({"family": fam, "megatron_reference": ref,
                                   "spec": specs[fam], "rows": rows,
                                   "anchor": fam in anchors, "unfused": UNFUSED.get(fam)})
    to_doc.compare(report)
    with open(os.path.join(a.out, "fidelity.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    text = to_doc.render(report, command=os.environ.get("REMAT_FIDELITY_COMMAND", ""))
    with open(os.path.join(a.out, "fidelity.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(to_doc.summary(report))
    return 0


def _versions(build):
    try:
        out = subprocess.check_output([os.path.join(build, "bin", "remat-trial"), "--version"],
                                      text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


if __name__ == "__main__":
    sys.exit(main())
