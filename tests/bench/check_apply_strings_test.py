"""bench/gpu/check_apply_strings.py's pure parts (no torch, no Megatron Core): how it applies the
Bridge overrides and the Megatron-LM flags over a recipe, and how it compares what a config says
with the policy. Run by ctest: python3 check_apply_strings_test.py SOURCE_DIR."""

import os
import sys
import unittest

SOURCE = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(SOURCE, "bench", "gpu"))
sys.path.insert(0, os.path.join(SOURCE, "bench", "fidelity"))
sys.path.insert(0, os.path.join(SOURCE, "worker"))

import check_apply_strings as c  # noqa: E402

# remat's strings for selective:[core_attn,mlp] and full:block:2 (search/policy.cc).
SELECTIVE = {
    "megatron_bridge": "model.recompute_granularity=selective model.recompute_method=null "
                       "model.recompute_num_layers=null model.recompute_modules=[core_attn,mlp]",
    "megatron_lm": "--recompute-granularity selective --recompute-modules core_attn mlp",
    "megatron_lm_remove": "--recompute-method --recompute-num-layers --recompute-activations "
                          "--distribute-saved-activations"}
FULL = {
    "megatron_bridge": "model.recompute_granularity=full model.recompute_method=block "
                       "model.recompute_num_layers=2 model.recompute_modules=null",
    "megatron_lm": "--recompute-granularity full --recompute-method block --recompute-num-layers 2",
    "megatron_lm_remove": "--recompute-modules --recompute-activations"}


class BridgeTest(unittest.TestCase):
    def test_values(self):
        self.assertIsNone(c.parse_bridge_value("null"))
        self.assertEqual(c.parse_bridge_value("[]"), [])
        self.assertEqual(c.parse_bridge_value("[core_attn,mlp]"), ["core_attn", "mlp"])
        self.assertEqual(c.parse_bridge_value("2"), 2)
        self.assertEqual(c.parse_bridge_value("block"), "block")

    def test_overrides_replace_every_recompute_field_of_a_full_recipe(self):
        got = c.apply_bridge(c.BRIDGE_RECIPES["full-uniform-1"], SELECTIVE["megatron_bridge"])
        self.assertEqual(got, {"recompute_granularity": "selective", "recompute_method": None,
                               "recompute_num_layers": None,
                               "recompute_modules": ["core_attn", "mlp"]})
        with self.assertRaises(ValueError):
            c.apply_bridge({}, "train.train_iters=3")


class MegatronLmTest(unittest.TestCase):
    def test_remove_flags_takes_their_values(self):
        self.assertEqual(c.remove_flags(["--a", "1", "--b", "x", "y", "--c"], {"--b", "--c"}),
                         ["--a", "1"])

    def test_selective_over_a_full_recipe(self):
        got = c.apply_megatron_lm(c.MEGATRON_LM_RECIPES["full-block-2-distributed"],
                                  SELECTIVE["megatron_lm"], SELECTIVE["megatron_lm_remove"])
        self.assertEqual((got["recompute_granularity"], got["recompute_method"],
                          got["recompute_num_layers"], got["recompute_modules"],
                          got["distribute_saved_activations"]),
                         ("selective", None, None, ["core_attn", "mlp"], False))

    def test_full_over_recompute_activations(self):
        got = c.apply_megatron_lm("--recompute-activations", FULL["megatron_lm"],
                                  FULL["megatron_lm_remove"])
        self.assertEqual((got["recompute_granularity"], got["recompute_method"],
                          got["recompute_num_layers"]), ("full", "block", 2))

    def test_without_the_removal_recompute_activations_wins(self):
        # What the remove list is for: left in, it turns full into selective.
        got = c.apply_megatron_lm("--recompute-activations", FULL["megatron_lm"], "")
        self.assertEqual(got["recompute_granularity"], "selective")

    def test_a_bad_command_line_is_refused(self):
        with self.assertRaises(ValueError):
            c.apply_megatron_lm("--recompute-method sideways", "", "")


class EffectTest(unittest.TestCase):
    def test_policies(self):
        self.assertEqual(c.policy_effect("selective:[]"), ("none",))
        self.assertEqual(c.policy_effect("selective:[mlp,core_attn]"),
                         ("selective", ("core_attn", "mlp")))
        self.assertEqual(c.policy_effect("full:uniform:1"), ("full", "uniform", 1))
        with self.assertRaises(ValueError):
            c.policy_effect("full:1")

    def test_configs(self):
        self.assertEqual(c.config_effect(None, None, None, ["core_attn"]), ("none",))
        self.assertEqual(c.config_effect("selective", None, None, []), ("none",))
        self.assertEqual(c.config_effect("full", "block", 2, ["core_attn"]), ("full", "block", 2))
        # Megatron Core fills recompute_modules with [core_attn] when None: selective with the
        # modules left out is core_attn, not the policy selective:[].
        self.assertNotEqual(c.config_effect("selective", None, None, ["core_attn"]),
                            c.policy_effect("selective:[]"))


class FamilyBaseTest(unittest.TestCase):
    """The configs the check builds come from the megatron driver's own mapping (pure Python)."""

    def test_every_family_maps_with_its_recompute_fields_left_to_the_rows(self):
        import fidelity  # noqa: PLC0415
        from megatron_driver import mapping  # noqa: PLC0415
        for family in ("dense", "mla", "moe-seq", "moe-grouped"):
            plan = c.family_base(fidelity.spec_of(family), mapping)
            for key in c.RECOMPUTE_KEYS:
                self.assertNotIn(key, plan["config"], family)
            self.assertEqual(plan["config"].get("moe_grouped_gemm", False),
                             family == "moe-grouped", family)
        self.assertEqual(c.family_base(fidelity.spec_of("mla"), mapping)["config_class"],
                         "MLATransformerConfig")


if __name__ == "__main__":
    unittest.main(verbosity=2)
