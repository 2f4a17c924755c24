#!/usr/bin/env python3
"""Full fine-tuning reloaded through transformers: tests/fixtures/full_finetune/reference.safetensors and tensors.json.

    python3 scripts/make_full_finetune_fixture.py [FINETUNE_BINARY]   (default: build/finetune/finetune)

Runs the finetune binary on tests/fixtures/full_finetune/config.yaml (`trainable: all`, f32, CPU, fixed seed and
data) into a temporary folder, then loads the saved model folder as a user would:
AutoModelForCausalLM.from_pretrained(folder) (float32, eager attention), failing on any missing, unexpected or
mismatched tensor. It writes
- reference.safetensors: `input_ids` int32 [1, T] (fixed ids) and transformers' `logits` f32 [T, vocab] of the
  saved folder on them;
- tensors.json: the tensors transformers itself writes for this model (save_pretrained of the loaded model):
  {name: {"dtype", "shape"}}, what the saved model.safetensors must hold.
It also checks that the saved folder's tensor list equals that one and that training moved the logits away from
the base's (the fixture would not tell a trained folder from an untrained one otherwise). Needs torch,
transformers and safetensors; the test suite does not run it.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "full_finetune")
BASE = os.path.join(ROOT, "tests", "fixtures", "llama_gqa")
TOKENS = 24


def safetensors_header(path):
    """{name: {"dtype", "shape"}} of a .safetensors file, from its JSON header."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return {name: {"dtype": entry["dtype"], "shape": entry["shape"]}
            for name, entry in header.items() if name != "__metadata__"}


def load(folder):
    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager",
                                                       output_loading_info=True)
    problems = {key: value for key, value in info.items() if value}
    if problems:
        sys.exit(f"{folder}: transformers reports {problems}")
    return model.eval()


def main():
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "finetune", "finetune"))
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        # One thread: the file is then the same byte for byte on every run.
        subprocess.run([binary, os.path.join(FIXTURE, "config.yaml"), "--set", f"output_dir={out}"], check=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
        folder = os.path.join(out, "model")
        model = load(folder)
        model.save_pretrained(os.path.join(tmp, "resaved"))
        expected = safetensors_header(os.path.join(tmp, "resaved", "model.safetensors"))
        saved = safetensors_header(os.path.join(folder, "model.safetensors"))
        if saved != expected:
            sys.exit(f"{folder}: model.safetensors holds {saved}, transformers writes {expected}")
        vocab = model.config.vocab_size
        input_ids = torch.tensor([[(37 * t + 5) % vocab for t in range(TOKENS)]], dtype=torch.int32)
        with torch.no_grad():
            logits = model(input_ids=input_ids.long()).logits[0].float()
            base_logits = load(BASE)(input_ids=input_ids.long()).logits[0].float()
    moved = ((logits - base_logits).abs().max() / logits.abs().max()).item()
    print(f"{len(saved)} tensors as transformers names them; training moved the logits by "
          f"max |trained - base| / max |trained| = {moved:.3e}")
    if moved < 1e-2:
        sys.exit("training barely moved the logits: the fixture could not tell a trained folder from the base")
    save_file({"input_ids": input_ids.contiguous(), "logits": logits.contiguous()},
              os.path.join(FIXTURE, "reference.safetensors"))
    with open(os.path.join(FIXTURE, "tensors.json"), "w") as f:
        f.write("{\n" + ",\n".join(f" {json.dumps(name)}: {json.dumps(expected[name])}" for name in sorted(expected))
                + "\n}\n")


if __name__ == "__main__":
    main()
