"""The Megatron Bridge metrics callback (worker/megatron_bridge/remat_metrics_callback.py).

    python3 remat_metrics_callback_test.py SOURCE_DIR          CPU: pure logic, and the callback
                                                               against a stand-in torch module
    python3 remat_metrics_callback_test.py SOURCE_DIR --gpu    the budget on a real CUDA device
                                                               (exit 77, skipped, without one)
"""

import atexit
import json
import os
import sys
import tempfile
import types
import unittest

GPU = "--gpu" in sys.argv
if GPU:
    sys.argv.remove("--gpu")
SOURCE = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(SOURCE, "worker", "megatron_bridge"))
sys.path.insert(0, os.path.join(SOURCE, "worker"))

GIB = 1 << 30


class FakeOutOfMemoryError(RuntimeError):
    pass


def fake_torch(total=140 * GIB):
    """Just what the callback calls of torch, recording set_per_process_memory_fraction."""
    calls = []
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        current_device=lambda: 3,
        get_device_properties=lambda d: types.SimpleNamespace(total_memory=total),
        set_per_process_memory_fraction=lambda f, d=None: calls.append((f, d)),
        synchronize=lambda: None,
        memory_stats=lambda: {"num_alloc_retries": 2},
        max_memory_allocated=lambda: 111,
        max_memory_reserved=lambda: 222,
        OutOfMemoryError=FakeOutOfMemoryError)
    dist = types.SimpleNamespace(is_available=lambda: False, is_initialized=lambda: False)
    return types.SimpleNamespace(cuda=cuda, distributed=dist), calls


