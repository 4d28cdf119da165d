#!/usr/bin/env bash
# The megatron driver on a GPU with Megatron Core (ctest label gpu; skipped, exit 77, without
# REMAT_MEGATRON_PATH or torch with CUDA): a tiny dense model under the control and under
# `layernorm` recompute (the TE FP8 stand-in), and a tiny MLA model under `mla_up_proj` (the
# k_channels shim). Each must finish ok and the recompute must not raise the peak.
set -euo pipefail
SRC=${1:?SOURCE_DIR}
[ -n "${REMAT_MEGATRON_PATH:-}" ] || { echo "REMAT_MEGATRON_PATH unset: skipped"; exit 77; }
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
  { echo "no torch with CUDA: skipped"; exit 77; }
export NCCL_NVLS_ENABLE=0
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
cat > "$dir/dense.json" <<'JSON'
{"model": {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "num_query_groups": 2,
 "seq_length": 256, "vocab_size": 1000, "gated_linear_unit": true, "normalization": "RMSNorm",
 "add_bias_linear": false, "position_embedding_type": "rope", "attention_dropout": 0.0,
 "hidden_dropout": 0.0}, "search": {"warmup_steps": 1, "measure_steps": 2}}
JSON
cat > "$dir/mla.json" <<'JSON'
{"model": {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 256,
 "vocab_size": 1000, "multi_latent_attention": true, "kv_lora_rank": 64, "qk_head_dim": 32,
 "qk_pos_emb_head_dim": 16, "v_head_dim": 32, "normalization": "RMSNorm", "gated_linear_unit": true,
 "add_bias_linear": false, "position_embedding_type": "rope", "attention_dropout": 0.0,
 "hidden_dropout": 0.0}, "search": {"warmup_steps": 1, "measure_steps": 2}}
JSON
drv="$SRC/worker/megatron_driver/remat_megatron_driver.py"
python3 "$drv" --spec "$dir/dense.json" --policies 'selective:[];selective:[layernorm];full:uniform:1' \
  --jsonl "$dir/out.jsonl"
python3 "$drv" --spec "$dir/mla.json" --policies 'selective:[];selective:[mla_up_proj]' \
  --jsonl "$dir/out.jsonl"
python3 - "$dir/out.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    print(r["policy"], r["status"], r.get("rank", {}).get("peak_allocated_bytes"), r["message"][:200])
    assert r["status"] == "ok", r
assert rows[1]["rank"]["peak_allocated_bytes"] <= rows[0]["rank"]["peak_allocated_bytes"]
assert rows[2]["rank"]["peak_allocated_bytes"] < rows[0]["rank"]["peak_allocated_bytes"]
assert rows[4]["rank"]["peak_allocated_bytes"] <= rows[3]["rank"]["peak_allocated_bytes"]
PY
