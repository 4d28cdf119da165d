"""The megatron driver without torch or Megatron Core: its spec mapping, its metrics writer and
the refusal path of its command line. Run by ctest: python3 megatron_driver_test.py SOURCE_DIR."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(SOURCE, "worker"))

from megatron_driver import mapping, metrics  # noqa: E402

DRIVER = os.path.join(SOURCE, "worker", "megatron_driver", "remat_megatron_driver.py")


def dense(**model):
    base = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "seq_length": 512,
            "vocab_size": 1000, "num_query_groups": 2, "ffn_hidden_size": 688,
            "gated_linear_unit": True, "normalization": "RMSNorm", "add_bias_linear": False,
            "position_embedding_type": "rope", "attention_dropout": 0.0, "hidden_dropout": 0.0}
    base.update(model)
    return {"model": base, "train": {"micro_batch_size": 2, "seed": "77"},
            "parallel": {"tensor_model_parallel_size": 2, "data_parallel_size": 2},
            "search": {"memory_budget_gib": 1.5, "warmup_steps": 1, "measure_steps": 3}}


class PolicyTest(unittest.TestCase):
    def test_selective_full_and_none(self):
        self.assertEqual(mapping.parse_policy("none")["recompute_modules"], [])
        p = mapping.parse_policy("selective:[core_attn,moe_act]")
        self.assertEqual(p["recompute_granularity"], "selective")
        self.assertEqual(p["recompute_modules"], ["core_attn", "moe_act"])
        p = mapping.parse_policy("full:block:3")
        self.assertEqual((p["recompute_method"], p["recompute_num_layers"]), ("block", 3))
        self.assertIsNone(p["recompute_modules"])

    def test_malformed_policies_are_refused_naming_the_problem(self):
        for text, words in [("selective:[attn]", "unknown recompute label 'attn'"),
                            ("full:uniform:0", "at least 1"), ("full:sideways:1", "not a policy"),
                            ("selective:core_attn", "bracketed"),
                            ("selective:[mlp,mlp]", "repeated")]:
            with self.assertRaises(ValueError) as ctx:
                mapping.parse_policy(text)
            self.assertIn(words, str(ctx.exception), text)


class MappingTest(unittest.TestCase):
    def test_dense_gqa_swiglu_maps_to_transformer_config(self):
        plan = mapping.map_trial(dense(), "selective:[core_attn,mlp]")
        c = plan["config"]
        self.assertEqual(plan["config_class"], "TransformerConfig")
        self.assertEqual(c["num_query_groups"], 2)
        self.assertEqual(c["ffn_hidden_size"], 688)
        self.assertEqual(c["activation_func"], "silu")
        self.assertEqual(c["normalization"], "RMSNorm")
        self.assertEqual(c["recompute_granularity"], "selective")
        self.assertEqual(c["recompute_modules"], ["core_attn", "mlp"])
        self.assertNotIn("recompute_method", c)  # Megatron refuses it under selective
        self.assertEqual(c["transformer_impl"], "local")
        self.assertEqual(c["attention_backend"], "local")
        for fusion in ("masked_softmax_fusion", "apply_rope_fusion",
                       "gradient_accumulation_fusion"):
            self.assertFalse(c[fusion], fusion)
        # Left at the declared default (Megatron Core's), so not passed at all.
        for key in ("bias_activation_fusion", "bias_dropout_fusion", "attention_softmax_in_fp32"):
            self.assertNotIn(key, c)
        self.assertEqual(plan["model"]["vocab_size"], 1024)  # padded to 128 x TP
        self.assertEqual(plan["model"]["position_embedding_type"], "rope")
        self.assertEqual(plan["parallel"]["world_size"], 4)
        self.assertEqual(plan["train"]["seed"], 77)
        self.assertEqual(plan["train"]["num_microbatches"], 1)
        self.assertEqual(plan["run"]["budget_bytes"], int(1.5 * 2**30))
        self.assertEqual(plan["shims"], [])
        self.assertIsNone(plan["layer_spec"]["num_experts"])

    def test_declared_transformer_config_fields_pass_through(self):
        # A TransformerConfig field the driver has no code for reaches TransformerConfig by the
        # declaration alone (worker/megatron_driver/declared_fields.json).
        spec = dense(bias_activation_fusion=True, attention_dropout=0.05,
                     distribute_saved_activations=True)
        c = mapping.map_trial(spec, "full:uniform:1")["config"]
        self.assertTrue(c["bias_activation_fusion"])
        self.assertEqual(c["attention_dropout"], 0.05)
        self.assertTrue(c["distribute_saved_activations"])
        # Fields of other homes, and remat's own, are not TransformerConfig's.
        self.assertNotIn("seq_length", c)
        self.assertNotIn("vocab_size", c)
        homes = {f["home"] for f in mapping.DECLARED_FIELDS.values()}
        self.assertIn("TransformerConfig", homes)
        # What the driver sets itself is its own decision, whatever the spec says.
        self.assertEqual(c["transformer_impl"], "local")

    def test_no_q_compression_from_null_or_the_workers_zero(self):
        # The worker writes the spec as protobuf JSON, where MLA's null q_lora_rank is 0.
        for value in (None, 0):
            spec = dense(multi_latent_attention=True, q_lora_rank=value)
            plan = mapping.map_trial(spec, "selective:[]")
            self.assertIsNone(plan["config"]["q_lora_rank"])
            self.assertIn("mla_no_q_norm", plan["shims"])
        plan = mapping.map_trial(dense(multi_latent_attention=True), "selective:[]")
        self.assertEqual(plan["config"]["q_lora_rank"], 512)

    def test_derived_defaults_are_left_to_megatron(self):
        spec = dense()
        for key in ("num_query_groups", "ffn_hidden_size", "gated_linear_unit"):
            del spec["model"][key]
        c = mapping.map_trial(spec, "none")["config"]
        self.assertNotIn("num_query_groups", c)
        self.assertNotIn("ffn_hidden_size", c)
        self.assertEqual(c["activation_func"], "gelu")

    def test_full_recompute(self):
        c = mapping.map_trial(dense(), "full:uniform:2")["config"]
        self.assertEqual((c["recompute_granularity"], c["recompute_method"],
                          c["recompute_num_layers"]), ("full", "uniform", 2))
        self.assertNotIn("recompute_modules", c)
        with self.assertRaises(mapping.Unsupported):
            mapping.map_trial(dense(), "full:block:5")

    def test_mla_config_and_shims(self):
        spec = dense(multi_latent_attention=True, kv_lora_rank=64, qk_head_dim=32,
                     qk_pos_emb_head_dim=16, v_head_dim=32)
        # Absent: MLATransformerConfig's default, as remat's spec reader resolves it.
        self.assertEqual(mapping.map_trial(spec, "selective:[]")["config"]["q_lora_rank"], 512)
        spec["model"]["q_lora_rank"] = None
        plan = mapping.map_trial(spec, "selective:[mla_up_proj]")
        c = plan["config"]
        self.assertEqual(plan["config_class"], "MLATransformerConfig")
        self.assertIsNone(c["q_lora_rank"])  # the spec's explicit null
        self.assertEqual(c["rope_type"], "rope")
        self.assertEqual((c["kv_lora_rank"], c["qk_head_dim"], c["v_head_dim"]), (64, 32, 32))
        # No q compression: no q norm either (Megatron Core refuses one that nothing uses).
        self.assertEqual(plan["shims"],
                         ["te_fp8_stand_in", "mla_core_attention_channels", "mla_no_q_norm"])
        self.assertTrue(plan["layer_spec"]["multi_latent_attention"])
        self.assertTrue(plan["layer_spec"]["qk_layernorm"])
        self.assertTrue(c["qk_layernorm"])
        # With Transformer Engine installed the FP8 stand-in is not needed; with q compression
        # the q norm stays.
        spec["model"]["q_lora_rank"] = 96
        self.assertEqual(mapping.map_trial(spec, "selective:[mla_up_proj]", have_te=True)["shims"],
                         ["mla_core_attention_channels"])

    def test_moe_dispatcher_and_expert_tensor_parallelism_pass_through(self):
        spec = dense(num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=128,
                     moe_token_dispatcher_type="alltoall")
        spec["parallel"].update(expert_model_parallel_size=2, expert_tensor_parallel_size=1,
                                sequence_parallel=False)
        plan = mapping.map_trial(spec, "selective:[]")
        self.assertEqual(plan["config"]["moe_token_dispatcher_type"], "alltoall")
        self.assertEqual(plan["config"]["expert_tensor_parallel_size"], 1)
        self.assertEqual(plan["parallel"]["etp"], 1)
        spec["model"]["moe_token_dispatcher_type"] = "flex"
        with self.assertRaises(mapping.Unsupported) as e:
            mapping.map_trial(spec, "selective:[]")
        self.assertIn("model.moe_token_dispatcher_type", str(e.exception))

    def test_moe_with_shared_experts(self):
        spec = dense(num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=128,
                     moe_shared_expert_intermediate_size=256, moe_layer_freq=1)
        plan = mapping.map_trial(spec, "selective:[moe_act,shared_experts]")
        c = plan["config"]
        self.assertEqual(c["num_moe_experts"], 8)
        self.assertNotIn("moe_token_dispatcher_type", c)  # Megatron's default, allgather
        self.assertEqual(c["moe_router_load_balancing_type"], "none")
        self.assertEqual(c["moe_shared_expert_intermediate_size"], 256)
        self.assertFalse(c["moe_grouped_gemm"])
        self.assertEqual(plan["layer_spec"]["num_experts"], 8)
        self.assertIn("te_fp8_stand_in", plan["shims"])

    def test_refusals_name_the_field(self):
        cases = [
            (dict(attention_backend="flash"), "none", "model.attention_backend"),
            (dict(num_moe_experts=4, moe_grouped_gemm=True), "none", "model.moe_grouped_gemm"),
            (dict(add_bias_linear=True), "selective:[mlp]", "add_bias_linear"),
            (dict(experimental_attention_variant="gdn"), "none",
             "model.experimental_attention_variant"),
            (dict(fp8="hybrid"), "none", "model.fp8"),
            (dict(cuda_graph_impl="local"), "none", "model.cuda_graph_impl"),
        ]
        for model, policy, field in cases:
            with self.assertRaises(mapping.Unsupported) as ctx:
                mapping.map_trial(dense(**model), policy)
            self.assertIn(field, str(ctx.exception))
        spec = dense()
        spec["parallel"]["pipeline_model_parallel_size"] = 2
        with self.assertRaisesRegex(mapping.Unsupported, "pipeline_model_parallel_size"):
            mapping.map_trial(spec, "none")
        spec = dense()
        spec["parallel"]["sequence_parallel"] = True
        with self.assertRaisesRegex(mapping.Unsupported, "parallel.sequence_parallel"):
            mapping.map_trial(spec, "none")
        self.assertTrue(mapping.map_trial(spec, "none", have_apex=True)["config"]["sequence_parallel"])
        spec = dense()
        spec["search"]["device"] = "cpu"
        with self.assertRaisesRegex(mapping.Unsupported, "search.device"):
            mapping.map_trial(spec, "none")

    def test_native_cross_entropy_fusion_runs_te_needs_transformer_engine(self):
        fused = dense(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="native",
                      bias_activation_fusion=True, bias_dropout_fusion=True)
        config = mapping.map_trial(fused, "none")["config"]
        self.assertTrue(config["cross_entropy_loss_fusion"])
        self.assertTrue(config["bias_activation_fusion"])
        self.assertTrue(config["bias_dropout_fusion"])
        self.assertNotIn("cross_entropy_fusion_impl", config)  # native: Megatron's own default
        te = dense(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
        with self.assertRaisesRegex(mapping.Unsupported, "model.cross_entropy_fusion_impl"):
            mapping.map_trial(te, "none")
        self.assertEqual(mapping.map_trial(te, "none", have_te=True)["config"]
                         ["cross_entropy_fusion_impl"], "te")
        # The impl alone, without the fusion, changes nothing Megatron runs.
        mapping.map_trial(dense(cross_entropy_fusion_impl="te"), "none")

    def test_mlp_with_biases_is_allowed_when_every_layer_is_moe(self):
        spec = dense(num_moe_experts=4, add_bias_linear=True)
        mapping.map_trial(spec, "selective:[moe]")  # no dense layer: mlp's defect cannot occur


class MetricsTest(unittest.TestCase):
    def test_document_has_the_worker_readers_keys(self):
        doc = metrics.document([metrics.rank_entry(
            1, peak_allocated_bytes=10, peak_reserved_bytes=20, step_times_s=[0.5, 0.25],
            losses=[3.0, 2.0], grad_norms=[1.0, 0.5], static_bytes=4, alloc_retries=2,
            setup_s=1.5)])
        r = doc["ranks"][0]
        for key in ("rank", "status", "peak_allocated_bytes", "peak_reserved_bytes",
                    "step_times_s", "losses", "grad_norms", "static_bytes", "alloc_retries",
                    "failing_request_bytes", "setup_s"):
            self.assertIn(key, r)
        self.assertNotIn("status", doc)
        self.assertEqual(metrics.document([], status="invalid", message="x")["status"], "invalid")

    def test_atomic_write_and_failing_request(self):
        with tempfile.TemporaryDirectory() as d:
            path = metrics.rank_file(os.path.join(d, "metrics.json"), 3)
            self.assertTrue(path.endswith("metrics.json.rank3"))
            metrics.write_atomic(path, {"ranks": []})
            self.assertEqual(os.listdir(d), ["metrics.json.rank3"])
        self.assertEqual(metrics.failing_request_bytes(
            "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0"), int(2.5 * 2**30))
        self.assertEqual(metrics.failing_request_bytes("Tried to allocate 512.00 MiB"), 2**29)
        self.assertEqual(metrics.failing_request_bytes("something else"), 0)


class CommandLineTest(unittest.TestCase):
    def run_driver(self, spec, *args):
        with tempfile.TemporaryDirectory() as d:
            spec_path = os.path.join(d, "spec.json")
            with open(spec_path, "w", encoding="utf-8") as f:
                json.dump(spec, f)
            proc = subprocess.run([sys.executable, DRIVER, "--spec", spec_path, *args],
                                  capture_output=True, text=True, cwd=d, check=False)
            files = {n: open(os.path.join(d, n), encoding="utf-8").read()
                     for n in os.listdir(d) if n.startswith("metrics")}
            return proc, files

    def test_check_prints_the_plan_or_the_refusal(self):
        proc, _ = self.run_driver(dense(), "--policy", "selective:[core_attn]", "--check")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(json.loads(proc.stdout)["config"]["recompute_modules"], ["core_attn"])
        proc, _ = self.run_driver(dense(attention_backend="flash"), "--policy", "none", "--check")
        self.assertEqual(proc.returncode, 3)
        self.assertIn("model.attention_backend", json.loads(proc.stdout)["refused"])

    def test_a_refused_trial_writes_status_invalid_without_importing_torch(self):
        proc, files = self.run_driver(dense(attention_backend="flash"), "--policy", "none",
                                      "--metrics", "metrics.json", "--rank", "0")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        doc = json.loads(files["metrics.json.rank0"])
        self.assertEqual(doc["status"], "invalid")
        self.assertIn("model.attention_backend", doc["message"])

    def test_bad_arguments_exit_2(self):
        proc, _ = self.run_driver(dense(), "--policy", "none")
        self.assertEqual(proc.returncode, 2)
        proc, _ = self.run_driver(dense(), "--policy", "none", "--metrics", "m", "--world-size",
                                  "2")
        self.assertEqual(proc.returncode, 2)


if __name__ == "__main__":
    unittest.main()
