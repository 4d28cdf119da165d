#!/usr/bin/env python3
"""A stand-in for worker/megatron_driver/remat_megatron_driver.py in the executor tests: same
command line, no torch. It reads the spec the executor wrote through the driver's real mapping
(mapping.map_trial) and writes its metrics through the driver's real writer (metrics.py), so the
C++ reader is tested against the driver's own format. What it does is chosen by the spec's name:

  ok      every rank writes an ok result: peak = 1000 x layers + 100 x rank + 500 bytes, step
          times 0.1 x layers (two warm-up steps slower), the plan's summary as its message
  oom     rank 0 writes status oom (with PyTorch's "Tried to allocate" figure), the others ok
  oomhang rank 0 writes status oom and exits; the others hang (in a collective, say)
  crash   rank 0 prints a traceback ending in "CUDA out of memory" and exits 1 without a file
  fail    the last rank exits 3 without a file, after "boom" on stderr
  hang    every rank sleeps (the trial timeout ends it)
"""

import json
import os
import sys
import time

# REMAT_SOURCE_DIR, or this file's checkout (a Slurm job passes no such variable on).
SOURCE_DIR = os.environ.get("REMAT_SOURCE_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(SOURCE_DIR, "worker"))
from megatron_driver import mapping, metrics  # noqa: E402


def arg(name, default=None):
    argv = sys.argv[1:]
    return argv[argv.index(name) + 1] if name in argv else default


def main():
    with open(arg("--spec"), encoding="utf-8") as f:
        spec = json.load(f)
    rank = int(arg("--rank", "0"))
    world = int(arg("--world-size", "1"))
    out = metrics.rank_file(arg("--metrics"), rank)
    mode = spec.get("name", "ok")
    try:
        plan = mapping.map_trial(spec, arg("--policy"))
    except mapping.Unsupported as exc:
        metrics.write_atomic(out, metrics.document([], status="invalid", message=str(exc)))
        return 0
    layers = plan["config"]["num_layers"]
    sys.stderr.write("fake driver rank %d: %s, megatron-path %s, CUDA_VISIBLE_DEVICES=%s\n" % (
        rank, mapping.megatron_settings_line(plan), arg("--megatron-path", "-"),
        os.environ.get("CUDA_VISIBLE_DEVICES", "")))
    if mode == "hang" or (mode == "oomhang" and rank > 0):
        time.sleep(60)
    if mode == "crash" and rank == 0:
        sys.stderr.write("Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of "
                         "memory. Tried to allocate 2.00 GiB\n")
        return 1
    if mode == "fail" and rank == world - 1:
        sys.stderr.write("boom\n")
        return 3
    if mode in ("oom", "oomhang") and rank == 0:
        metrics.write_atomic(out, metrics.document([metrics.rank_entry(
            rank, status="oom", message="CUDA out of memory. Tried to allocate 1.50 GiB",
            peak_allocated_bytes=7000, peak_reserved_bytes=8000,
            failing_request_bytes=metrics.failing_request_bytes("Tried to allocate 1.50 GiB"))]))
        return 0
    # As many steps as the real driver runs: the longest warm-up, then the measured ones.
    steps = [0.5, 0.3] + [0.1 * layers] * (plan["run"]["warmup_max_steps"] - 2 +
                                           plan["run"]["measure_steps"])
    metrics.write_atomic(out, metrics.document([metrics.rank_entry(
        rank, message="layers=%d %s" % (layers, mapping.megatron_settings_line(plan)),
        peak_allocated_bytes=1000 * layers + 100 * rank + 500,
        peak_reserved_bytes=2000 * layers + 100 * rank + 500,
        step_times_s=steps, losses=[9.0, 8.0, 7.5, 7.0, 6.5], grad_norms=[3.0, 2.0, 1.5],
        static_bytes=400, setup_s=1.25 + rank)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
