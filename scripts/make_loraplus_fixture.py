#!/usr/bin/env python3
"""LoRA+ fixture: tests/fixtures/loraplus/reference.safetensors.

PEFT's create_loraplus_optimizer (torch.optim.AdamW; lr 1e-2, loraplus_lr_ratio
16, loraplus_weight_decay 0.01, betas (0.9, 0.999), eps 1e-8) takes one step
over the DoRA adapter of tests/fixtures/dora/llama (rebuilt here as
scripts/make_dora_fixture.py builds it, and checked equal to the saved one):
lora_A steps at lr, lora_B and the 1-D magnitudes at 16 x lr. Holds the
gradient of every adapter tensor (grad.<saved name>), the tensors after the
step (after_step.<saved name>) and the loss after it, on the DoRA fixture's
input_ids and labels. Needs torch, transformers, peft and safetensors (CPU is
enough); tests/test_loraplus.cpp reads it.
"""
import os
import sys

import torch
from peft.optimizers import create_loraplus_optimizer
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_dora_fixture import CASES, FIXTURES, forward_backward, make_dora_model, saved_name  # noqa: E402
from make_fixtures import make_inputs  # noqa: E402

LORAPLUS = dict(lr=1e-2, loraplus_lr_ratio=16.0, loraplus_weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)


def main():
    base_folder, targets, seed = CASES["llama"]
    model, _ = make_dora_model(os.path.join(FIXTURES, base_folder), base_folder, targets, seed)
    saved = load_file(os.path.join(FIXTURES, "dora", "llama", "adapter", "adapter_model.safetensors"))
    for n, p in model.named_parameters():
        if p.requires_grad:
            assert torch.equal(saved[saved_name(n)], p), n

    input_ids, labels = make_inputs(model.config.vocab_size)
    _, loss, grads = forward_backward(model, input_ids, labels)
    optimizer = create_loraplus_optimizer(model, torch.optim.AdamW, foreach=False, fused=False, **LORAPLUS)
    groups = [(g["lr"], len(g["params"])) for g in optimizer.param_groups if g["params"]]
    print(f"loraplus: loss {loss.item():.8f}; (lr, tensors) per group: {groups}")
    optimizer.step()
    after = {saved_name(n): p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    with torch.no_grad():
        loss_after = model(input_ids=input_ids, labels=labels).loss.detach().clone()
    print(f"  loss after one LoRA+ step: {loss_after.item():.8f}")

    ref = {"loss_after_step": loss_after.reshape(1)}
    ref.update({f"grad.{k}": g for k, g in grads.items()})
    ref.update({f"after_step.{k}": p for k, p in after.items()})
    out_dir = os.path.join(FIXTURES, "loraplus")
    os.makedirs(out_dir, exist_ok=True)
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out_dir, "reference.safetensors"))


if __name__ == "__main__":
    main()