class CallbackCase(unittest.TestCase):
    """Runs each test with a temporary metrics path, the environment and hooks restored."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.metrics = os.path.join(self.dir.name, "metrics.json")
        self.env = dict(os.environ)
        self.hook = sys.excepthook
        self.callbacks = []

    def tearDown(self):
        for cb in self.callbacks:
            atexit.unregister(cb.write)
        sys.excepthook = self.hook
        os.environ.clear()
        os.environ.update(self.env)
        sys.modules.pop("torch", None)
        self.dir.cleanup()

    def make(self, **kwargs):
        import remat_metrics_callback as m  # noqa: PLC0415
        cb = m.RematMetricsCallback(metrics_file=self.metrics, rank=0, **kwargs)
        self.callbacks.append(cb)
        return cb

    def written(self):
        with open(self.metrics + ".rank0", encoding="utf-8") as f:
            return json.load(f)["ranks"][0]


class PureLogicTest(unittest.TestCase):
    def test_budget_text(self):
        from remat_metrics_callback import parse_budget_bytes  # noqa: PLC0415
        self.assertEqual(parse_budget_bytes(None), 0)
        self.assertEqual(parse_budget_bytes(""), 0)
        self.assertEqual(parse_budget_bytes("0"), 0)
        self.assertEqual(parse_budget_bytes(" 75698946048\n"), 75698946048)
        for bad in ["70GiB", "1.5e9", "-1"]:
            with self.assertRaises(ValueError) as ctx:
                parse_budget_bytes(bad)
            self.assertIn("REMAT_MEMORY_BUDGET_BYTES", str(ctx.exception), bad)

    def test_fraction(self):
        from remat_metrics_callback import memory_fraction  # noqa: PLC0415
        self.assertEqual(memory_fraction(70 * GIB, 140 * GIB), 0.5)
        self.assertEqual(memory_fraction(200 * GIB, 140 * GIB), 1.0)
        self.assertIsNone(memory_fraction(0, 140 * GIB))
        self.assertIsNone(memory_fraction(70 * GIB, 0))

    def test_failing_request_bytes_agrees_with_the_megatron_driver(self):
        from remat_metrics_callback import failing_request_bytes  # noqa: PLC0415
        from megatron_driver import metrics  # noqa: PLC0415
        for text, want in [
                ("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has", 3 * GIB // 2),
                ("Tried to allocate 20.00 MiB", 20 << 20), ("Tried to allocate 512 B", 512),
                ("CUDA error: out of memory", 0), ("", 0)]:
            self.assertEqual(failing_request_bytes(text), want, text)
            self.assertEqual(metrics.failing_request_bytes(text), want, text)


class BudgetTest(CallbackCase):
    def test_budget_from_the_environment_is_enforced_once_at_train_start(self):
        torch, calls = fake_torch()
        sys.modules["torch"] = torch
        os.environ["REMAT_MEMORY_BUDGET_BYTES"] = str(70 * GIB)
        cb = self.make()
        self.assertEqual(calls, [])  # nothing before the device is chosen
        cb.on_train_start()
        cb.on_train_step_start()
        cb.on_train_step_end()
        self.assertEqual(calls, [(0.5, 3)])
        self.assertEqual(cb.memory_fraction, 0.5)

    def test_an_argument_wins_and_no_budget_is_no_cap(self):
        torch, calls = fake_torch()
        sys.modules["torch"] = torch
        os.environ["REMAT_MEMORY_BUDGET_BYTES"] = str(70 * GIB)
        cb = self.make(memory_budget_bytes=0)
        cb.on_train_start()
        self.assertEqual(calls, [])
        self.assertIsNone(cb.memory_fraction)
        cb = self.make(memory_budget_bytes=35 * GIB)
        cb.step_end()  # outside Bridge the first step_end enforces it
        self.assertEqual(calls, [(0.25, 3)])

    def test_a_malformed_budget_stops_the_job(self):
        os.environ["REMAT_MEMORY_BUDGET_BYTES"] = "80GiB"
        with self.assertRaises(ValueError) as ctx:
            self.make()
        self.assertIn("REMAT_MEMORY_BUDGET_BYTES", str(ctx.exception))


class StatusTest(CallbackCase):
    def test_an_oom_is_status_oom_with_the_failed_request(self):
        torch, _ = fake_torch()
        sys.modules["torch"] = torch
        cb = self.make(memory_budget_bytes=0)
        cb.on_train_start()
        cb.on_train_step_start()
        cb.on_train_step_end(types.SimpleNamespace(loss_dict={"lm loss": 2.5}, grad_norm=1.25))
        cb.record_failure(FakeOutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity\nmore"))
        entry = self.written()
        self.assertEqual(entry["status"], "oom")
        self.assertEqual(entry["failing_request_bytes"], 2 * GIB)
        self.assertEqual(entry["message"],
                         "FakeOutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                         "GPU 3 has a total capacity")
        self.assertEqual(entry["losses"], [2.5])
        self.assertEqual(entry["grad_norms"], [1.25])
        self.assertEqual((entry["peak_allocated_bytes"], entry["peak_reserved_bytes"]), (111, 222))
        self.assertEqual(len(entry["step_times_s"]), 1)

    def test_another_error_is_failed(self):
        cb = self.make(memory_budget_bytes=0)
        cb.record_failure(ImportError("no module named megatron.bridge"))
        entry = self.written()
        self.assertEqual(entry["status"], "failed")
        self.assertEqual(entry["failing_request_bytes"], 0)


def fake_bridge(test, fail=None):
    """Stand-ins for the Megatron Bridge and OmegaConf names pretrain_with_remat.py uses: the
    recipe is a namespace, an override KEY=VALUE sets it, pretrain fires the callback's events
    for train.train_iters steps (raising `fail` at the second)."""
    seen = {}

    def recipe(**kwargs):
        seen["kwargs"] = kwargs
        return types.SimpleNamespace(model=types.SimpleNamespace(num_layers=32),
                                     train=types.SimpleNamespace(train_iters=1),
                                     print_yaml=lambda: None)

    def parse_hydra_overrides(cfg, overrides):
        seen["overrides"] = list(overrides)
        for o in overrides:
            key, _, value = o.partition("=")
            section, _, field = key.partition(".")
            setattr(getattr(cfg, section), field, int(value) if value.isdigit() else value)
        return cfg

    def pretrain(config, forward_step_func, callbacks):  # pylint: disable=unused-argument
        seen["layers"] = config.model.num_layers
        (cb,) = callbacks
        cb.on_train_start()
        for i in range(config.train.train_iters):
            cb.on_train_step_start()
            if fail is not None and i == 1:
                raise fail
            cb.on_train_step_end(types.SimpleNamespace(loss_dict={"lm loss": 9.0 - i}))
        cb.on_train_end()

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        return m
    mods = {
        "omegaconf": module("omegaconf", OmegaConf=types.SimpleNamespace(
            to_container=lambda cfg, resolve: cfg)),
        "megatron": module("megatron"), "megatron.bridge": module("megatron.bridge"),
        "megatron.bridge.training": module("megatron.bridge.training"),
        "megatron.bridge.training.utils": module("megatron.bridge.training.utils"),
        "megatron.bridge.training.utils.omegaconf_utils": module(
            "megatron.bridge.training.utils.omegaconf_utils",
            create_omegaconf_dict_config=lambda cfg: (cfg, set()),
            parse_hydra_overrides=parse_hydra_overrides,
            apply_overrides=lambda cfg, merged, excluded: None),
        "megatron.bridge.training.pretrain": module("megatron.bridge.training.pretrain",
                                                    pretrain=pretrain),
        "megatron.bridge.training.gpt_step": module("megatron.bridge.training.gpt_step",
                                                    forward_step=object()),
        "fake_recipes": module("fake_recipes", llama=recipe),
    }
    for name, m in mods.items():
        sys.modules[name] = m
    test.addCleanup(lambda: [sys.modules.pop(n, None) for n in mods])
    return seen


class RecipeScriptTest(CallbackCase):
    """worker/megatron_bridge/pretrain_with_remat.py against stand-ins for Megatron Bridge."""

    def run_script(self, argv):
        import pretrain_with_remat  # noqa: PLC0415
        os.environ["REMAT_METRICS_FILE"] = self.metrics
        os.environ["RANK"] = "0"
        real = pretrain_with_remat.RematMetricsCallback

        def tracked(*args, **kwargs):
            cb = real(*args, **kwargs)
            self.callbacks.append(cb)
            return cb
        pretrain_with_remat.RematMetricsCallback = tracked
        try:
            return pretrain_with_remat.main(argv)
        finally:
            pretrain_with_remat.RematMetricsCallback = real

    def test_overrides_reach_the_recipe_and_every_step_is_recorded(self):
        seen = fake_bridge(self)
        torch, _ = fake_torch()
        torch.distributed.is_initialized = lambda: False
        sys.modules["torch"] = torch
        self.assertEqual(self.run_script(
            ["--recipe", "fake_recipes:llama", "--recipe-kwarg", "seq_length=4096",
             "model.recompute_granularity=selective", "model.num_layers=2",
             "train.train_iters=5"]), 0)
        self.assertEqual(seen["kwargs"], {"seq_length": 4096})
        self.assertEqual(seen["layers"], 2)
        self.assertEqual(seen["overrides"][0], "model.recompute_granularity=selective")
        entry = self.written()
        self.assertEqual(entry["status"], "ok")
        self.assertEqual(len(entry["step_times_s"]), 5)
        self.assertEqual(entry["losses"], [9.0, 8.0, 7.0, 6.0, 5.0])

    def test_an_oom_in_training_is_recorded_then_raised(self):
        fake_bridge(self, fail=FakeOutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB"))
        torch, _ = fake_torch()
        sys.modules["torch"] = torch
        with self.assertRaises(FakeOutOfMemoryError):
            self.run_script(["--recipe", "fake_recipes:llama", "train.train_iters=5"])
        entry = self.written()
        self.assertEqual(entry["status"], "oom")
        self.assertEqual(entry["failing_request_bytes"], 4 * GIB)
        self.assertEqual(len(entry["step_times_s"]), 1)

    def test_bad_arguments_are_refused(self):
        import pretrain_with_remat  # noqa: PLC0415
        with self.assertRaises(ValueError) as ctx:
            pretrain_with_remat.load_recipe("megatron.bridge.recipes.llama")
        self.assertIn("MODULE:FUNCTION", str(ctx.exception))
        with self.assertRaises(ValueError) as ctx:
            pretrain_with_remat.recipe_kwargs(["seq_length"])
        self.assertIn("NAME=JSON", str(ctx.exception))
        self.assertEqual(pretrain_with_remat.recipe_kwargs(["dir=/data", "mock=true"]),
                         {"dir": "/data", "mock": True})


class GpuBudgetTest(CallbackCase):
    """On a real device: an allocation over the budget fails and the file says oom."""

    def test_allocation_over_the_budget_is_oom(self):
        import torch  # noqa: PLC0415
        torch.cuda.set_device(0)
        cb = self.make(memory_budget_bytes=GIB)
        cb.on_train_start()
        self.assertLess(cb.memory_fraction, 1.0)
        small = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        with self.assertRaises(torch.cuda.OutOfMemoryError) as ctx:
            torch.empty(2 * GIB, dtype=torch.uint8, device="cuda")
        cb.record_failure(ctx.exception)
        del small
        entry = self.written()
        self.assertEqual(entry["status"], "oom")
        self.assertEqual(entry["failing_request_bytes"], 2 * GIB)
        self.assertLessEqual(entry["peak_reserved_bytes"], GIB)
        torch.cuda.set_per_process_memory_fraction(1.0)


if __name__ == "__main__":
    if GPU:
        try:
            import torch  # noqa: F401,PLC0415
            have_cuda = torch.cuda.is_available()
        except ImportError:
            have_cuda = False
        if not have_cuda:
            print("skipped: no torch with CUDA")
            sys.exit(77)
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(GpuBudgetTest)
    else:
        loader = unittest.defaultTestLoader
        suite = unittest.TestSuite(loader.loadTestsFromTestCase(c)
                                   for c in (PureLogicTest, BudgetTest, StatusTest,
                                             RecipeScriptTest))
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)
