#!/usr/bin/env python3
"""NEFTune fixture: tests/fixtures/neftune/hook.json.

Runs transformers' own NEFTune (transformers.integrations.neftune:
activate_neftune, which registers neftune_post_forward_hook on
get_input_embeddings(), as Trainer.train does) on the tiny checkpoints and
records, by wrapping torch.Tensor.uniform_, the bounds the hook draws its
noise between and the shape of the embedding output it noised:
  - tests/fixtures/llama_gqa (hidden 64) in train mode, for several alphas and
    padded lengths: uniform_(-m, m) with m = alpha / sqrt(L * d), L the
    input_ids' length;
  - the same model in eval mode: no draw;
  - tests/fixtures/t5_v1_1 in train mode: no draw, because T5's encoder and
    decoder embed through their own embed_tokens modules (tied to `shared` by
    weight only), so the hook on `shared` never runs.
The C++ side (tests/test_neftune.cpp) checks neftune_noise_magnitude against
these bounds and refuses NEFTune for T5.
"""
import json
import os

import torch
import transformers
from transformers import AutoModelForCausalLM, T5ForConditionalGeneration
from transformers.integrations.neftune import activate_neftune

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
CASES = [(5.0, 1, 7), (5.0, 3, 12), (10.0, 2, 31), (15.0, 1, 64), (0.1, 4, 9)]  # alpha, rows, L


class Draws:
    """Every uniform_ call while active: its bounds, as floats, and the tensor's shape."""

    def __init__(self):
        self.calls = []
        self.original = torch.Tensor.uniform_

    def __enter__(self):
        original, calls = self.original, self.calls

        def recording(tensor, low=0.0, high=1.0, **kwargs):
            calls.append({"low": float(low), "high": float(high), "shape": list(tensor.shape)})
            return original(tensor, low, high, **kwargs)

        torch.Tensor.uniform_ = recording
        return self

    def __exit__(self, *exc):
        torch.Tensor.uniform_ = self.original


def llama_draws(model, alpha, rows, length, train):
    model.neftune_handle = activate_neftune(model, alpha)
    model.train(train)
    ids = torch.randint(4, model.config.vocab_size, (rows, length), generator=torch.Generator().manual_seed(length))
    with Draws() as draws, torch.no_grad():
        model(input_ids=ids)
    model.neftune_handle.remove()
    return draws.calls


def main():
    llama = AutoModelForCausalLM.from_pretrained(os.path.join(ROOT, "llama_gqa"), dtype=torch.float32)
    hidden = llama.config.hidden_size
    train = []
    for alpha, rows, length in CASES:
        calls = llama_draws(llama, alpha, rows, length, True)
        assert len(calls) == 1 and calls[0]["low"] == -calls[0]["high"], calls
        assert calls[0]["shape"] == [rows, length, hidden], calls
        train.append({"alpha": alpha, "rows": rows, "length": length, "hidden_size": hidden,
                      "magnitude": calls[0]["high"]})
    eval_calls = llama_draws(llama, 5.0, 2, 7, False)

    t5 = T5ForConditionalGeneration.from_pretrained(os.path.join(ROOT, "t5_v1_1"), dtype=torch.float32)
    handle = activate_neftune(t5, 5.0)
    t5.train()
    with Draws() as draws, torch.no_grad():
        t5(input_ids=torch.tensor([[5, 6, 7, 8]]), labels=torch.tensor([[9, 10, 11]]))
    handle.remove()

    out = {
        "transformers": transformers.__version__,
        "hook": "transformers/integrations/neftune.py neftune_post_forward_hook",
        "llama_train": train,
        "llama_eval_draws": len(eval_calls),
        "t5_train_draws": len(draws.calls),
    }
    os.makedirs(os.path.join(ROOT, "neftune"), exist_ok=True)
    with open(os.path.join(ROOT, "neftune", "hook.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
