"""The worker's metrics file (worker/README.md, "The metrics file"), written by the driver: one
file per rank, `<metrics>.rank<N>`, written to a temporary name and renamed so the worker never
reads half a file. Pure Python.

Beyond the README's keys the driver writes a top-level "status": "invalid" when it refuses the
trial (a spec feature or policy it cannot map: mapping.Unsupported), and per rank "setup_s"
(process start to the first step: imports, CUDA and NCCL initialisation, model and optimizer
build).
"""

import json
import os
import re


def rank_entry(rank, status="ok", message="", peak_allocated_bytes=0, peak_reserved_bytes=0,
               step_times_s=(), losses=(), grad_norms=(), static_bytes=0, alloc_retries=0,
               failing_request_bytes=0, setup_s=None):
    entry = {
        "rank": int(rank),
        "status": status,
        "message": message,
        "peak_allocated_bytes": int(peak_allocated_bytes),
        "peak_reserved_bytes": int(peak_reserved_bytes),
        "step_times_s": [float(x) for x in step_times_s],
        "losses": [float(x) for x in losses],
        "grad_norms": [float(x) for x in grad_norms],
        "static_bytes": int(static_bytes),
        "alloc_retries": int(alloc_retries),
        "failing_request_bytes": int(failing_request_bytes),
    }
    if setup_s is not None:
        entry["setup_s"] = float(setup_s)
    return entry


def document(ranks, status=None, message=""):
    """The file's object: `ranks` (rank_entry dicts) and an optional job-level status
    (ok | oom | failed | invalid) and message."""
    doc = {"ranks": list(ranks)}
    if status is not None:
        doc["status"] = status
    if message:
        doc["message"] = message
    return doc


def rank_file(metrics_path, rank):
    return "%s.rank%d" % (metrics_path, rank)


def write_atomic(path, doc):
    tmp = "%s.tmp%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
        f.write("\n")
    os.replace(tmp, path)


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def failing_request_bytes(message):
    """The failed allocation's size from PyTorch's out-of-memory message ('Tried to allocate
    1.50 GiB'); 0 when the message does not say."""
    m = re.search(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)", message or "")
    if not m:
        return 0
    return int(float(m.group(1)) * _UNITS[m.group(2)])
