#!/usr/bin/env python3
"""Writes tests/fixtures/course/expected.json: the figures `finetune course` prints, computed with PyTorch,
transformers and PEFT (see tests/fixtures/README.md). CPU only, a few seconds; CI never runs it.

    python3 scripts/make_course_fixture.py

- dtypes: pi stored as torch.tensor(pi, dtype=...) read back, the element size, and torch.finfo / iinfo min and max;
- rule: the course's bytes per parameter (FP32 weights; Adam's two FP32 states, FP32 gradients and its 8-byte
  activation estimate) times 1B, 175B and 500B parameters;
- neox_20b: configs/gpt-neox-20b/config.json built on the meta device by transformers, its parameter count and the
  weight bytes at 32, 16, 8 and 4 bits from its nn.Linear shapes: FP32; BF16; INT8 linears (bitsandbytes' layout:
  int8 codes and one f32 scale per output row) with everything else 16-bit; NF4 with double quantisation (two codes
  per byte, one u8 constant per 64 values, one f32 per 256 constants, a 256-entry f32 map per weight);
- pythia_1b_params: configs/pythia-1b/config.json's parameter count (the planner's FP32 full fine-tuning row);
- lora_512x64: PEFT (r=8) on one bias-free Linear(64, 512): its trainable and base parameter counts;
- flan_t5_base: PEFT's print_trainable_parameters() line for LoRA r=32 on q and v over
  T5ForConditionalGeneration(config) from configs/flan-t5-base/config.json (random init; lm_head untied, as
  from_pretrained loads the hub's checkpoint).
"""
import contextlib
import io
import json
import math
import os

import torch
from peft import LoraConfig, TaskType, get_peft_model
from transformers import AutoConfig, GPTNeoXForCausalLM, T5ForConditionalGeneration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "course", "expected.json")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.int8}


def dtype_figures():
    figures = {}
    for name, dtype in DTYPES.items():
        info = torch.iinfo(dtype) if name == "int8" else torch.finfo(dtype)
        figures[name] = {"bytes": torch.tensor(0, dtype=dtype).element_size(),
                         "pi": float(torch.tensor(math.pi, dtype=dtype)),
                         "min": float(info.min), "max": float(info.max)}
    return figures


def rule_figures():
    fp32 = torch.finfo(torch.float32).bits // 8
    store, train = fp32, fp32 + 2 * fp32 + fp32 + 8  # weights; + Adam's m and v, gradients, activations
    return {"store_bytes_per_param": store, "train_bytes_per_param": train,
            "sizes": [{"params": n, "store_bytes": n * store, "train_bytes": n * train}
                      for n in (10**9, 175 * 10**9, 500 * 10**9)]}


def meta_model(cls, folder):
    config = AutoConfig.from_pretrained(os.path.join(ROOT, "configs", folder))
    with torch.device("meta"):
        return cls(config)


def neox_20b_figures():
    model = meta_model(GPTNeoXForCausalLM, "gpt-neox-20b")
    params = sum(p.numel() for p in model.parameters())
    linears = [m for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and name.startswith("gpt_neox.layers.")]
    linear_weights = sum(m.weight.numel() for m in linears)
    rest = params - linear_weights  # embeddings, norms, biases, embed_out: 16-bit under either quantiser
    int8 = sum(m.weight.numel() + 4 * m.out_features for m in linears) + 2 * rest
    nf4 = 2 * rest
    for m in linears:
        n = m.weight.numel()
        blocks = -(-n // 64)
        nf4 += -(-n // 2) + blocks + 4 * -(-blocks // 256) + 4 * 256
    return {"params": params, "bytes": {"32": 4 * params, "16": 2 * params, "8": int8, "4": nf4}}


def lora_512x64():
    model = torch.nn.Sequential(torch.nn.Linear(64, 512, bias=False))
    peft_model = get_peft_model(model, LoraConfig(r=8, target_modules=["0"]))
    trainable, all_params = peft_model.get_nb_trainable_parameters()
    return {"trainable": trainable, "base": all_params - trainable}


def flan_t5_base_line():
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(os.path.join(ROOT, "configs", "flan-t5-base"))
    model = T5ForConditionalGeneration(config)
    # transformers 5 ties T5's head to the shared embedding whenever a model is built from a config; FLAN-T5's
    # checkpoint has a head of its own (tie_word_embeddings false), which from_pretrained keeps, so this one does too.
    model.lm_head.weight = torch.nn.Parameter(torch.empty(config.vocab_size, config.d_model))
    assert not config.scale_decoder_outputs
    lora = LoraConfig(r=32, lora_alpha=32, target_modules=["q", "v"], lora_dropout=0.05, bias="none",
                      task_type=TaskType.SEQ_2_SEQ_LM)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        get_peft_model(model, lora).print_trainable_parameters()
    return {"line": out.getvalue().rstrip("\n")}


def main():
    figures = {"dtypes": dtype_figures(), "rule": rule_figures(), "neox_20b": neox_20b_figures(),
               "pythia_1b_params": sum(p.numel() for p in meta_model(GPTNeoXForCausalLM, "pythia-1b").parameters()),
               "lora_512x64": lora_512x64(), "flan_t5_base": flan_t5_base_line()}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(figures, f, indent=1)
        f.write("\n")
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
