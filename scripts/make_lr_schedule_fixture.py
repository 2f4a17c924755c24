#!/usr/bin/env python3
"""Writes tests/fixtures/lr_schedule.json: the learning rate transformers'
schedules give each optimizer step.

    pip install torch transformers && python3 scripts/make_lr_schedule_fixture.py

For each schedule (constant, linear and cosine with warmup; cosine with a
floor, transformers' cosine_with_min_lr) a torch optimizer steps through the
run as transformers' Trainer does: optimizer.step() with the current lr, then
scheduler.step(). `applied[s]` is the lr optimizer step s (0-based) used.
tests/test_adamw.cpp compares trainer/lr_schedule.cpp's LrSchedule::lr_at.
"""
import json
import os

import torch
import transformers
from transformers import (get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup,
                          get_cosine_with_min_lr_schedule_with_warmup, get_linear_schedule_with_warmup)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "lr_schedule.json")
PEAK_LR = 1e-3


def applied_lrs(make_scheduler, total_steps):
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([weight], lr=PEAK_LR)
    scheduler = make_scheduler(optimizer)
    lrs = []
    for _ in range(total_steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def main():
    cases = []
    for warmup, total in [(0, 10), (3, 10), (4, 7)]:
        schedules = {
            "constant": lambda o: get_constant_schedule_with_warmup(o, warmup),
            "linear": lambda o: get_linear_schedule_with_warmup(o, warmup, total),
            "cosine": lambda o: get_cosine_schedule_with_warmup(o, warmup, total),
            "cosine_min_lr_0.1": lambda o: get_cosine_with_min_lr_schedule_with_warmup(o, warmup, total,
                                                                                      min_lr_rate=0.1),
        }
        for name, make in schedules.items():
            cases.append({"schedule": name, "warmup_steps": warmup, "total_steps": total, "peak_lr": PEAK_LR,
                          "applied": applied_lrs(make, total)})
    with open(OUT, "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "cases": cases}, f, indent=1)
        f.write("\n")
    print(len(cases), "cases ->", OUT)


if __name__ == "__main__":
    main()
