#!/usr/bin/env python3
"""A Megatron Bridge pretraining run for remat's `command` backend: one trial of a recompute policy.

remat-worker runs it through an operator's command template (worker/megatron_bridge/
command-templates.yaml, docs/megatron-bridge.md), once per trial, or once per proxy depth:

    torchrun --standalone --nproc-per-node 8 pretrain_with_remat.py \
        --recipe megatron.bridge.recipes.llama:llama3_8b_pretrain_config \
        model.recompute_granularity=selective ... model.num_layers=4 train.train_iters=13

It builds the recipe's ConfigContainer, applies the Hydra-style overrides the template pasted
(the policy's recompute fields, the layer count, the iterations and batch), and trains with
RematMetricsCallback, which enforces the trial's memory budget ($REMAT_MEMORY_BUDGET_BYTES) and
writes the metrics file the worker reads ($REMAT_METRICS_FILE). A training error is recorded in
that file before it propagates (an out-of-memory error as status oom).

Needs Megatron Bridge with training callbacks (megatron.bridge.training.callbacks) and OmegaConf.
`--check` prints the configuration after the overrides and exits without training (no GPU).
"""

import argparse
import importlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from remat_metrics_callback import RematMetricsCallback  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", required=True,
                        help="MODULE:FUNCTION returning the recipe's ConfigContainer, e.g. "
                             "megatron.bridge.recipes.llama:llama3_8b_pretrain_config")
    parser.add_argument("--recipe-kwarg", action="append", default=[], metavar="NAME=JSON",
                        help="a keyword argument of the recipe function, its value JSON "
                             "(repeatable), e.g. --recipe-kwarg 'seq_length=4096'")
    parser.add_argument("--check", action="store_true",
                        help="print the configuration after the overrides and exit")
    args, overrides = parser.parse_known_args(argv)
    for o in overrides:
        if o.startswith("-"):
            parser.error("unknown option %s (overrides are KEY=VALUE)" % o)
    return args, overrides


def recipe_kwargs(items):
    """--recipe-kwarg NAME=JSON items as a dict; ValueError naming the item that is malformed."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError("--recipe-kwarg %r: expected NAME=JSON" % item)
        try:
            out[name] = json.loads(value)
        except ValueError:
            out[name] = value  # a bare word is a string: --recipe-kwarg dir=/data
    return out


def load_recipe(spec):
    module_name, sep, function = spec.partition(":")
    if not sep or not module_name or not function:
        raise ValueError("--recipe %r: expected MODULE:FUNCTION" % spec)
    return getattr(importlib.import_module(module_name), function)


def build_config(recipe, kwargs, overrides):
    """The recipe's ConfigContainer with the Hydra-style overrides applied (Megatron Bridge's own
    OmegaConf helpers, so the overrides mean what they mean in Bridge's example scripts)."""
    from omegaconf import OmegaConf  # noqa: PLC0415
    from megatron.bridge.training.utils.omegaconf_utils import (  # noqa: PLC0415
        apply_overrides, create_omegaconf_dict_config, parse_hydra_overrides)
    cfg = recipe(**kwargs)
    if overrides:
        merged, excluded = create_omegaconf_dict_config(cfg)
        merged = parse_hydra_overrides(merged, overrides)
        apply_overrides(cfg, OmegaConf.to_container(merged, resolve=True), excluded)
    return cfg


def main(argv):
    args, overrides = parse_args(argv)
    # Created first: a malformed budget stops the job before anything is built.
    callback = RematMetricsCallback()
    try:
        cfg = build_config(load_recipe(args.recipe), recipe_kwargs(args.recipe_kwarg), overrides)
        if args.check:
            cfg.print_yaml()
            return 0
        from megatron.bridge.training.gpt_step import forward_step  # noqa: PLC0415
        from megatron.bridge.training.pretrain import pretrain  # noqa: PLC0415
        pretrain(config=cfg, forward_step_func=forward_step, callbacks=[callback])
    except Exception as exc:  # recorded (oom or failed), then the job fails as it would anyway
        callback.record_failure(exc)
        raise
    import torch  # noqa: PLC0415
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
