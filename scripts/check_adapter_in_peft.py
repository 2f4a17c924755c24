#!/usr/bin/env python3
"""Loads an adapter folder written by the finetune binary into PEFT and compares PEFT's logits with ours.

    python3 scripts/check_adapter_in_peft.py ADAPTER_DIR --base MODEL_DIR [--logits FILE] [--tolerance 1e-4]

FILE (default: ADAPTER_DIR/../adapter_logits.safetensors) holds `input_ids` int32 [1, T] and our `logits`
[T, vocab] of MODEL_DIR in float32 with the adapter (test_finetune_cli writes it for the end-to-end runs).
For an encoder-decoder model (T5; test_t5 writes such a file) it also holds `decoder_input_ids` int32 [1, T'],
`input_ids` feed the encoder and `logits` are [T', vocab].
PEFT runs the same ids through AutoModelForCausalLM or AutoModelForSeq2SeqLM (float32, eager attention) +
PeftModel.from_pretrained;
the script prints max |ours - peft| / max |peft| and exits 1 above the tolerance. Needs torch, transformers,
peft and safetensors; the test suite does not run it.
"""
import argparse
import os
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("adapter", help="adapter folder (adapter_config.json, adapter_model.safetensors)")
    parser.add_argument("--base", required=True, help="the Hugging Face checkpoint folder the adapter was trained on")
    parser.add_argument("--logits", help="our logits (default: ADAPTER/../adapter_logits.safetensors)")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args()
    logits_path = args.logits or os.path.join(os.path.dirname(os.path.abspath(args.adapter)), "adapter_logits.safetensors")

    torch.manual_seed(0)
    ours = load_file(logits_path)
    inputs = {"input_ids": ours["input_ids"].long()}
    seq2seq = "decoder_input_ids" in ours
    if seq2seq:
        inputs["decoder_input_ids"] = ours["decoder_input_ids"].long()
    auto = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM
    base = auto.from_pretrained(args.base, dtype=torch.float32, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, args.adapter).eval()
    adapters = {n: p for n, p in model.named_parameters() if "lora_" in n}
    lora_b = max(p.abs().max().item() for n, p in adapters.items() if "lora_B" in n)

    input_ids = inputs.get("decoder_input_ids", inputs["input_ids"])
    with torch.no_grad():
        peft_logits = model(**inputs).logits[0].double()
        with model.disable_adapter():
            base_logits = model(**inputs).logits[0].double()
    our_logits = ours["logits"].double()
    scale = peft_logits.abs().max().item()
    error = (our_logits - peft_logits).abs().max().item() / scale
    adapter_effect = (peft_logits - base_logits).abs().max().item() / scale
    print(f"{args.adapter}: {len(adapters)} LoRA tensors, max |lora_B| {lora_b:.3e}; "
          f"{input_ids.shape[1]} tokens x {peft_logits.shape[1]} logits")
    print(f"  max |ours - peft| / max |peft| = {error:.3e}  (the adapter moves PEFT's logits by {adapter_effect:.3e})")
    if not error <= args.tolerance:
        print(f"  FAIL: above the tolerance {args.tolerance:g}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
