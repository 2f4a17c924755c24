#!/usr/bin/env python3
"""Writes tests/fixtures/packing/: transformers' logits for padding-free packed rows.

Needs torch, transformers and safetensors (CPU is enough); CI never runs it.

    python3 scripts/make_packing_fixture.py

For three fixture checkpoints (Llama with GQA and llama3 rope, Mistral with a
sliding window of 4, GPT-NeoX with partial rotary) one row of three examples
(lengths 9, 5 and 10) runs through transformers with position_ids that
restart at 0 for each example, no attention_mask and no cache: transformers then masks
attention to each example (masking_utils' packed-sequence detection, as
DataCollatorWithFlattening relies on). The script checks that every
example's logits equal those of the example run alone, so the fixture holds
the packed semantics and not an artefact of the mask, and writes
<name>.safetensors: input_ids and position_ids i32 [1, 24], logits f32
[24, vocab]. tests/test_packing.cpp runs the same row with our model.
"""
import os

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
LENGTHS = [9, 5, 10]

torch.manual_seed(0)
torch.set_num_threads(1)


def packed_row(vocab_size):
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(4, vocab_size, (1, sum(LENGTHS)), generator=generator)
    positions = torch.cat([torch.arange(length) for length in LENGTHS]).unsqueeze(0)
    return ids, positions


def main():
    out_dir = os.path.join(FIXTURES, "packing")
    os.makedirs(out_dir, exist_ok=True)
    for name in ("llama3_tiny", "mistral", "gpt_neox_parallel"):
        model = AutoModelForCausalLM.from_pretrained(os.path.join(FIXTURES, name), dtype=torch.float32,
                                                     attn_implementation="sdpa").eval()
        ids, positions = packed_row(model.config.vocab_size)
        with torch.no_grad():
            packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0]
            start, worst = 0, 0.0
            for length in LENGTHS:
                alone = model(input_ids=ids[:, start:start + length], use_cache=False).logits[0]
                worst = max(worst, (alone - packed[start:start + length]).abs().max().item())
                start += length
            crossing = model(input_ids=ids, use_cache=False).logits[0]
        assert worst < 1e-5, f"{name}: packed logits differ from each example alone by {worst}"
        assert (crossing - packed).abs().max().item() > 1e-3, f"{name}: position_ids did not separate the examples"
        save_file({"input_ids": ids.to(torch.int32).contiguous(), "position_ids": positions.to(torch.int32).contiguous(),
                   "logits": packed.contiguous()}, os.path.join(out_dir, name + ".safetensors"))
        print(f"{name}: packed == alone within {worst:.2e}; written")


if __name__ == "__main__":
    main()
