#!/usr/bin/env python3
"""Do remat's apply strings apply cleanly to Megatron Core itself?

For each model family of the fidelity bench (dense GQA, MLA, MoE with sequential and with grouped
experts) it takes every valid policy's apply strings as remat prints them (`remat-bench-estimate`
writes the same strings as `remat validate` and a search's recommendation: search/policy.cc),
applies them over recipes that already set recompute, and builds Megatron Core's own
TransformerConfig (MLATransformerConfig for MLA) from the result, through the megatron driver's
mapping (worker/megatron_driver). A row is ok when the config is accepted and its recompute
settings, after Megatron Core's __post_init__, say exactly the policy.

  Megatron Bridge: the recipe's recompute fields, then the policy's `model.KEY=VALUE` overrides.
  Megatron-LM:     the recipe's command line, less the flags `megatron_lm_remove` names (with their
                   values), plus the policy's flags; parsed as Megatron-LM's recompute flags
                   (below), --recompute-activations turned into selective as its validate_args
                   does, and handed to TransformerConfig under the same names, as its
                   core_transformer_config_from_args does. Megatron-LM's own argument parser is not
                   in the carried tree (megatron/core only), so that part is mirrored here.

A control row reproduces the issue's failure (selective overrides without the resets over a full
recipe) and must be refused: a checker that accepts it checks nothing.

    python3 bench/gpu/check_apply_strings.py --estimate build-gpu/bin/remat-bench-estimate \
        --megatron-path .carry/megatron-lm --out OUT_DIR
Writes OUT_DIR/apply-check.jsonl (one row per family, policy, form and recipe) and
OUT_DIR/apply-check.md (the summary); exit 0 only when every row is as expected. Needs torch and
Megatron Core (no GPU is used). The pure parts (parsing, editing, comparing) are tested on CPU:
tests/bench/check_apply_strings_test.py.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "fidelity"))
sys.path.insert(0, os.path.join(ROOT, "worker"))

RECOMPUTE_KEYS = ("recompute_granularity", "recompute_method", "recompute_num_layers",
                  "recompute_modules")

# The recompute settings a user's recipe may already carry (as tests/search/apply_test.cc's).
BRIDGE_RECIPES = {
    "none": {},
    "full-uniform-1": {"recompute_granularity": "full", "recompute_method": "uniform",
                       "recompute_num_layers": 1},
    "full-block-2+modules": {"recompute_granularity": "full", "recompute_method": "block",
                             "recompute_num_layers": 2, "recompute_modules": ["core_attn"]},
    "selective-core_attn,mlp": {"recompute_granularity": "selective",
                                "recompute_modules": ["core_attn", "mlp"]},
    "selective-default": {"recompute_granularity": "selective"},
}
MEGATRON_LM_RECIPES = {
    "none": "",
    "full-uniform-1": "--recompute-granularity full --recompute-method uniform "
                      "--recompute-num-layers 1",
    "full-block-2-distributed": "--recompute-granularity full --recompute-method block "
                                "--recompute-num-layers 2 --distribute-saved-activations",
    "recompute-activations": "--recompute-activations",
    "selective-core_attn,mlp": "--recompute-granularity selective --recompute-modules core_attn mlp",
}


# ---- pure parts ---------------------------------------------------------------------------------

def parse_bridge_value(text):
    """A Hydra-style override value as Bridge reads it: null, an int, a [a,b] list, else a word."""
    if text == "null":
        return None
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [w.strip() for w in inner.split(",")] if inner else []
    try:
        return int(text)
    except ValueError:
        return text


def apply_bridge(recipe_fields, overrides):
    """The recipe's recompute fields with `overrides` ("model.KEY=VALUE ...") applied; ValueError
    for an override that is not model.KEY=VALUE."""
    fields = dict(recipe_fields)
    for word in overrides.split():
        key, sep, value = word.partition("=")
        if not sep or not key.startswith("model."):
            raise ValueError("not a model.KEY=VALUE override: %r" % word)
        fields[key[len("model."):]] = parse_bridge_value(value)
    return fields


def remove_flags(argv, names):
    """`argv` without each flag in `names` and the values after it (words up to the next --flag)."""
    out, dropping = [], False
    for word in argv:
        if word.startswith("--"):
            dropping = word in names
            if dropping:
                continue
        elif dropping:
            continue
        out.append(word)
    return out


def megatron_lm_parser():
    """Megatron-LM's recompute flags (megatron/training/arguments.py at the pinned commit: names,
    choices and defaults)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--recompute-activations", action="store_true")
    p.add_argument("--recompute-granularity", choices=["full", "selective"], default=None)
    p.add_argument("--recompute-method", choices=["uniform", "block"], default=None)
    p.add_argument("--recompute-num-layers", type=int, default=None)
    p.add_argument("--recompute-modules", nargs="*", default=None)
    p.add_argument("--distribute-saved-activations", action="store_true")
    return p


