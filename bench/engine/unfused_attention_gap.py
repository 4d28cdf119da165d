#!/usr/bin/env python3
"""The memory model against the engine with Megatron's unfused attention, by sequence length and
softmax dtype: the dense fidelity model's shape at small size (4 layers, hidden 256, 16 heads in
4 query groups, bf16, micro-batch 1), each variant run once by remat-trial and estimated by
remat-bench-estimate, printing the allocated peak of both, their gap, and the gap in units of
one fp32 score tensor (heads x s x s x 4 bytes): a gap that grows with s^2 is a score-sized tensor
the model does not count. docs/memory-model.md, "Unfused attention on CUDA", has the figures.

    bench/engine/unfused_attention_gap.py BIN_DIR DEVICE [--seqs 512,1024,2048]

BIN_DIR holds remat-trial and remat-bench-estimate (build/bin here, build-gpu/bin on a GPU node
after bench/gpu/build_engine.sh build-gpu remat-bench-estimate); DEVICE is cpu or cuda.
Standard library only.
"""
import json
import os
import subprocess
import sys
import tempfile

SPEC = """name: unfused-attention-gap
model:
  num_layers: 4
  seq_length: {seq}
  vocab_size: 4096
  normalization: RMSNorm
  gated_linear_unit: true
  attention_backend: unfused
  attention_dropout: 0.0
  hidden_dropout: 0.0
  attention_softmax_in_fp32: {fp32}
  add_bias_linear: false
  position_embedding_type: rope
  hidden_size: 256
  num_attention_heads: 16
  num_query_groups: 4
  ffn_hidden_size: 704
train:
  micro_batch_size: 1
  precision: bf16
search:
  memory_budget_gib: 130
  warmup_steps: 1
  warmup_max_steps: 1
  steady_window: 1
  measure_steps: 1
  noise_target: 0
  device: {device}
"""
HEADS = 16
MIB = float(1 << 20)


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    bin_dir, device = argv[1], argv[2]
    seqs = [512, 1024, 2048]
    if "--seqs" in argv:
        seqs = [int(s) for s in argv[argv.index("--seqs") + 1].split(",")]
    work = tempfile.mkdtemp(prefix="remat-attention-gap-")
    print("device %s" % device)
    for seq in seqs:
        for fp32 in ("true", "false"):
            spec = os.path.join(work, "s%d-%s.yaml" % (seq, fp32))
            with open(spec, "w") as f:
                f.write(SPEC.format(seq=seq, fp32=fp32, device=device))
            for policy in ("selective:[]", "selective:[core_attn]"):
                run = subprocess.run([os.path.join(bin_dir, "remat-trial"), "--spec", spec,
                                      "--policy", policy, "--json"],
                                     capture_output=True, text=True)
                try:
                    trial = json.loads(run.stdout.strip().splitlines()[-1])
                    measured = trial["peak_allocated_bytes"]
                except (ValueError, IndexError, KeyError):
                    print("seq %d fp32 %s %s: trial failed: %s" % (seq, fp32, policy,
                                                                  run.stdout[-200:]))
                    continue
                estimate = json.loads(subprocess.check_output(
                    [os.path.join(bin_dir, "remat-bench-estimate"), "--spec", spec,
                     "--policies", policy]))
                model = list(estimate["estimates"].values())[0]["peak_bytes"]
                score = 4.0 * HEADS * seq * seq
                print("seq %5d softmax_in_fp32 %-5s %-22s engine %9.2f MiB  model %9.2f  "
                      "gap %8.2f MiB = %5.2f fp32 score tensors" % (
                          seq, fp32, policy, measured / MIB, model / MIB,
                          (measured - model) / MIB, (measured - model) / score), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
