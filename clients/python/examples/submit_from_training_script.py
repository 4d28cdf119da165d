#!/usr/bin/env python3
"""Asking remat for a recompute policy from inside a training script.

The script describes its own model and layout as a dict (the spec file's sections, Megatron
names), submits it to a coordinator, prints progress while the search runs, and ends with the
Megatron Bridge overrides it would apply (a real script would append them to its recipe's
overrides before building the model). With --spec it submits a spec file instead.

    PYTHONPATH=build/clients/python python3 clients/python/examples/submit_from_training_script.py \
        --coordinator 127.0.0.1:50051 [--spec examples/tiny-dense.yaml] [--token-file FILE]
"""

import argparse
import sys

from remat_client import Client, RematError, SpecError


def my_training_config():
    # What this training script would run: a small dense GQA model, TP 1, one micro-batch.
    return {
        "name": "from-training-script",
        "model": {
            "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 2,
            "ffn_hidden_size": 172, "gated_linear_unit": True, "normalization": "RMSNorm",
            "seq_length": 128, "vocab_size": 512, "attention_dropout": 0.0,
            "hidden_dropout": 0.0, "add_bias_linear": False, "position_embedding_type": "rope",
        },
        "train": {"micro_batch_size": 2, "precision": "fp32"},
        "search": {"memory_budget_gib": 0.0068, "max_trials": 12, "warmup_steps": 1,
                   "measure_steps": 5},
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--coordinator", help="HOST:PORT (default: env REMAT_COORDINATOR)")
    p.add_argument("--spec", help="a spec file instead of this script's own config")
    p.add_argument("--token-file", help="your bearer token (default: env REMAT_TOKEN)")
    p.add_argument("--tls-ca", help="PEM of the CA that signed the coordinator's certificate")
    a = p.parse_args()
    token = open(a.token_file).read().strip() if a.token_file else None
    try:
        with Client(a.coordinator, token=token, tls_ca=a.tls_ca) as c:
            sid = c.submit(a.spec or my_training_config())
            print("submitted", sid)

            def progress(u):
                last = u["last_trial"]
                print("  %d/%d done%s" % (u["trials_done"], u["trials_planned"],
                                         "  (%s: %s)" % (last["policy"]["canonical"], last["status"])
                                         if last else ""))

            final = c.watch(sid, progress)
            for row in c.rows(sid):
                mem = row["memory_bytes"]
                print("  %-28s %-8s %10s  %s" % (
                    row["policy"], row["status"],
                    "%.2f MiB" % (mem / 2**20) if mem is not None else "-",
                    "%.0f tok/s" % row["tokens_per_s"] if row["tokens_per_s"] else ""))
            if final["recommendation"] is None:
                print("nothing fits:", final["message"])
                return 1
            print("recommended:", final["recommendation"])
            print("Megatron Bridge overrides:", final["apply"]["megatron_bridge"])
            return 0
    except (RematError, SpecError, ValueError) as e:
        print("error:", e, file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1  # bad input (SpecError too) vs the call


if __name__ == "__main__":
    sys.exit(main())
