#!/usr/bin/env python3
"""Writes tests/fixtures/merge/quantized_reference.safetensors: an adapter
merged into a base saved quantised, from bitsandbytes' own dequantisation.

    pip install torch bitsandbytes safetensors && python3 scripts/make_quantized_merge_fixture.py

For the two bases bitsandbytes saved (tests/fixtures/nf4/llama_nf4: NF4 with
double quantisation; tests/fixtures/bnb_checkpoint/llama_int8: LLM.int8()),
both llama_gqa quantised, and the llama_lora adapter (q_proj, v_proj):
the adapted weights and one other (layer 0's down_proj) are dequantised by
bitsandbytes (dequantize_4bit with the saved QuantState; int8_vectorwise_dequant
of the codes and SCB, as PEFT's dequantize_bnb_weight does), and an adapted
one gets scaling * B @ A added in f32: unsloth's merged_16bit, in f32. Keys:
"<nf4|int8>.<tensor name>".
tests/test_merge.cpp compares `finetune merge`'s output with these.
"""
import json
import os

import bitsandbytes as bnb
import torch
from bitsandbytes.functional import QuantState
from safetensors import safe_open
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
BASES = {"nf4": "nf4/llama_nf4", "int8": "bnb_checkpoint/llama_int8"}
KEPT = ("q_proj", "v_proj", "layers.0.mlp.down_proj")


def tensors(path):
    with safe_open(path, "pt") as f:
        return {key: f.get_tensor(key) for key in f.keys()}


def dequantised(base, weights):
    out = {}
    for name, value in weights.items():
        if not any(kept in name for kept in KEPT):
            continue
        if base == "nf4" and value.dtype == torch.uint8 and name.endswith(".weight"):
            state = {k[len(name) + 1:]: v for k, v in weights.items() if k.startswith(name + ".")}
            quant_state = QuantState.from_dict(state, device=torch.device("cpu"))
            out[name] = bnb.functional.dequantize_4bit(value, quant_state).float()
        elif base == "int8" and value.dtype == torch.int8:
            scales = weights[name[: -len(".weight")] + ".SCB"]
            out[name] = bnb.functional.int8_vectorwise_dequant(value, scales).float()
    return out


def main():
    adapter_dir = os.path.join(FIXTURES, "llama_lora", "adapter")
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        config = json.load(f)
    scaling = config["lora_alpha"] / config["r"]
    adapter = tensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    out = {}
    for base, folder in BASES.items():
        weights = tensors(os.path.join(FIXTURES, folder, "model.safetensors"))
        for name, weight in dequantised(base, weights).items():
            module = "base_model.model." + name[: -len(".weight")]
            if module + ".lora_A.weight" in adapter:
                A, B = adapter[module + ".lora_A.weight"].float(), adapter[module + ".lora_B.weight"].float()
                weight = weight + scaling * (B @ A)
            out[base + "." + name] = weight.contiguous()
    path = os.path.join(FIXTURES, "merge", "quantized_reference.safetensors")
    save_file(out, path, metadata={"bitsandbytes": bnb.__version__, "torch": torch.__version__})
    os.chmod(path, 0o644)
    print(len(out), "tensors ->", path)


if __name__ == "__main__":
    main()
