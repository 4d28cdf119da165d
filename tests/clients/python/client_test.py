"""remat_client against the real programs: rematd and a remat-worker on loopback.

Submits examples/tiny-dense.yaml from Python, watches it to the end through a callback, and
checks get() and rows() against what `remat get --json` reports for the same search; then the
errors: a spec the client cannot encode (SpecError naming the key), one the coordinator refuses
(RematError with INVALID_ARGUMENT naming the field) and an unknown id (NOT_FOUND).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

ARGS = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveCoordinator(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="remat-py-")
        cls.address = "127.0.0.1:%d" % free_port()
        cls.procs = []
        for v in ("REMAT_TOKEN", "REMAT_COORDINATOR", "REMAT_WORKER_TOKEN"):
            os.environ.pop(v, None)
        cls.start("rematd", ["--listen", cls.address, "--db", cls.dir + "/remat.db",
                             "--lease-timeout", "1", "--heartbeat-interval", "0.2"])
        deadline = time.time() + 20
        host, port = cls.address.split(":")
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError("rematd did not listen on " + cls.address + cls.logs())
                time.sleep(0.05)
        cls.start("remat-worker", ["--coordinator", cls.address, "--plain-slots", "1",
                                   "--work-dir", cls.dir + "/worker"])

    @classmethod
    def start(cls, program, args):
        log = open(os.path.join(cls.dir, program + ".log"), "w")
        p = subprocess.Popen([os.path.join(ARGS.bin_dir, program)] + args, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        cls.procs.append(p)

    @classmethod
    def logs(cls):
        out = ""
        for name in ("rematd.log", "remat-worker.log"):
            path = os.path.join(cls.dir, name)
            if os.path.exists(path):
                with open(path) as f:
                    out += "\n---- %s\n%s" % (name, "".join(f.readlines()[-20:]))
        return out

    @classmethod
    def tearDownClass(cls):
        for p in cls.procs:  # each in its own session: its group holds its trial children
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def client(self):
        from remat_client import Client
        return Client(self.address, timeout=20)

    def test_tiny_dense_from_python(self):
        spec = os.path.join(ARGS.source_dir, "examples", "tiny-dense.yaml")
        c = self.client()
        sid = c.submit(spec)
        self.assertTrue(sid.startswith("s-"), sid)
        updates = []
        final = c.watch(sid, updates.append)
        self.assertEqual(final["state"], "succeeded", final["message"] + self.logs())
        self.assertGreater(len(updates), 0)
        self.assertEqual(updates[-1]["state"], "succeeded")
        self.assertEqual(updates[-1]["trials_done"], final["trials_done"])
        self.assertEqual(final["spec"]["name"], "tiny-dense")  # the file's own name
        self.assertEqual(final["spec"]["model"]["num_layers"], 2)
        self.assertIsInstance(final["memory_budget_bytes"], int)

        # The CLI's view of the same search is the reference for what the rows say.
        cli = subprocess.run([os.path.join(ARGS.bin_dir, "remat"), "get", sid, "--json",
                              "--coordinator", self.address],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(cli.returncode, 0, cli.stderr)
        ref = json.loads(cli.stdout)
        rows = c.rows(sid)
        self.assertEqual([r["policy"] for r in rows], [t["policy"] for t in ref["trials"]])
        self.assertEqual([r["status"] for r in rows], [t["status"] for t in ref["trials"]])
        self.assertEqual(final["recommendation"], ref["recommendation"])
        self.assertEqual(final["apply"]["megatron_bridge"], ref["apply"]["megatron_bridge"])
        budget = ref["memory_budget_bytes"]
        by_policy = {t["policy"]: t for t in ref["trials"]}
        # The README's first search: the control does not fit, something else does.
        self.assertEqual(by_policy["selective:[]"]["status"], "oom")
        self.assertTrue(any(r["recommended"] for r in rows))
        # Row by row: a near-tie's re-measure repeats its policy.
        for r, t in zip(rows, ref["trials"]):
            if r["status"] == "ok":
                self.assertEqual(r["peak_reserved_bytes"], t["peak_reserved_bytes"])
                self.assertEqual(r["memory_bytes"], t["peak_" + ref["memory_metric"] + "_bytes"])
                self.assertAlmostEqual(r["tokens_per_s"], t["tokens_per_s"], places=3)
            else:
                self.assertIsNone(r["tokens_per_s"])
            self.assertEqual(r["on_frontier"], r["policy"] in ref["frontier"])
            if r["on_frontier"]:
                self.assertEqual(r["status"], "ok")
                self.assertLessEqual(r["memory_bytes"], budget)
        self.assertEqual([s["id"] for s in c.list() if s["id"] == sid], [sid])

    def test_dict_spec_refused_by_the_coordinator_names_the_field(self):
        from remat_client import RematError
        spec = {"model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                          "seq_length": 128, "vocab_size": 512, "normalization": "BatchNorm"},
                "search": {"backend": "builtin", "device": "cpu"}}
        with self.assertRaises(RematError) as e:
            self.client().submit(spec)
        self.assertEqual(e.exception.code.name, "INVALID_ARGUMENT")
        self.assertIn("normalization", e.exception.details)

    def test_unknown_id_is_not_found(self):
        from remat_client import RematError
        with self.assertRaises(RematError) as e:
            self.client().get("s-does-not-exist")
        self.assertEqual(e.exception.code.name, "NOT_FOUND")


class CoordinatorRestart(unittest.TestCase):
    """A Python watch outlives a restart of rematd: the watch starts while the search waits for
    a worker, rematd is stopped (SIGTERM, so its watch streams end UNAVAILABLE) and kept down for
    a few seconds (the watch's state reads fail UNAVAILABLE meanwhile), started again on the same
    port and database, and only then does a worker come; the watch returns the final state."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="remat-py-restart-")
        self.address = "127.0.0.1:%d" % free_port()
        self.procs = {}

    def tearDown(self):
        for p in self.procs.values():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, program, args):
        log = open(os.path.join(self.dir, program + ".log"), "a")
        self.procs[program] = subprocess.Popen(
            [os.path.join(ARGS.bin_dir, program)] + args, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def start_rematd(self):
        self.start("rematd", ["--listen", self.address, "--db", self.dir + "/remat.db",
                              "--lease-timeout", "1", "--heartbeat-interval", "0.2",
                              "--drain", "1"])
        host, port = self.address.split(":")
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                return
            except OSError:
                self.assertLess(time.time(), deadline, "rematd did not listen")
                time.sleep(0.05)

    def test_watch_returns_the_final_state_across_a_restart(self):
        import threading
        from remat_client import Client, RematError
        self.start_rematd()
        c = Client(self.address, timeout=5)
        sid = c.submit(os.path.join(ARGS.source_dir, "examples", "tiny-dense.yaml"))
        updates = []
        first = threading.Event()
        outcome = {}

        def on_update(p):
            updates.append(p)
            first.set()

        def run():
            try:
                outcome["final"] = c.watch(sid, on_update)  # default bound: 60 s of silence
            except Exception as e:  # noqa: BLE001 -- reported by the main thread
                outcome["error"] = e

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.assertTrue(first.wait(20), "no first update %r" % outcome)
        self.assertEqual(updates[0]["state"], "queued")
        rematd = self.procs.pop("rematd")
        rematd.send_signal(signal.SIGTERM)
        self.assertEqual(rematd.wait(20), 0)
        time.sleep(3)  # the watch keeps trying while nothing listens
        self.assertTrue(t.is_alive(), "watch ended while rematd was down: %r" % outcome)
        self.start_rematd()
        self.start("remat-worker", ["--coordinator", self.address, "--plain-slots", "1",
                                    "--work-dir", self.dir + "/worker"])
        t.join(120)
        self.assertFalse(t.is_alive(), "watch did not return")
        self.assertNotIn("error", outcome)
        self.assertEqual(outcome["final"]["state"], "succeeded", outcome["final"]["message"])
        self.assertEqual(updates[-1]["state"], "succeeded")

        # Bounded: with the coordinator gone for good the watch gives up with UNAVAILABLE.
        rematd = self.procs.pop("rematd")
        rematd.send_signal(signal.SIGTERM)
        rematd.wait(20)
        start = time.monotonic()
        with self.assertRaises(RematError) as e:
            c.watch(sid, max_quiet_s=1)
        self.assertEqual(e.exception.code.name, "UNAVAILABLE")
        self.assertLess(time.monotonic() - start, 15)


class SpecEncoding(unittest.TestCase):
    def test_unknown_key_and_wrong_type_name_the_key(self):
        from remat_client import SpecError, to_proto
        base = {"model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                          "seq_length": 128, "vocab_size": 512}}
        with self.assertRaisesRegex(SpecError, r"^model\.tensor_model_parallel_size: unknown key"):
            to_proto({"model": dict(base["model"], tensor_model_parallel_size=2)})
        with self.assertRaisesRegex(SpecError, r"^train\.micro_batch_size: "):
            to_proto(dict(base, train={"micro_batch_size": "two"}))
        with self.assertRaisesRegex(SpecError, r"^model\.gated_linear_unit: must be true or false"):
            to_proto({"model": dict(base["model"], gated_linear_unit=1)})
        with self.assertRaisesRegex(SpecError, r"^optimizer: unknown key"):
            to_proto(dict(base, optimizer={"lr": 1e-4}))

    def test_yaml_text_and_lists(self):
        from remat_client import to_proto
        msg, _ = to_proto("model: {num_layers: 4, hidden_size: 64, num_attention_heads: 4,\n"
                          "  seq_length: 128, vocab_size: 512, num_moe_experts: 4,\n"
                          "  moe_layer_freq: [0, 1, 1, 1]}\n"
                          "search: {proxy_layers: [2, 4], memory_budget_gib: 1}\n")
        self.assertEqual(list(msg.model.moe_layer_pattern), [0, 1, 1, 1])
        self.assertFalse(msg.model.HasField("moe_layer_freq"))
        self.assertEqual(list(msg.search.proxy_layers), [2, 4])
        self.assertEqual(msg.search.memory_budget_gib, 1.0)
        self.assertFalse(msg.model.HasField("ffn_hidden_size"))  # left to the coordinator

    def test_null_q_lora_rank_means_no_q_compression(self):
        from remat_client import to_proto
        base = "model: {num_layers: 4, hidden_size: 64, num_attention_heads: 4, seq_length: 128,\n" \
               "  vocab_size: 512, multi_latent_attention: true"
        msg, _ = to_proto(base + ", q_lora_rank: null}\n")
        self.assertTrue(msg.model.HasField("q_lora_rank"))
        self.assertEqual(msg.model.q_lora_rank, 0)  # null, not the default 512
        msg, _ = to_proto(base + "}\n")
        self.assertFalse(msg.model.HasField("q_lora_rank"))  # the default, left to the coordinator


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--client-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    sys.path.insert(0, ARGS.client_dir)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
