#!/usr/bin/env python3
"""megatron-core's OptimizerParamScheduler over whole runs: the learning rate and weight decay of
every step, for mpitron's schedules (model/training/lr_schedule.h; tests/model/test_schedule.cpp).

Run from the repository root with the reference venv (megatron-core 0.16.1 from PyPI;
scripts/setup-reference-venv.sh):
    /work/.venv-ref/bin/python tests/reference/megatron_sched_ref.py
Writes tests/model/ref/schedules/megatron_sched.json:
  {"megatron_core": VERSION, "configs": [{"name", "flags": [mpitron's schedule flags],
    "global_batch_size", "unit": "iterations"|"samples", "lr": [...], "wd": [...]}]}
lr[k], wd[k]: what iteration k + 1 trains with (the scheduler after k successful steps, each
stepping it by the global batch, as megatron/training/training.py does), k = 0 .. iterations,
and the decaying parameter group's weight decay (wd_mult 1). The scheduler is built from the
flags by megatron/training/training.py's get_optimizer_param_scheduler and arguments.py's
weight-decay rule (transcribed below: megatron-core's wheel ships megatron/core only).
"""
import json
import os
import sys
from types import SimpleNamespace

import megatron.core
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler


class _Opt:  # what the scheduler touches of a MegatronOptimizer
    def __init__(self):
        self.param_groups = [{"wd_mult": 1.0, "default_config": True}, {"wd_mult": 0.0}]


DEFAULTS = dict(lr=3e-3, min_lr=0.0, lr_warmup_init=0.0, lr_decay_style="linear", lr_decay_iters=None,
                lr_decay_samples=None, lr_warmup_fraction=None, lr_warmup_iters=0, lr_warmup_samples=0,
                lr_wsd_decay_style="exponential", lr_wsd_decay_iters=None, lr_wsd_decay_samples=None,
                weight_decay=0.01, start_weight_decay=None, end_weight_decay=None,
                weight_decay_incr_style="constant", train_iters=None, train_samples=None, global_batch_size=4)

FLAG = {"lr": "--lr", "min_lr": "--min-lr", "lr_warmup_init": "--lr-warmup-init",
        "lr_decay_style": "--lr-decay-style", "lr_decay_iters": "--lr-decay-iters",
        "lr_decay_samples": "--lr-decay-samples", "lr_warmup_fraction": "--lr-warmup-fraction",
        "lr_warmup_iters": "--lr-warmup-iters", "lr_warmup_samples": "--lr-warmup-samples",
        "lr_wsd_decay_style": "--lr-wsd-decay-style", "lr_wsd_decay_iters": "--lr-wsd-decay-iters",
        "lr_wsd_decay_samples": "--lr-wsd-decay-samples", "weight_decay": "--weight-decay",
        "start_weight_decay": "--start-weight-decay", "end_weight_decay": "--end-weight-decay",
        "weight_decay_incr_style": "--weight-decay-incr-style", "train_iters": "--train-iters",
        "train_samples": "--train-samples", "global_batch_size": "--global-batch-size"}

it = dict(train_iters=40)
sm = dict(train_samples=160)
CONFIGS = [
    ("constant_warmup", dict(it, lr_decay_style="constant", lr_warmup_iters=5)),
    ("linear_min_lr", dict(it, lr_decay_style="linear", lr_warmup_iters=5, min_lr=3e-4)),
    ("cosine_fraction_short_decay", dict(it, lr_decay_style="cosine", lr_warmup_fraction=0.1, lr_decay_iters=30,
                                         min_lr=1e-4)),
    ("linear_warmup_init", dict(it, lr_decay_style="linear", lr_warmup_iters=6, lr_warmup_init=1e-3, min_lr=2e-4)),
    ("inverse_sqrt_warmup", dict(it, lr_decay_style="inverse-square-root", lr_warmup_iters=6, min_lr=5e-4)),
    ("inverse_sqrt_no_warmup", dict(it, lr_decay_style="inverse-square-root", lr_decay_iters=32)),
    ("wsd_exponential", dict(it, lr_decay_style="WSD", lr_wsd_decay_style="exponential", lr_warmup_iters=4,
                             lr_decay_iters=36, lr_wsd_decay_iters=12, min_lr=3e-4)),
    ("wsd_linear", dict(it, lr_decay_style="WSD", lr_wsd_decay_style="linear", lr_warmup_iters=4,
                        lr_decay_iters=36, lr_wsd_decay_iters=12, min_lr=3e-4)),
    ("wsd_cosine", dict(it, lr_decay_style="WSD", lr_wsd_decay_style="cosine", lr_warmup_iters=4,
                        lr_wsd_decay_iters=10)),
    ("wsd_minus_sqrt", dict(it, lr_decay_style="WSD", lr_wsd_decay_style="minus_sqrt", lr_warmup_fraction=0.05,
                            lr_decay_iters=36, lr_wsd_decay_iters=36, min_lr=1e-5)),
    ("wd_linear", dict(it, lr_decay_style="cosine", lr_warmup_iters=3, weight_decay_incr_style="linear",
                       start_weight_decay=0.0, end_weight_decay=0.1)),
    ("wd_cosine", dict(it, lr_decay_style="linear", weight_decay_incr_style="cosine", start_weight_decay=0.02,
                       end_weight_decay=0.1)),
    ("wd_constant_0.1", dict(it, lr_decay_style="cosine", weight_decay=0.1)),
    ("samples_cosine", dict(sm, lr_decay_style="cosine", lr_warmup_samples=10, lr_decay_samples=130, min_lr=1e-4)),
    ("samples_wsd_linear", dict(sm, lr_decay_style="WSD", lr_wsd_decay_style="linear", lr_warmup_samples=10,
                                lr_decay_samples=150, lr_wsd_decay_samples=50, min_lr=1e-4)),
    ("samples_wsd_exponential_fraction", dict(sm, lr_decay_style="WSD", lr_warmup_fraction=0.1,
                                              lr_wsd_decay_samples=42, weight_decay_incr_style="linear",
                                              start_weight_decay=0.01, end_weight_decay=0.05)),
    ("samples_inverse_sqrt", dict(sm, lr_decay_style="inverse-square-root", lr_warmup_samples=12)),
    # tests/model/test_trainer.cpp's WSD resume (base_flags' --lr 3e-3 --min-lr 3e-4 --lr-warmup-iters 3, 16 iterations)
    ("trainer_wsd_resume", dict(train_iters=16, min_lr=3e-4, lr_warmup_iters=3, lr_decay_style="WSD",
                                lr_wsd_decay_style="cosine", lr_wsd_decay_iters=8, weight_decay_incr_style="linear",
                                start_weight_decay=0.0, end_weight_decay=0.1)),
]