def apply_megatron_lm(recipe_args, flags, remove):
    """The TransformerConfig recompute fields of a Megatron-LM command line: the recipe's flags
    less `remove`, plus `flags`, parsed; ValueError for a command line the parser refuses."""
    argv = remove_flags(shlex.split(recipe_args), set(remove.split())) + shlex.split(flags)
    try:
        args, unknown = megatron_lm_parser().parse_known_args(argv)
    except SystemExit as exc:
        raise ValueError("Megatron-LM refuses %r" % " ".join(argv)) from exc
    if unknown:
        raise ValueError("unknown flags %s" % unknown)
    if args.recompute_activations:  # Megatron-LM's validate_args
        args.recompute_granularity = "selective"
    return {"recompute_granularity": args.recompute_granularity,
            "recompute_method": args.recompute_method,
            "recompute_num_layers": args.recompute_num_layers,
            "recompute_modules": args.recompute_modules,
            "distribute_saved_activations": args.distribute_saved_activations}


def policy_effect(policy):
    """What a policy string recomputes: ("none",), ("selective", labels) or ("full", method, n)."""
    if policy.startswith("selective:[") and policy.endswith("]"):
        labels = [w for w in policy[len("selective:["):-1].split(",") if w]
        return ("selective", tuple(sorted(labels))) if labels else ("none",)
    parts = policy.split(":")
    if len(parts) == 3 and parts[0] == "full":
        return ("full", parts[1], int(parts[2]))
    raise ValueError("not a policy: %r" % policy)


def config_effect(granularity, method, num_layers, modules):
    """The same for recompute settings as a TransformerConfig holds them after __post_init__."""
    if granularity is None:
        return ("none",)
    if granularity == "selective":
        labels = tuple(sorted(modules or []))
        return ("selective", labels) if labels else ("none",)
    return ("full", method, num_layers)


# ---- Megatron Core ------------------------------------------------------------------------------

def family_base(family_spec, mapping):
    """The driver's mapping of a family's spec to TransformerConfig keyword arguments (recompute
    fields dropped: each row sets them). Grouped-GEMM experts are mapped as sequential ones and the
    flag set back: the driver refuses them for the model it builds, not for the config."""
    spec = json.loads(json.dumps(family_spec))
    grouped = bool(spec["model"].get("moe_grouped_gemm"))
    spec["model"]["moe_grouped_gemm"] = False
    plan = mapping.map_trial(spec, "selective:[]")
    for key in RECOMPUTE_KEYS:
        plan["config"].pop(key, None)
    if grouped:
        plan["config"]["moe_grouped_gemm"] = True
    return plan


