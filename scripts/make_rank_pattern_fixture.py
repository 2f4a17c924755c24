#!/usr/bin/env python3
"""rank_pattern fixture: tests/fixtures/rank_pattern/ with PEFT's per-module rank and alpha.

PEFT's LoraConfig on tests/fixtures/llama_gqa, every Llama linear adapted at
r=4, lora_alpha=8, with rank_pattern and alpha_pattern giving some modules
their own (a plain name, a dotted path and a regular expression), in float32:
  - adapter/: the PEFT adapter folder, lora_B set to seeded noise so every
    tensor gets a gradient;
  - reference.safetensors: input_ids, labels, logits, loss, the gradient of
    every adapter tensor (grad.<saved name>) and the weights of
    merge_and_unload() (merged.<base tensor name>) for the adapted linears.
The float32 values are checked against a float64 run of the same model.
Needs torch, transformers, peft and safetensors (CPU is enough);
tests/test_rank_pattern.cpp reads the result.
"""
import copy
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import ALL_LLAMA_LINEARS, LORA, lora_reference, make_peft_model, save_adapter  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
SEED = 43
# No key matches a module another key matches: PEFT saves the dicts with sorted keys, so an adapter whose
# patterns overlap could load back with other ranks than it trained with.
RANK_PATTERN = {"q_proj": 8, "layers.1.mlp.down_proj": 2, r"layers\.0\.mlp\.(gate|up)_proj": 6}
ALPHA_PATTERN = {"v_proj": 32, "o_proj": 4}


def main():
    out_dir = os.path.join(FIXTURES, "rank_pattern")
    os.makedirs(out_dir, exist_ok=True)
    base = AutoModelForCausalLM.from_pretrained(os.path.join(FIXTURES, "llama_gqa"), dtype=torch.float32,
                                                attn_implementation="eager")
    lora = dict(LORA, target_modules=ALL_LLAMA_LINEARS, rank_pattern=RANK_PATTERN, alpha_pattern=ALPHA_PATTERN)
    model, trainable = make_peft_model(base, lora, "llama_gqa", SEED)
    adapter_dir = os.path.join(out_dir, "adapter")
    save_adapter(model, trainable, adapter_dir)
    saved = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    ranks = sorted({v.shape[0] for k, v in saved.items() if "lora_A" in k})
    assert ranks == [2, 4, 6, 8], ranks  # every pattern took effect

    ref = lora_reference("rank_pattern", model)

    modules = sorted({k.split(".lora_")[0].replace("base_model.model.", "", 1) for k in saved})
    merged = copy.deepcopy(model).merge_and_unload()
    ref.update({f"merged.{m}.weight": merged.get_submodule(m).weight.detach().clone() for m in modules})
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out_dir, "reference.safetensors"))


if __name__ == "__main__":
    main()