def scheduler(a):
    """megatron/training/training.py get_optimizer_param_scheduler (+ arguments.py's weight-decay rule)."""
    if a.weight_decay_incr_style == "constant":
        assert a.start_weight_decay is None and a.end_weight_decay is None
        a.start_weight_decay = a.end_weight_decay = a.weight_decay
    else:
        assert a.start_weight_decay is not None and a.end_weight_decay is not None
    gbs = a.global_batch_size
    if a.train_iters:
        if a.lr_decay_iters is None:
            a.lr_decay_iters = a.train_iters
        lr_decay_steps = a.lr_decay_iters * gbs
        wd_incr_steps = a.train_iters * gbs
        wsd_decay_steps = None
        if a.lr_wsd_decay_iters is not None:
            wsd_decay_steps = a.lr_wsd_decay_iters * gbs
        if a.lr_warmup_fraction is not None:
            lr_warmup_steps = a.lr_warmup_fraction * lr_decay_steps
        else:
            lr_warmup_steps = a.lr_warmup_iters * gbs
    else:
        if a.lr_decay_samples is None:
            a.lr_decay_samples = a.train_samples
        lr_decay_steps = a.lr_decay_samples
        wd_incr_steps = a.train_samples
        wsd_decay_steps = a.lr_wsd_decay_samples
        if a.lr_warmup_fraction is not None:
            lr_warmup_steps = a.lr_warmup_fraction * lr_decay_steps
        else:
            lr_warmup_steps = a.lr_warmup_samples
    opt = _Opt()
    s = OptimizerParamScheduler(opt, init_lr=a.lr_warmup_init, max_lr=a.lr, min_lr=a.min_lr,
                                lr_warmup_steps=lr_warmup_steps, lr_decay_steps=lr_decay_steps,
                                lr_decay_style=a.lr_decay_style, start_wd=a.start_weight_decay,
                                end_wd=a.end_weight_decay, wd_incr_steps=wd_incr_steps,
                                wd_incr_style=a.weight_decay_incr_style,
                                use_checkpoint_opt_param_scheduler=False, override_opt_param_scheduler=False,
                                wsd_decay_steps=wsd_decay_steps, lr_wsd_decay_style=a.lr_wsd_decay_style)
    return s, opt


def run(name, given):
    a = SimpleNamespace(**dict(DEFAULTS, **given))
    flags = []
    for k, v in given.items():
        flags += [FLAG[k], repr(v) if isinstance(v, float) else str(v)]
    flags += ["--global-batch-size", str(a.global_batch_size)]
    s, opt = scheduler(a)
    iters = a.train_iters if a.train_iters else a.train_samples // a.global_batch_size
    lr, wd = [], []
    for k in range(iters + 1):
        assert opt.param_groups[1]["weight_decay"] == 0.0  # wd_mult 0: biases and norms
        lr.append(opt.param_groups[0]["lr"])
        wd.append(opt.param_groups[0]["weight_decay"])
        s.step(increment=a.global_batch_size)
    return {"name": name, "flags": flags, "global_batch_size": a.global_batch_size,
            "unit": "iterations" if a.train_iters else "samples", "lr": lr, "wd": wd}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/model/ref/schedules/megatron_sched.json"
    configs = [run(n, g) for n, g in CONFIGS]
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"megatron_core": megatron.core.__version__, "configs": configs}, f, indent=1)
        f.write("\n")
    print(f"wrote {out}: {len(configs)} schedules")


if __name__ == "__main__":
    main()
