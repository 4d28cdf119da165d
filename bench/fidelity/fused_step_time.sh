#!/usr/bin/env bash
# Where the engine's step time goes with Megatron's fusions (docs/fidelity.md): the dense
# fidelity model's control (selective:[]) timed by remat-trial with each fused setting of the
# fused family switched on alone, then all together, one process after another on one GPU.
#
#   bench/fidelity/fused_step_time.sh [OUT_DIR]   # default $OUT; about 2 minutes on one H200
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
OUT_DIR=${1:-${OUT:-$ROOT/build-gpu/fused-step-time}}
mkdir -p "$OUT_DIR"
export NCCL_NVLS_ENABLE=0
bench/gpu/build_engine.sh build-gpu > "$OUT_DIR/build.log" 2>&1 || { tail -30 "$OUT_DIR/build.log"; exit 1; }
spec() {  # $1: name, $2: extra model lines, $3: extra train lines
  cat <<YAML
name: $1
model:
  num_layers: 4
  seq_length: 4096
  vocab_size: 32000
  normalization: RMSNorm
  gated_linear_unit: true
  attention_backend: unfused
  attention_dropout: 0.0
  hidden_dropout: 0.0
  add_bias_linear: false
  position_embedding_type: rope
  hidden_size: 2048
  num_attention_heads: 16
  num_query_groups: 4
  ffn_hidden_size: 5632
$2train:
  micro_batch_size: 1
  precision: bf16
$3search:
  memory_budget_gib: 130
  warmup_steps: 2
  measure_steps: 20
  noise_target: 0
  device: cuda
YAML
}
run() {
  spec "$1" "$2" "$3" > "$OUT_DIR/$1.yaml"
  build-gpu/bin/remat-trial --spec "$OUT_DIR/$1.yaml" --policy 'selective:[]' --json \
    > "$OUT_DIR/$1.json" 2> "$OUT_DIR/$1.log"
  python3 - "$OUT_DIR/$1.json" "$1" <<'PY'
import json, statistics, sys
r = json.load(open(sys.argv[1]))
t = r["ranks"][0]["step_times_s"]
print("%-22s median %.1f ms  min %.1f  max %.1f  peak %.0f MiB" % (sys.argv[2],
      1e3 * statistics.median(t), 1e3 * min(t), 1e3 * max(t), r["peak_allocated_bytes"] / 2**20))
PY
}
run unfused "" ""
run bf16-grads "" "  grad_reduce_in_fp32: false
"
run bias-act "  bias_activation_fusion: true
" ""
run bias-dropout "  bias_dropout_fusion: true
" ""
run ce-native "  cross_entropy_loss_fusion: true
" ""
run all "  bias_activation_fusion: true
  bias_dropout_fusion: true
  cross_entropy_loss_fusion: true
" "  grad_reduce_in_fp32: false
"
run unfused-again "" ""
