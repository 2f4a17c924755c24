#!/usr/bin/env python3
"""Writes tests/fixtures/nf4/ from bitsandbytes itself (see tests/fixtures/README.md).

Needs torch, bitsandbytes (>= 0.48 quantises on the CPU), safetensors and numpy.
CI never runs this: the C++ tests read the committed outputs.

    python3 scripts/make_nf4_fixtures.py

blocks.safetensors: one weight quantised by bnb.functional.quantize_4bit
(quant_type "nf4", blocksize 64, with and without double quantisation) and
dequantised by dequantize_4bit to f32 and bf16, under the keys transformers
writes for a Linear4bit ("weight", "weight.absmax", ...: QuantState.as_dict
with packed=True). llama_nf4/: tests/fixtures/llama_gqa's checkpoint with
every decoder linear stored that way, as a QLoRA checkpoint saved by
transformers is.
"""
import json
import os
import shutil

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import bitsandbytes as bnb
import bitsandbytes.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "nf4")
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def nf4_state_dict(prefix, weight, double_quant=True):
    """The tensors transformers saves for one Linear4bit weight."""
    packed, state = F.quantize_4bit(weight, blocksize=64, quant_type="nf4", compress_statistics=double_quant)
    tensors = {prefix: packed}
    for key, value in state.as_dict(packed=True).items():
        tensors[prefix + "." + key] = value
    return tensors, packed, state


def test_weight():
    """[128, 160]: 320 blocks of 64, so two nested blocks of 256 (the second partial).
    Row 0's first block holds every midpoint between neighbouring codes with
    absmax 1.0 (bnb's tie rule), row 1's first block is all zero."""
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(128, 160, generator=gen) * 0.05
    w[5] *= 40.0  # blocks with a much larger absmax spread the nested range
    code = F.get_4bit_type("nf4", device="cpu")
    mid = (code[:-1] + code[1:]) / 2
    w[0, :64] = 0.0
    w[0, 0] = 1.0
    w[0, 1:16] = mid
    w[0, 16:31] = -mid
    w[0, 31:46] = torch.nextafter(mid, torch.full_like(mid, 2.0))
    w[1, :64] = 0.0
    return w


def write_blocks():
    w = test_weight()
    tensors, packed, state = nf4_state_dict("weight", w)
    plain, plain_packed, plain_state = nf4_state_dict("plain", w, double_quant=False)
    tensors.update(plain)
    tensors["input"] = w
    tensors["dequant_f32"] = F.dequantize_4bit(packed, state, quant_type="nf4").float()
    state.dtype = torch.bfloat16
    tensors["dequant_bf16"] = F.dequantize_4bit(packed, state, quant_type="nf4")
    tensors["plain.dequant_f32"] = F.dequantize_4bit(plain_packed, plain_state, quant_type="nf4").float()
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(OUT, "blocks.safetensors"),
              metadata={"format": "pt", "bitsandbytes": bnb.__version__})


def write_model():
    src = os.path.join(ROOT, "tests", "fixtures", "llama_gqa")
    dst = os.path.join(OUT, "llama_nf4")
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), dst)
    tensors = {}
    for name, value in load_file(os.path.join(src, "model.safetensors")).items():
        if name.endswith(".weight") and name.split(".")[-2] in LINEARS:
            tensors.update(nf4_state_dict(name, value)[0])
        else:
            tensors[name] = value
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(dst, "model.safetensors"),
              metadata={"format": "pt"})


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    write_blocks()
    write_model()


if __name__ == "__main__":
    main()
