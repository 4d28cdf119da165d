#!/usr/bin/env python3
"""The table of bench/gpu/recipe_search.sh: per recipe, NVIDIA's published layout and recompute,
remat's recommendation from the layout-proxy search, and for every trial the measured peak of each
stage proxy beside the plan's prediction for that stage and policy; or the refusal.

  python3 bench/gpu/recipe_table.py OUT [OUT2 ...] [--json FILE] > table.md

Reads OUT/<recipe>/{spec.yaml, plan.json, search.json, refused.txt, import.txt, skipped.txt}
as recipe_search.sh writes them; several OUT folders (one per device call) are merged, a later
folder's recipe replacing an earlier one's. Standard library only."""

import argparse
import json
import os
import re
import sys

GIB = 1024.0 ** 3


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def spec_sections(text):
    """The two-level `section:\\n  key: value` YAML that `remat import` writes, as dicts."""
    out, section = {}, None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" ") and line.rstrip().endswith(":"):
            section = out.setdefault(line.strip()[:-1], {})
        elif section is not None and line.startswith("  ") and ":" in line:
            k, v = line.strip().split(":", 1)
            section[k.strip()] = v.strip().strip('"')
    return out


def published_layout(spec):
    p, t = spec.get("parallel", {}), spec.get("train", {})
    g = lambda k, d="1": p.get(k, d) if p.get(k, d) not in ("null", "") else d
    parts = ["TP %s" % g("tensor_model_parallel_size")]
    if g("context_parallel_size") != "1":
        parts.append("CP %s" % g("context_parallel_size"))
    pp = "PP %s" % g("pipeline_model_parallel_size")
    if g("virtual_pipeline_model_parallel_size", "null") != "null":
        pp += " x VPP %s" % g("virtual_pipeline_model_parallel_size")
    parts.append(pp)
    if g("expert_model_parallel_size") != "1":
        parts.append("EP %s" % g("expert_model_parallel_size"))
    parts.append("DP %s" % g("data_parallel_size"))
    parts.append("GBS %s" % t.get("global_batch_size", "?"))
    return ", ".join(parts)


def published_recompute(spec_text):
    # `remat import` names the recipe's own recompute in a comment; none when the recipe has none.
    m = re.search(r"the recipe's own recompute \(([^)]*)\)", spec_text or "")
    return m.group(1) if m else "none (selective:[])"


def stage_of(role):
    m = re.search(r"stage (\d+)", role or "")
    return int(m.group(1)) if m else None


def ranks_per_stage(spec):
    p = spec.get("parallel", {})
    n = 1
    for k in ("tensor_model_parallel_size", "context_parallel_size", "data_parallel_size"):
        v = p.get(k, "1")
        n *= int(v) if v.isdigit() else 1
    return n


def trial_rows(search, plan, per_stage):
    planned = {c["policy"]: c for c in (plan or {}).get("candidates", [])}
    rows = []
    for t in search.get("trials", []):
        cand = planned.get(t["policy"])
        pred = {s["stage"]: s["predicted_peak_bytes"] for s in cand["stages"]} if cand else {}
        stages = []
        for p in t.get("proxies") or []:
            for r in p.get("ranks", []):
                # A layout proxy names the stage it stood for; else the rank places it
                # (search/rank_layout.h: the stage's ranks are consecutive).
                s = stage_of(p.get("role"))
                if s is None:
                    s = r["rank"] // per_stage
                stages.append({
                    "stage": s, "rank": r["rank"],
                    "measured_allocated_gib": r["peak_allocated_bytes"] / GIB,
                    "measured_reserved_gib": r["peak_reserved_bytes"] / GIB,
                    "planned_gib": pred[s] / GIB if s in pred else None,
                })
        rows.append({
            "policy": t["policy"], "status": t["status"], "reason": t.get("reason", ""),
            "peak_reserved_gib": (t["peak_reserved_bytes"] or 0) / GIB,
            "peak_allocated_gib": (t["peak_allocated_bytes"] or 0) / GIB,
            "tokens_per_s": t.get("tokens_per_s"), "wall_s": t.get("wall_s"),
            "planned_peak_gib": cand["predicted_peak_bytes"] / GIB if cand else None,
            "planned_peak_stage": cand["peak_stage"] if cand else None,
            "stages": stages,
        })
    return rows


def collect(folder, recipe):
    d = os.path.join(folder, recipe)
    spec_text = read(os.path.join(d, "spec.yaml")) or ""
    spec = spec_sections(spec_text)
    row = {"recipe": recipe, "layout": published_layout(spec) if spec else "",
           "published_recompute": published_recompute(spec_text)}
    plan_text = read(os.path.join(d, "plan.json"))
    plan = json.loads(plan_text) if plan_text else None
    search_text = read(os.path.join(d, "search.json"))
    for name, state in (("import.txt", "import failed"), ("refused.txt", "refused"),
                        ("skipped.txt", "skipped")):
        text = (read(os.path.join(d, name)) or "").strip()
        if text and not (name == "import.txt" and spec_text.strip()) and not search_text:
            row.update(state=state, note=text.splitlines()[0])
            return row
    if not search_text:
        row.update(state="not run", note="no search.json (see search.txt)")
        return row
    search = json.loads(search_text)
    rc = (read(os.path.join(d, "search.rc")) or "").split()
    row.update(state=search.get("state", "?"), recommendation=search.get("recommendation"),
               frontier=search.get("frontier", []), trials=trial_rows(search, plan, ranks_per_stage(spec)),
               search_wall_s=int(rc[1]) if len(rc) > 1 else None,
               note=search.get("message", ""))
    return row


def cell(t):
    s = "`%s` %s" % (t["policy"], t["status"])
    if t["stages"]:
        top = max(t["stages"], key=lambda x: x["measured_reserved_gib"])
        s += ": %.2f/%.2f GiB (alloc/res, stage %s)" % (
            top["measured_allocated_gib"], top["measured_reserved_gib"], top["stage"])
        if top["planned_gib"] is not None:
            s += ", plan %.2f" % top["planned_gib"]
    elif t["planned_peak_gib"] is not None:
        s += " (plan %.2f GiB, stage %s)" % (t["planned_peak_gib"], t["planned_peak_stage"])
    return s


def markdown(rows):
    out = ["| recipe | published layout | published recompute | remat's recommendation | "
           "trials: measured peak stage vs the plan | note |",
           "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "trials" in r:
            rec = ("`%s`" % r["recommendation"] if r.get("recommendation")
                   else "none (%s)" % r["state"])
            trials = "<br>".join(cell(t) for t in r["trials"]) or "no trial finished"
            note = r.get("note", "")
            if r.get("search_wall_s") is not None:
                note = ("search %d s. " % r["search_wall_s"]) + note
        else:
            rec, trials, note = "-", "-", "%s: %s" % (r["state"], r.get("note", ""))
        out.append("| %s | %s | %s | %s | %s | %s |" % (
            r["recipe"], r["layout"], r["published_recompute"], rec, trials,
            note.replace("|", "\\|")))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = {}
    for folder in a.folders:
        for recipe in sorted(os.listdir(folder)):
            if os.path.isdir(os.path.join(folder, recipe)):
                rows[recipe] = collect(folder, recipe)
    rows = [rows[k] for k in sorted(rows)]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
