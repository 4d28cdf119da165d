#!/usr/bin/env python3
"""remat's megatron backend: one rank of one trial run by Megatron Core itself.

  remat_megatron_driver.py --spec SPEC.json --policy POLICY --metrics FILE
        [--rank R --world-size W --rendezvous DIR] [--megatron-path DIR]
        [--collective-timeout S]
      One rank (the worker starts one process per rank, CUDA_VISIBLE_DEVICES = its GPU). Writes
      FILE.rank<R> in the worker's metrics format (worker/README.md) and exits 0 whenever it wrote
      a result (ok, oom, invalid); 1 when the run itself broke (the file then says failed, with
      the error), 2 for bad arguments.
  remat_megatron_driver.py --spec SPEC.json --policies 'P1;P2;...' --jsonl FILE [--megatron-path DIR]
      Bench mode (one rank): every policy in this one process, each with a fresh model and
      optimizer and its own peak (reset_peak_memory_stats); one JSON line per policy
      {"policy", "status", "message", "plan", "rank": <metrics rank entry>}.
  remat_megatron_driver.py --spec SPEC.json --policy POLICY --check
      The mapping only (no torch): prints the plan as JSON, or the refusal; exit 0 / 3.

SPEC.json is the YAML spec's structure in JSON (the worker writes the resolved spec). The
megatron-path (or $REMAT_MEGATRON_PATH) is a Megatron-LM checkout, or any folder holding the
`megatron/core` package; without it an installed megatron-core is used. Nothing is downloaded.
"""

import argparse
import json
import os
import sys
import time
import traceback

_START = time.monotonic()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_driver import mapping  # noqa: E402  pylint: disable=wrong-import-position
from megatron_driver import metrics  # noqa: E402  pylint: disable=wrong-import-position


def log(msg):
    sys.stderr.write("remat-megatron-driver: %s\n" % msg)
    sys.stderr.flush()


def parse_args(argv):
    p = argparse.ArgumentParser(prog="remat_megatron_driver.py")
    p.add_argument("--spec", required=True)
    p.add_argument("--policy")
    p.add_argument("--policies")
    p.add_argument("--metrics")
    p.add_argument("--jsonl")
    p.add_argument("--check", action="store_true")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--rendezvous")
    p.add_argument("--megatron-path", default=os.environ.get("REMAT_MEGATRON_PATH", ""))
    p.add_argument("--collective-timeout", type=float, default=300.0)
    a = p.parse_args(argv)
    if bool(a.policy) == bool(a.policies):
        p.error("give exactly one of --policy and --policies")
    if a.policies and not a.jsonl:
        p.error("--policies needs --jsonl")
    if a.policy and not a.check and not a.metrics:
        p.error("--policy needs --metrics (or --check)")
    if a.world_size < 1 or not 0 <= a.rank < a.world_size:
        p.error("--rank must be in [0, --world-size)")
    if a.world_size > 1 and not a.rendezvous:
        p.error("a multi-rank trial needs --rendezvous")
    return a


def load_spec(path):
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    if not isinstance(spec, dict):
        raise ValueError("%s: expected a JSON object" % path)
    return spec


def _importable(name):
    try:
        import importlib.util  # noqa: PLC0415
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def installed():
    """What map_trial needs to know about this Python: Transformer Engine, Apex."""
    return {"have_te": _importable("transformer_engine"), "have_apex": _importable("apex")}


def import_megatron(path):
    if path:
        if not os.path.isdir(os.path.join(path, "megatron", "core")):
            raise RuntimeError("--megatron-path %s: no megatron/core package there" % path)
        sys.path.insert(0, path)
    import megatron.core  # noqa: F401,PLC0415  pylint: disable=import-outside-toplevel
    return os.path.dirname(os.path.dirname(megatron.core.__file__))


def init_method(args):
    if args.rendezvous:
        os.makedirs(args.rendezvous, exist_ok=True)
        return "file://" + os.path.join(os.path.abspath(args.rendezvous), "torch-filestore")
    import socket  # noqa: PLC0415
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "tcp://127.0.0.1:%d" % s.getsockname()[1]


def run_one(args, spec):
    out = metrics.rank_file(args.metrics, args.rank)
    try:
        plan = mapping.map_trial(spec, args.policy, **installed())
    except (mapping.Unsupported, ValueError) as exc:
        metrics.write_atomic(out, metrics.document(
            [metrics.rank_entry(args.rank, status="failed", message=str(exc))],
            status="invalid", message=str(exc)))
        log("refused: %s" % exc)
        return 0
    try:
        where = import_megatron(args.megatron_path)
        log("Megatron Core from %s; %s" % (where, _describe(plan)))
        from megatron_driver import runner  # noqa: PLC0415
        session = runner.Session(plan["parallel"], args.rank, args.world_size, init_method(args),
                                 args.collective_timeout, log)
        entry = session.run(plan, setup_start=_START)
        metrics.write_atomic(out, metrics.document([entry]))
        session.close()
        return 0
    except Exception as exc:  # noqa: BLE001 - every failure becomes a result
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        oom = "out of memory" in text.lower()
        metrics.write_atomic(out, metrics.document([metrics.rank_entry(
            args.rank, status="oom" if oom else "failed", message=text[-1500:],
            failing_request_bytes=metrics.failing_request_bytes(text))]))
        traceback.print_exc()
        return 1


def _describe(plan):
    return "%s %s shims=[%s]" % (plan["config_class"], mapping.megatron_settings_line(plan),
                                 ",".join(plan["shims"]))


def run_many(args, spec):
    """Bench mode: one process, one rank, every policy."""
    policies = [p for p in args.policies.split(";") if p.strip()]
    plans = {}
    for p in policies:
        try:
            plans[p] = mapping.map_trial(spec, p, **installed())
        except (mapping.Unsupported, ValueError) as exc:
            plans[p] = exc
    session = None
    with open(args.jsonl, "a", encoding="utf-8") as out:
        for p in policies:
            plan = plans[p]
            line = {"policy": p}
            if isinstance(plan, Exception):
                line.update(status="invalid", message=str(plan))
            else:
                try:
                    if session is None:
                        where = import_megatron(args.megatron_path)
                        log("Megatron Core from %s" % where)
                        from megatron_driver import runner  # noqa: PLC0415
                        session = runner.Session(plan["parallel"], 0, 1, init_method(args),
                                                 args.collective_timeout, log)
                    log("%s: %s" % (p, _describe(plan)))
                    t0 = time.monotonic()
                    entry = session.run(plan, setup_start=t0)
                    line.update(status=entry["status"], message=entry["message"], rank=entry,
                                wall_s=time.monotonic() - t0, plan=_plain(plan))
                except Exception as exc:  # noqa: BLE001
                    traceback.print_exc()
                    line.update(status="failed", message=str(exc)[-1500:])
            out.write(json.dumps(line) + "\n")
            out.flush()
            log("%s: %s" % (p, line["status"]))
    if session is not None:
        session.close()
    return 0


def _plain(plan):
    return json.loads(json.dumps(plan, default=str))


def main(argv):
    args = parse_args(argv)
    try:
        spec = load_spec(args.spec)
    except (OSError, ValueError) as exc:
        sys.stderr.write("error: --spec: %s\n" % exc)
        return 2
    if args.check:
        try:
            plan = mapping.map_trial(spec, args.policy, **installed())
        except (mapping.Unsupported, ValueError) as exc:
            print(json.dumps({"policy": args.policy, "refused": str(exc)}))
            return 3
        print(json.dumps(_plain(plan), indent=1))
        return 0
    if args.policies:
        return run_many(args, spec)
    return run_one(args, spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
