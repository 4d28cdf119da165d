#!/usr/bin/env python3
"""Writes the further recorded runs of a replay table's policies as replay tables of their own,
so a replayed search's re-measure is served a different measurement than the table's
(tests/search/replay_surfaces.h, Draws; remat-search-bench reads them).

Usage: redraws.py TRIALS.jsonl TABLE.json OUT_PREFIX
  TRIALS.jsonl: every remat-trial --json line of the exhaustive runs (several per policy where a
  policy was measured more than once); TABLE.json: the replay table made from them (one run per
  policy). Writes OUT_PREFIX-1.json, OUT_PREFIX-2.json, ...: file N holds, for each policy with
  more runs than the table's, its N-th run that is not the table's, in the order measured.
"""
import json
import sys

sys.path.insert(0, __file__.rsplit("/", 3)[0] + "/bench/gpu")
from to_replay import RANK_KEYS  # noqa: E402  (one list of the rank fields a table keeps)


def entry(t):
    out = {"status": t.get("status", "failed"), "step_time_s": t.get("step_time_s") or 0.0}
    for key in ("wall_s", "loss", "grad_norm", "message"):
        if t.get(key) not in (None, ""):
            out[key] = t[key]
    out["ranks"] = [{k: r[k] for k in RANK_KEYS if k in r} for r in t.get("ranks", [])]
    return out


def main():
    jsonl, table_path, prefix = sys.argv[1:4]
    table = json.load(open(table_path))["trials"]
    if isinstance(table, list):
        table = dict(table)
    runs = {}
    for line in open(jsonl):
        if line.strip():
            t = json.loads(line)
            runs.setdefault(t["policy"], []).append(entry(t))
    files = []
    for policy, measured in sorted(runs.items()):
        kept = table.get(policy)
        # The table's run is the one with the same steps; the others are further draws.
        others = [m for m in measured if kept is None or m["ranks"] != kept.get("ranks")]
        if kept is not None and len(others) == len(measured):
            sys.exit("error: %s: the table's run is not among the trials' lines" % policy)
        for n, m in enumerate(others):
            while len(files) <= n:
                files.append({})
            files[n][policy] = m
    for n, trials in enumerate(files, 1):
        with open("%s-%d.json" % (prefix, n), "w") as f:
            json.dump({"trials": trials}, f, indent=1, sort_keys=True)
            f.write("\n")
        print("%s-%d.json: %d policies" % (prefix, n, len(trials)))


if __name__ == "__main__":
    main()
