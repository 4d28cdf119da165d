"""bench/fidelity's specs, checked without a GPU: every family's YAML (the engine's) through
`remat validate` for each policy the bench runs (valid, and not refused by the builtin backend),
and its JSON (the driver's) through the megatron driver's mapping (each Megatron Core family
maps to the settings it stands for, nothing refused). Run by ctest:
python3 fidelity_specs_test.py SOURCE_DIR REMAT REMAT_BENCH_ESTIMATE."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

SOURCE, REMAT, ESTIMATE = (os.path.abspath(x) for x in sys.argv[1:4])
del sys.argv[1:4]
sys.path.insert(0, os.path.join(SOURCE, "bench", "fidelity"))
sys.path.insert(0, os.path.join(SOURCE, "worker"))

import fidelity  # noqa: E402
from megatron_driver import mapping  # noqa: E402

FUSED = fidelity.FUSED_FAMILIES.split(",")


class FidelitySpecsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="fidelity-specs-")
        cls.policies = {}
        for fam in FUSED + ["dense", "mla", "moe-seq", "moe-grouped"]:
            fidelity.write_specs(cls.dir, fam)
            out = subprocess.check_output([ESTIMATE, "--spec", cls.yaml(fam)], text=True)
            cls.policies[fam] = fidelity.choose_policies(json.loads(out)["valid_policies"])

    @classmethod
    def yaml(cls, fam):
        return os.path.join(cls.dir, fam + ".yaml")

    def test_fused_families_set_the_fusions_and_bf16_gradients(self):
        for fam in FUSED:
            spec = fidelity.spec_of(fam)
            base = fidelity.spec_of(fidelity.UNFUSED[fam])
            for key, value in fidelity.FUSED_MODEL.items():
                self.assertEqual(spec["model"][key], value, fam)
            self.assertIs(spec["train"]["grad_reduce_in_fp32"], False)
            self.assertNotIn("use_precision_aware_optimizer", spec["train"])
            # The same model otherwise, the same policies.
            rest = {k: v for k, v in spec["model"].items() if k not in fidelity.FUSED_MODEL}
            self.assertEqual(rest, base["model"], fam)
            self.assertEqual(self.policies[fam], self.policies[fidelity.UNFUSED[fam]], fam)
        self.assertEqual(fidelity.MEGATRON_REFERENCE["moe-grouped-fused"], "moe-seq-fused")

    def test_every_policy_is_valid_and_run_by_the_builtin_engine(self):
        for fam in FUSED:
            self.assertIn("selective:[mlp]" if "moe" not in fam else "selective:[moe]",
                          self.policies[fam])
            for policy in self.policies[fam]:
                p = subprocess.run([REMAT, "validate", self.yaml(fam), "--policy", policy],
                                   capture_output=True, text=True, check=False)
                self.assertEqual(p.returncode, 0, "%s %s: %s" % (fam, policy, p.stderr))
                self.assertNotIn("refuse", p.stderr, "%s %s" % (fam, policy))

    def test_the_driver_runs_each_megatron_family_with_the_fusions(self):
        for fam in FUSED:
            ref = fidelity.MEGATRON_REFERENCE.get(fam)
            with open(os.path.join(self.dir, (ref or fam) + ".json"), encoding="utf-8") as f:
                spec = json.load(f)
            for policy in self.policies[fam]:
                if ref and policy not in self.policies[ref]:
                    continue  # moe_act: no sequential-experts reference (the table says so)
                trial = mapping.map_trial(spec, policy)
                c = trial["config"]
                self.assertTrue(c["bias_activation_fusion"] and c["bias_dropout_fusion"] and
                                c["cross_entropy_loss_fusion"], fam)
                self.assertNotIn("cross_entropy_fusion_impl", c)  # native, Megatron's default
                self.assertIs(trial["train"]["grad_reduce_in_fp32"], False)
                self.assertFalse(c.get("masked_softmax_fusion") or c.get("apply_rope_fusion"))
        with open(os.path.join(self.dir, "moe-grouped-fused.json"), encoding="utf-8") as f:
            grouped = json.load(f)
        with self.assertRaisesRegex(mapping.Unsupported, "moe_grouped_gemm"):
            mapping.map_trial(grouped, "selective:[]")

    def test_phases_run_the_controls_singles_and_anchors_before_the_pairs(self):
        pols = {f: self.policies[f] for f in FUSED}
        anchors = {f: ["selective:[]"] for f in ("dense", "moe-seq", "moe-grouped", "mla")}
        one, two = fidelity.phases(pols, anchors)
        # Each anchor right after the first fused family that needs it.
        self.assertEqual(list(one), ["dense-fused", "dense", "moe-seq-fused", "moe-seq",
                                     "moe-grouped-fused", "moe-grouped", "mla-fused", "mla"])
        self.assertEqual(one["dense-fused"][0], "selective:[]")
        self.assertIn("full:uniform:1", one["dense-fused"])
        self.assertTrue(all("," not in p for p in one["dense-fused"]))
        self.assertEqual(one["dense"], ["selective:[]"])
        self.assertNotIn("dense", two)
        self.assertIn("full:block:2", two["dense-fused"])
        self.assertEqual(sorted(one["dense-fused"] + two["dense-fused"]),
                         sorted(pols["dense-fused"]))


if __name__ == "__main__":
    unittest.main()
