#!/usr/bin/env python3
"""Measured per-rank peaks of a pipeline-parallel trial against the memory model's per-stage
prediction.

    bench/engine/pipeline_peaks.py BUILD_BIN SPEC.yaml [POLICY ...] [--set section.key=value ...]

Runs every rank of the spec's layout as its own remat-trial process (TCP collectives on CPU, or
NCCL where the binary and the spec's device say so), asks remat-bench-estimate for
search::EstimateMemory's stages, and prints one row per rank: its pipeline stage, the measured and
predicted static bytes and peaks, predicted / measured, and the rank's loss and grad norm (to set
against a PP 1 run of the same spec: `--set parallel.pipeline_model_parallel_size=1`). `--set` edits the spec before the run
(e.g. --set parallel.virtual_pipeline_model_parallel_size=2). Standard library only.
"""
import json
import os
import subprocess
import sys
import tempfile


def edit_spec(text, sets):
    """Applies section.key=value edits to a two-level YAML spec (adds missing keys/sections)."""
    lines = text.splitlines()
    for item in sets:
        path, value = item.split("=", 1)
        section, key = path.split(".", 1)
        try:
            start = lines.index(section + ":")
        except ValueError:
            lines += [section + ":", "  %s: %s" % (key, value)]
            continue
        end = start + 1
        while end < len(lines) and (lines[end].startswith(" ") or not lines[end].strip()):
            end += 1
        for i in range(start + 1, end):
            if lines[i].strip().startswith(key + ":"):
                lines[i] = "  %s: %s" % (key, value)
                break
        else:
            lines.insert(start + 1, "  %s: %s" % (key, value))
    return "\n".join(lines) + "\n"


def field(text, section, key, default):
    inside = False
    for line in text.splitlines():
        if not line.startswith(" "):
            inside = line.strip() == section + ":"
        elif inside and line.strip().startswith(key + ":"):
            return int(line.split(":", 1)[1].split("#")[0].strip())
    return default


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    bin_dir, spec_path = argv[1], argv[2]
    policies, sets, rest = [], [], argv[3:]
    while rest:
        if rest[0] == "--set":
            sets.append(rest[1])
            rest = rest[2:]
        else:
            policies.append(rest[0])
            rest = rest[1:]
    policies = policies or ["selective:[]"]
    text = edit_spec(open(spec_path).read(), sets)
    tp = field(text, "parallel", "tensor_model_parallel_size", 1)
    dp = field(text, "parallel", "data_parallel_size", 1)
    pp = field(text, "parallel", "pipeline_model_parallel_size", 1)
    cp = field(text, "parallel", "context_parallel_size", 1)
    world = tp * cp * dp * pp
    work = tempfile.mkdtemp(prefix="remat-pipeline-peaks-")
    spec = os.path.join(work, "spec.yaml")
    open(spec, "w").write(text)
    estimate = json.loads(subprocess.check_output(
        [os.path.join(bin_dir, "remat-bench-estimate"), "--spec", spec, "--policies",
         ";".join(policies)]))
    print("spec %s %s: TP %d, CP %d, DP %d, PP %d" % (spec_path, " ".join(sets), tp, cp, dp, pp))
    print("| policy | rank | stage | in flight | static MiB (measured / model) | peak MiB (measured / model) | model / measured | loss | grad norm |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for policy in policies:
        rendezvous = tempfile.mkdtemp(dir=work)
        procs = [subprocess.Popen(
            [os.path.join(bin_dir, "remat-trial"), "--spec", spec, "--policy", policy, "--rank",
             str(r), "--world-size", str(world), "--rendezvous", rendezvous, "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for r in range(world)]
        results = [json.loads(p.communicate()[0]) for p in procs]
        stages = estimate["estimates"][policy]["stages"]
        for r, res in enumerate(results):
            if res["status"] != "ok":
                print("| `%s` | %d | | | %s: %s | | |" % (policy, r, res["status"], res.get("message")))
                continue
            stage = r // (tp * cp * dp)
            st = stages[stage]
            mine = res["ranks"][0]
            mib = 1 << 20
            print("| `%s` | %d | %d | %d | %.2f / %.2f | %.2f / %.2f | %.3f | %.6f | %.6f |" % (
                policy, r, stage, st["in_flight"], mine["static_bytes"] / mib,
                st["static_bytes"] / mib, mine["peak_allocated_bytes"] / mib,
                st["peak_bytes"] / mib, st["peak_bytes"] / mine["peak_allocated_bytes"],
                res["loss"], res["grad_norm"]))


if __name__ == "__main__":
    main(sys.argv)
