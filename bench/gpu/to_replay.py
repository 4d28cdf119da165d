#!/usr/bin/env python3
"""Turns a search result JSON (`remat get ID --json`) into a replay table (contract: "Replay
tables"), so a measured search can be replayed without a GPU: e.g. the exhaustive H200 searches
in docs/results/ let the guided strategy be evaluated on real measurements on any machine.

Usage: to_replay.py RESULT.json [WALL_S] > TABLE.json
       to_replay.py --jsonl TRIALS.jsonl > TABLE.json   (remat-trial --json lines, e.g. from
                                                        bench/gpu/exhaustive_table.sh; each
                                                        trial keeps its own wall time and every
                                                        rank's measured step times)
"""
import json
import sys


RANK_KEYS = ("rank", "peak_allocated_bytes", "peak_reserved_bytes", "static_bytes", "step_time_s",
             "step_times_s")


def from_jsonl(path):
    trials = {}
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        t = json.loads(line)
        entry = {"status": t.get("status", "failed"), "step_time_s": t.get("step_time_s") or 0.0}
        for key in ("wall_s", "loss", "grad_norm", "message"):
            if t.get(key) not in (None, ""):
                entry[key] = t[key]
        entry["ranks"] = [{k: r[k] for k in RANK_KEYS if k in r} for r in t.get("ranks", [])]
        trials[t["policy"]] = entry
    return trials


def Rank(r):
    """A rank's peaks, and its measured steps when the result has them: a replayed trial's
    median interval comes from them (search/noise.h)."""
    out = {k: r[k] for k in ("rank", "peak_allocated_bytes", "peak_reserved_bytes")}
    if r.get("step_times_s"):
        out["step_times_s"] = r["step_times_s"]
        out["step_time_s"] = r["step_time_s"]
    return out


def main():
    if sys.argv[1] == "--jsonl":
        json.dump({"trials": from_jsonl(sys.argv[2])}, sys.stdout, indent=1, sort_keys=True)
        print()
        return
    result = json.load(open(sys.argv[1]))
    wall = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    trials = {}
    for t in result["trials"]:
        if t["status"] not in ("ok", "oom", "failed", "timeout", "invalid"):
            continue
        # The result writes null for what a trial did not measure.
        entry = {"status": t["status"], "step_time_s": t.get("step_time_s") or 0.0,
                 "ranks": [Rank(r) for r in t.get("ranks", [])]}
        if t.get("step_time_spread_s"):  # older results' only trace of their steps' noise
            entry["step_time_spread_s"] = t["step_time_spread_s"]
        if wall > 0:
            entry["wall_s"] = wall
        if t.get("message"):
            entry["message"] = t["message"]
        trials[t["policy"]] = entry
    json.dump({"trials": trials}, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
