#!/usr/bin/env python3
"""Writes tests/fixtures/merge/variants/: PEFT adapters saved the ways PEFT
saves modules beside LoRA, and the logits PEFT's PeftModel.from_pretrained
gives with each over a fresh base.

Needs torch, transformers, peft and safetensors. CI never runs this: the C++
test (tests/test_merge.cpp) reads the committed output.

    python3 scripts/make_merge_variants_fixture.py

Each case is get_peft_model over a fixture base, its lora_B and every saved
module's copy set to seeded random values (an untrained adapter would equal
the base), saved with save_pretrained into <case>/adapter; then loaded again
over a fresh base with PeftModel.from_pretrained, whose logits on
`input_ids` are stored as <case>.logits in reference.safetensors:

- norms: modules_to_save=["norm"] on llama_gqa. PEFT matches a module whose
  name ends with the string, so it saves every input_layernorm,
  post_attention_layernorm and the final norm.
- neox_norms: modules_to_save=["input_layernorm"] on gpt_neox_sequential (a
  LayerNorm: weight and bias saved).
- tied_head: modules_to_save=["lm_head"] with ensure_weight_tying=True on
  llama_tied. PEFT rewrites the list to ["model.embed_tokens"], keeps the
  head tied to that copy and saves both tensors.
- head_lora: target_modules=["q_proj", "lm_head"] on llama_gqa, saved with
  PEFT's default save_embedding_layers="auto", which also saves the head's
  base weight (lm_head.base_layer.weight).
- untied_head: modules_to_save=["lm_head"] on llama_tied: PEFT unties the
  head, the embedding stays the base's.
- score: a sequence classifier (task_type SEQ_CLS, one label) over
  llama_gqa, whose modules_to_save PEFT sets to ["classifier", "score"]
  (no logits stored: what is checked is that export refuses its score head).
"""
import os

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(FIXTURES, "merge", "variants")

CASES = {
    "norms": ("llama_gqa", dict(target_modules=["q_proj", "v_proj"], modules_to_save=["norm"])),
    "neox_norms": ("gpt_neox_sequential",
                   dict(target_modules=["query_key_value"], modules_to_save=["input_layernorm"])),
    "tied_head": ("llama_tied", dict(target_modules=["q_proj"], modules_to_save=["lm_head"],
                                     ensure_weight_tying=True)),
    "head_lora": ("llama_gqa", dict(target_modules=["q_proj", "lm_head"])),
    "untied_head": ("llama_tied", dict(target_modules=["q_proj"], modules_to_save=["lm_head"])),
    "score": ("llama_gqa", dict(target_modules=["q_proj"], task_type="SEQ_CLS")),
}


def input_ids():
    gen = torch.Generator().manual_seed(17)
    return torch.randint(0, 320, (1, 8), generator=gen)


def base(name, task_type):
    auto = AutoModelForSequenceClassification if task_type == "SEQ_CLS" else AutoModelForCausalLM
    kwargs = dict(num_labels=1) if task_type == "SEQ_CLS" else {}
    return auto.from_pretrained(os.path.join(FIXTURES, name), dtype=torch.float32, **kwargs).eval()


@torch.no_grad()
def randomize(model, seed):
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if not p.requires_grad or "lora_A" in name:
            continue
        # lora_B starts at zero; a saved module's copy starts as the base's.
        scale = 0.2 if "lora_B" in name else 0.3
        p.add_(torch.randn(p.shape, generator=gen) * scale)


@torch.no_grad()
def write():
    ids = input_ids()
    tensors = {"input_ids": ids[0].to(torch.int32)}
    for seed, (case, (base_name, lora)) in enumerate(CASES.items()):
        torch.manual_seed(seed)
        lora = {"task_type": "CAUSAL_LM", **lora}
        model = get_peft_model(base(base_name, lora["task_type"]), LoraConfig(r=2, lora_alpha=4, **lora))
        randomize(model, seed)
        folder = os.path.join(OUT, case, "adapter")
        model.save_pretrained(folder)
        if lora["task_type"] == "CAUSAL_LM":
            loaded = PeftModel.from_pretrained(base(base_name, "CAUSAL_LM"), folder).eval()
            tensors[f"{case}.logits"] = loaded(input_ids=ids).logits[0].float().contiguous()
        print("wrote", folder)
    save_file(tensors, os.path.join(OUT, "reference.safetensors"))
    print("wrote", os.path.join(OUT, "reference.safetensors"))


if __name__ == "__main__":
    write()