def check(plan, fields, policy, runner):
    """(status, message): ok when TransformerConfig accepts `fields` and says `policy`."""
    try:
        config = runner.transformer_config(plan, **fields)
    except Exception as exc:  # noqa: BLE001 - Megatron Core's refusals are AssertionError/ValueError
        return "refused", ("%s: %s" % (type(exc).__name__, exc)).splitlines()[0][:300]
    got = config_effect(config.recompute_granularity, config.recompute_method,
                        config.recompute_num_layers, config.recompute_modules)
    want = policy_effect(policy)
    if got != want:
        return "mismatch", "config says %s, the policy %s" % (got, want)
    return "ok", ""


def estimate(binary, spec_yaml):
    out = subprocess.run([binary, "--spec", spec_yaml], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--estimate", required=True, help="remat-bench-estimate")
    p.add_argument("--megatron-path", required=True, help="a folder holding megatron/core")
    p.add_argument("--out", required=True)
    p.add_argument("--families", default="dense,mla,moe-seq,moe-grouped")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    sys.path.insert(0, os.path.abspath(a.megatron_path))
    import fidelity  # noqa: PLC0415
    from megatron_driver import mapping, runner  # noqa: PLC0415
    import megatron.core  # noqa: F401,PLC0415

    rows = []
    for family in a.families.split(","):
        spec = fidelity.spec_of(family)
        spec_path = os.path.join(a.out, "spec-%s.yaml" % family)
        with open(spec_path, "w", encoding="utf-8") as f:
            f.write(fidelity.to_yaml(spec))
        est = estimate(a.estimate, spec_path)
        plan = family_base(spec, mapping)
        # The control: the failure must be refused.
        status, message = check(plan, apply_bridge(
            BRIDGE_RECIPES["full-uniform-1"],
            "model.recompute_granularity=selective model.recompute_modules=[core_attn]"),
            "selective:[core_attn]", runner)
        rows.append({"family": family, "policy": "selective:[core_attn]", "form": "control",
                     "recipe": "full-uniform-1", "status": status, "message": message,
                     "expected": "refused"})
        for policy in est["valid_policies"]:
            strings = est["apply"][policy]
            for recipe, fields in BRIDGE_RECIPES.items():
                status, message = check(plan, apply_bridge(fields, strings["megatron_bridge"]),
                                        policy, runner)
                rows.append({"family": family, "policy": policy, "form": "bridge",
                             "recipe": recipe, "status": status, "message": message,
                             "expected": "ok"})
            for recipe, args in MEGATRON_LM_RECIPES.items():
                try:
                    fields = apply_megatron_lm(args, strings["megatron_lm"],
                                               strings["megatron_lm_remove"])
                    status, message = check(plan, fields, policy, runner)
                except ValueError as exc:
                    status, message = "refused", str(exc)
                rows.append({"family": family, "policy": policy, "form": "megatron_lm",
                             "recipe": recipe, "status": status, "message": message,
                             "expected": "ok"})
        print("%s: %d policies checked" % (family, len(est["valid_policies"])), flush=True)

    with open(os.path.join(a.out, "apply-check.jsonl"), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    bad = [r for r in rows if r["status"] != r["expected"]]
    lines = ["# Apply strings against Megatron Core's TransformerConfig", "",
             "Megatron Core: %s" % _commit(a.megatron_path), "",
             "| family | rows | as expected | not |", "| --- | --- | --- | --- |"]
    for family in a.families.split(","):
        fam = [r for r in rows if r["family"] == family]
        n_bad = sum(1 for r in fam if r["status"] != r["expected"])
        lines.append("| %s | %d | %d | %d |" % (family, len(fam), len(fam) - n_bad, n_bad))
    if bad:
        lines += ["", "Not as expected:", ""]
        lines += ["- %(family)s %(policy)s %(form)s over %(recipe)s: %(status)s %(message)s" % r
                  for r in bad]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "apply-check.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    return 1 if bad else 0


def _commit(path):
    try:
        with open(os.path.join(path, "REMAT_COMMIT"), encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return "(no REMAT_COMMIT file)"


if __name__ == "__main__":
    sys.exit(main())
