#!/usr/bin/env python3
"""Reward-model parity fixture: tests/fixtures/reward/.

Needs torch, transformers, peft and safetensors (CPU is enough); CI never runs it.

    python3 scripts/make_reward_fixture.py

The reward model is tests/fixtures/llama_gqa as transformers'
LlamaForSequenceClassification (num_labels 1, pad_token_id 3) with a score
head drawn here (normal, std 0.5, seeded), saved with save_pretrained to
reward/model/ (no lm_head, as a sequence classifier has none), and PEFT's
adapter tests/fixtures/llama_lora/adapter on top (nonzero lora_B). The score
is read where transformers reads it: the last token that is not
pad_token_id. trl's RewardTrainer is not run (it wants datasets and a
tokenizer); its loss is re-implemented from trl 1.16.0's
RewardTrainer.compute_loss (trl/trainer/reward_trainer.py):
  rewards_chosen, rewards_rejected = the scores of the chosen and rejected rows
  loss = -logsigmoid(rewards_chosen - rewards_rejected).mean()
  accuracy = (rewards_chosen > rewards_rejected).mean(), margin = (chosen - rejected).mean()
The batch is trl's layout: the chosen rows, then the rejected rows, right
padded; one pair is tied in length so padding is not what tells them apart.
Writes reward/reference.safetensors: input_ids, labels (completion tokens;
-100 elsewhere), scores [2P], loss, accuracy, margin, and the gradients of
every LoRA tensor and of score.weight (PEFT's modules_to_save role).
"""
import os

import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel
from safetensors.torch import save_file
from transformers import LlamaForSequenceClassification

import make_dpo_fixture  # its trl pair layout

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
PAD = 3
PAIRS = [(4, 5, 3), (6, 2, 6), (3, 4, 4), (2, 7, 1)]  # (prompt, chosen, rejected) lengths before eos


def make_batch(vocab):
    input_ids, mask = make_dpo_fixture.make_batch(vocab, PAIRS, 4242)
    return input_ids, input_ids.masked_fill(mask == 0, -100)


def load(dtype, model_dir):
    base = LlamaForSequenceClassification.from_pretrained(model_dir, dtype=dtype)
    adapter = os.path.join(ROOT, "llama_lora", "adapter")
    config = LoraConfig.from_pretrained(adapter)
    config.task_type = None  # the adapter was saved for CAUSAL_LM; PeftModel applies it to any base
    model = PeftModel.from_pretrained(base, adapter, config=config, is_trainable=True)
    model.base_model.model.score.weight.requires_grad_(True)  # trains beside the adapters (modules_to_save)
    return model.eval().to(dtype)


def run(model, input_ids):
    model.zero_grad(set_to_none=True)
    scores = model(input_ids=input_ids).logits.squeeze(-1)
    chosen, rejected = scores.chunk(2)
    loss = -F.logsigmoid(chosen - rejected).mean()
    loss.backward()
    grads = {n.replace(".default", ""): p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    metrics = {"accuracy": (chosen > rejected).float().mean(), "margin": (chosen - rejected).mean()}
    return scores.detach(), loss.detach(), metrics, grads


def main():
    out_dir = os.path.join(ROOT, "reward")
    model_dir = os.path.join(out_dir, "model")
    torch.manual_seed(0)
    classifier = LlamaForSequenceClassification.from_pretrained(os.path.join(ROOT, "llama_gqa"), num_labels=1,
                                                                pad_token_id=PAD, dtype=torch.float32)
    with torch.no_grad():
        classifier.score.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(5))
    classifier.save_pretrained(model_dir)
    model, model64 = load(torch.float32, model_dir), load(torch.float64, model_dir)
    input_ids, labels = make_batch(model.config.vocab_size)
    scores, loss, metrics, grads = run(model, input_ids)
    scores64, loss64, _, grads64 = run(model64, input_ids)
    worst = max(((grads[k].double() - grads64[k]).abs().max() / grads64[k].abs().max()).item() for k in grads)
    print(f"loss f32 {loss.item():.8f} f64 {loss64.item():.8f}; worst gradient f32 vs f64 {worst:.2e}; "
          f"scores {[round(s, 4) for s in scores.tolist()]}", {k: round(v.item(), 6) for k, v in metrics.items()})
    out = {"input_ids": input_ids.to(torch.int32).contiguous(), "labels": labels.to(torch.int32).contiguous(),
           "scores": scores.float().contiguous(), "loss": loss.reshape(1).float()}
    for name, value in metrics.items():
        out[name] = value.reshape(1).float()
    for name, grad in grads.items():
        out["grad." + name.replace("base_model.model.", "", 1)] = grad.float().contiguous()
    save_file(out, os.path.join(out_dir, "reference.safetensors"))
    print("written", out_dir, sorted(k for k in out if k.startswith("grad."))[:3], "...")


if __name__ == "__main__":
    main()
