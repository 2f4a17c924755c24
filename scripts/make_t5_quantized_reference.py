"""The tiny T5 v1.1 fixture (tests/fixtures/t5_v1_1) over an NF4 base as transformers + bitsandbytes build it:
every linear but the feed-forward output `wo` (T5's _keep_in_fp32_modules, which bitsandbytes' quantizer leaves
unconverted) replaced by bitsandbytes' dequantize_4bit(quantize_4bit(W, nf4, blocksize 64, double quantisation)),
in f32, with the fixture's PEFT adapter: the loss of lora_reference.safetensors' batch and the cosine between its
LoRA gradients (all adapters together) and the f32 model's (lora_reference's grad.*). Writes
tests/fixtures/t5_v1_1/nf4_reference.json, which tests/test_t5.cpp checks our NF4 T5 against.

Usage: make_t5_quantized_reference.py [--fixture tests/fixtures/t5_v1_1]
Needs torch, transformers, peft, safetensors and bitsandbytes (its CPU quantize_4bit / dequantize_4bit).
"""
import argparse
import json
import os

import bitsandbytes
import bitsandbytes.functional as F
import peft
import torch
import transformers
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fixture", default=os.path.join(HERE, "..", "tests", "fixtures", "t5_v1_1"))
    args = parser.parse_args()
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration.from_pretrained(args.fixture, dtype=torch.float32)
    kept, replaced = [], []
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear) or name == "lm_head":
                continue
            if name.endswith(".wo"):
                kept.append(name)
                continue
            packed, state = F.quantize_4bit(module.weight.data, blocksize=64, compress_statistics=True,
                                            quant_type="nf4")
            module.weight.data = F.dequantize_4bit(packed, state, quant_type="nf4").float()
            replaced.append(name)
    model = peft.PeftModel.from_pretrained(model, os.path.join(args.fixture, "adapter"), is_trainable=True)
    model.eval()  # no dropout: the fixture's gradients are dropout-free
    reference = load_file(os.path.join(args.fixture, "lora_reference.safetensors"))
    out = model(input_ids=reference["input_ids"].long(), decoder_input_ids=reference["decoder_input_ids"].long(),
                labels=reference["labels"].long())
    out.loss.backward()
    dot = ours = theirs = 0.0
    for name, parameter in model.named_parameters():
        if "lora_" not in name:
            continue
        key = "grad." + name.replace(".default", "")
        want = reference[key].double()
        got = parameter.grad.double()
        dot += float((got * want).sum())
        ours += float((got * got).sum())
        theirs += float((want * want).sum())
    result = {"transformers": transformers.__version__, "peft": peft.__version__,
              "bitsandbytes": bitsandbytes.__version__, "torch": torch.__version__,
              "quantized_linears": len(replaced), "kept_linears": len(kept),
              "loss": float(out.loss), "lora_gradient_cosine_with_f32": dot / (ours * theirs) ** 0.5}
    with open(os.path.join(args.fixture, "nf4_reference.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
