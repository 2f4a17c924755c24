#!/usr/bin/env python3
"""Writes tests/fixtures/merge/reference.safetensors with PEFT's merge_and_unload().

Needs torch, transformers, peft and safetensors. CI never runs this: the C++
test (tests/test_merge.cpp) reads the committed output.

    python3 scripts/make_merge_fixtures.py                  # write the fixture
    python3 scripts/make_merge_fixtures.py --check llama DIR  # a folder `finetune merge` wrote

For each pair (base fixture, its PEFT adapter): llama = llama_gqa + llama_lora
(q_proj, v_proj), neox = gpt_neox_parallel + gpt_neox_lora (the fused
query_key_value), the adapter is loaded with PeftModel.from_pretrained and
merged with merge_and_unload(); the merged model's logits on `input_ids` are
stored as <name>.logits_f32, and those of the merged weights rounded to bf16
(then run in f32, as our loader widens them) as <name>.logits_bf16.

--check loads DIR with AutoModelForCausalLM.from_pretrained (float32), as a
user would, and prints the largest difference of its logits from PEFT's
merged model's; exit status 1 beyond 1e-5 relative (f32) or the bf16 bound.
"""
import argparse
import os
import sys

import torch
from peft import PeftModel
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
PAIRS = {"llama": ("llama_gqa", "llama_lora"), "neox": ("gpt_neox_parallel", "gpt_neox_lora")}


def input_ids():
    gen = torch.Generator().manual_seed(17)
    return torch.randint(0, 320, (1, 8), generator=gen)


def merged_model(name):
    base_dir, adapter_dir = PAIRS[name]
    base = AutoModelForCausalLM.from_pretrained(os.path.join(FIXTURES, base_dir), dtype=torch.float32)
    return PeftModel.from_pretrained(base, os.path.join(FIXTURES, adapter_dir, "adapter")).merge_and_unload().eval()


@torch.no_grad()
def logits(model, ids):
    return model(input_ids=ids).logits[0].float().contiguous()


@torch.no_grad()
def write():
    ids = input_ids()
    tensors = {"input_ids": ids[0].to(torch.int32)}
    for name in PAIRS:
        model = merged_model(name)
        tensors[f"{name}.logits_f32"] = logits(model, ids)
        tensors[f"{name}.logits_bf16"] = logits(model.to(torch.bfloat16).to(torch.float32), ids)
    out = os.path.join(FIXTURES, "merge")
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "reference.safetensors"))
    print("wrote", os.path.join(out, "reference.safetensors"))


@torch.no_grad()
def check(name, folder):
    ids = input_ids()
    ours = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model = merged_model(name)
    want = logits(model, ids)
    dtype = next(AutoModelForCausalLM.from_pretrained(folder).parameters()).dtype
    if dtype == torch.bfloat16:
        want = logits(model.to(torch.bfloat16).to(torch.float32), ids)
    got = logits(ours, ids)
    diff = (got - want).abs().max().item()
    scale = want.abs().max().item()
    print(f"{folder}: stored {dtype}, max |logit difference| from PEFT's merge_and_unload {diff:.3g}"
          f" (largest |logit| {scale:.3g})")
    return 0 if diff <= 1e-5 * scale + 1e-6 else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", nargs=2, metavar=("NAME", "DIR"))
    args = parser.parse_args()
    if args.check:
        return check(*args.check)
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
