#!/usr/bin/env python3
"""Writes tests/fixtures/bnb_checkpoint/ with transformers + bitsandbytes (see tests/fixtures/README.md).

Needs torch, transformers, bitsandbytes (>= 0.48 quantises on the CPU) and safetensors.
CI never runs this: the C++ tests read the committed outputs.

    python3 scripts/make_bnb_checkpoint_fixtures.py

llama_int8/: tests/fixtures/llama_gqa loaded with BitsAndBytesConfig(load_in_8bit=True) and saved by
save_pretrained, i.e. an LLM.int8 checkpoint as transformers writes it (config.json with its
quantization_config; model.safetensors with each decoder linear's int8 codes under
"<module>.weight", its f32 row scales under "<module>.SCB" and bitsandbytes' "<module>.weight_format").
llama_nf4/config.json: the config.json save_pretrained writes for the same model loaded with
BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
(its tensors are tests/fixtures/nf4/llama_nf4's layout, so only the config is kept).
"""
import json
import os
import shutil
import tempfile

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

import bitsandbytes as bnb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests", "fixtures", "llama_gqa")
OUT = os.path.join(ROOT, "tests", "fixtures", "bnb_checkpoint")


def save_quantized(config, folder):
    model = AutoModelForCausalLM.from_pretrained(SRC, quantization_config=config, device_map="cpu",
                                                 dtype=torch.float32)
    model.save_pretrained(folder)


def write_int8():
    folder = os.path.join(OUT, "llama_int8")
    shutil.rmtree(folder, ignore_errors=True)
    save_quantized(BitsAndBytesConfig(load_in_8bit=True), folder)
    os.remove(os.path.join(folder, "generation_config.json"))  # not read by the tests
    # What the files must hold for the C++ test to mean anything.
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        names = set(f.keys())
        q = "model.layers.0.self_attn.q_proj"
        assert f.get_tensor(q + ".weight").dtype == torch.int8
        assert f.get_tensor(q + ".SCB").dtype == torch.float32
        assert q + ".weight.SCB" not in names
        fmt = f.get_tensor(q + ".weight_format")
        assert fmt.dtype == torch.uint8 and fmt.shape == () and int(fmt) == 0, fmt  # 0: "row"
    with open(os.path.join(folder, "config.json")) as f:
        assert json.load(f)["quantization_config"]["load_in_8bit"] is True


def write_nf4_config():
    folder = os.path.join(OUT, "llama_nf4")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    with tempfile.TemporaryDirectory() as scratch:
        save_quantized(BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                          bnb_4bit_use_double_quant=True), scratch)
        shutil.copy(os.path.join(scratch, "config.json"), folder)


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    write_int8()
    write_nf4_config()
    print("bitsandbytes", bnb.__version__)


if __name__ == "__main__":
    main()
