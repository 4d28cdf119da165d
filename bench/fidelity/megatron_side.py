#!/usr/bin/env python3
"""The Megatron Core side of the fidelity bench: every (family, policy) of a plan file in ONE
process (MoE families excepted: one process per policy, see _isolated), so Python start-up, Megatron's imports, NCCL initialisation and the load_inline build of
CheckpointWithoutOutput's extension are paid once. Each policy gets a fresh GPTModel and
optimizer (the driver's runner.Session.run: reset_peak_memory_stats, build, steps), so its peak
is its own.

  megatron_side.py --plan PLAN.json --jsonl OUT.jsonl --megatron-path DIR [--deadline UNIX_S]

PLAN.json: [{"family": NAME, "spec": SPEC, "policies": [P, ...]}, ...]. One JSON line per trial:
{"family", "policy", "status", "message", "rank": <metrics rank entry>, "wall_s"}; a trial left
when the deadline has passed is written with status "skipped".
"""

import argparse
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "worker"))

from megatron_driver import mapping  # noqa: E402


def log(msg):
    sys.stderr.write("megatron-side: %s\n" % msg)
    sys.stderr.flush()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--plan", required=True)
    p.add_argument("--jsonl", required=True)
    p.add_argument("--megatron-path", required=True)
    p.add_argument("--deadline", type=float, default=0)
    a = p.parse_args()
    with open(a.plan, encoding="utf-8") as f:
        plan = json.load(f)
    sys.path.insert(0, a.megatron_path)
    try:
        import megatron.core  # noqa: F401,PLC0415
        from megatron_driver import runner  # noqa: PLC0415
    except Exception as exc:  # noqa: BLE001 - every row says why nothing ran
        traceback.print_exc()
        with open(a.jsonl, "a", encoding="utf-8") as out:
            for family in plan:
                for policy in family["policies"]:
                    out.write(json.dumps({"family": family["family"], "policy": policy,
                                          "status": "failed",
                                          "message": "cannot import Megatron Core: %s" % exc})
                              + "\n")
        return 1

    session = None
    with open(a.jsonl, "a", encoding="utf-8") as out:
        for family in plan:
            if family["spec"].get("model", {}).get("num_moe_experts") and len(plan) * len(
                    family["policies"]) > 1:
                # Megatron Core's MoE layers leave memory behind after their model is gone (seen
                # on the H200, 2026-12-01: the peak grew by 4-5 GiB a policy when they shared a
                # process), so each MoE policy runs in a process of its own.
                out.flush()
                _isolated(a, family)
                continue
            for policy in family["policies"]:
                line = {"family": family["family"], "policy": policy}
                if a.deadline and time.time() > a.deadline:
                    line.update(status="skipped", message="time budget spent")
                    out.write(json.dumps(line) + "\n")
                    continue
                try:
                    trial = mapping.map_trial(family["spec"], policy,
                                              have_te=_importable("transformer_engine"),
                                              have_apex=_importable("apex"))
                except (mapping.Unsupported, ValueError) as exc:
                    line.update(status="invalid", message=str(exc))
                    out.write(json.dumps(line) + "\n")
                    out.flush()
                    continue
                t0 = time.monotonic()
                try:
                    if session is None:
                        session = runner.Session(trial["parallel"], 0, 1,
                                                 "tcp://127.0.0.1:%d" % _free_port(), 300, log)
                    entry = session.run(trial)
                    line.update(status=entry["status"], message=entry["message"], rank=entry)
                except Exception as exc:  # noqa: BLE001 - a broken trial is a row, not the end
                    traceback.print_exc()
                    line.update(status="failed", message=str(exc)[-800:])
                line["wall_s"] = time.monotonic() - t0
                out.write(json.dumps(line) + "\n")
                out.flush()
                log("%s %s: %s in %.1f s" % (family["family"], policy, line["status"],
                                             line["wall_s"]))
    if session is not None:
        session.close()
    return 0


def _isolated(a, family):
    """Runs each policy of `family` through this program in a fresh process (one-policy plans)."""
    import subprocess  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    for policy in family["policies"]:
        one = dict(family, policies=[policy])
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump([one], f)
        try:
            subprocess.run([sys.executable, os.path.abspath(__file__), "--plan", f.name,
                            "--jsonl", a.jsonl, "--megatron-path", a.megatron_path,
                            "--deadline", str(a.deadline)], check=False)
        finally:
            os.unlink(f.name)


def _importable(name):
    import importlib.util  # noqa: PLC0415
    return importlib.util.find_spec(name) is not None


def _free_port():
    import socket  # noqa: PLC0415
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
