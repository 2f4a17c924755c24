#!/usr/bin/env python3
"""DPO parity fixture: tests/fixtures/dpo/reference.safetensors.

The policy is tests/fixtures/llama_gqa with PEFT's adapter from
tests/fixtures/llama_lora/adapter (nonzero lora_B, so policy and reference
differ); the reference is the same PeftModel under disable_adapter(), as trl
does for a PEFT model without a ref_model. trl's DPOTrainer itself is not run
(it wants a tokenizer, datasets and its fused LM head): its loss is
re-implemented here from trl 1.16.0's DPOTrainer._compute_loss
(trl/trainer/dpo_trainer.py), f_divergence reverse_kl, no ld_alpha, no WPO
weighting:
  logps = sum over completion tokens of log p(token)   (labels -100 elsewhere)
  chosen_scores = logps_chosen - ref_logps_chosen, rejected likewise
  sigmoid: -logsigmoid(beta * (chosen_scores - rejected_scores))
  ipo:     (chosen_scores / n_chosen - rejected_scores / n_rejected - 1 / (2 beta))^2,
           n = completion tokens of the row (clamped to >= 1)
  loss = mean over pairs; rewards = beta * scores; accuracy = chosen > rejected.
The batch is trl's layout: the chosen rows, then the rejected rows, right padded.
Writes, per loss type, the loss, trl's metrics and every LoRA gradient.
"""
import os

import torch
import torch.nn.functional as F
from peft import PeftModel
from safetensors.torch import save_file
from transformers import LlamaForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
BOS, EOS, PAD = 1, 2, 3
PAIRS = [  # (prompt length, chosen length, rejected length), completions before eos
    (4, 5, 3),
    (6, 2, 6),
    (3, 4, 4),
]
BETA = {"sigmoid": 0.1, "ipo": 0.1}


def make_batch(vocab, pairs=PAIRS, seed=777):
    """trl's pair layout: the chosen rows, then the rejected rows, right padded; and the completion mask."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(4, vocab, (n,), generator=gen).tolist()
    rows, masks = [], []
    chosen, rejected = [], []
    for prompt_len, chosen_len, rejected_len in pairs:
        prompt = [BOS] + rand(prompt_len)
        for length, out in ((chosen_len, chosen), (rejected_len, rejected)):
            completion = rand(length) + [EOS]
            out.append((prompt + completion, [0] * len(prompt) + [1] * len(completion)))
    for ids, mask in chosen + rejected:
        rows.append(ids)
        masks.append(mask)
    T = max(len(r) for r in rows)
    input_ids = torch.tensor([r + [PAD] * (T - len(r)) for r in rows])
    completion_mask = torch.tensor([m + [0] * (T - len(m)) for m in masks])
    return input_ids, completion_mask


def sequence_logps(model, input_ids, labels):
    logits = model(input_ids=input_ids).logits[:, :-1]
    targets = labels[:, 1:]
    mask = targets != -100
    token_logps = torch.gather(logits.log_softmax(-1), 2, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (token_logps * mask).sum(dim=1)


def dpo_loss(model, input_ids, completion_mask, loss_type, beta):
    labels = input_ids.masked_fill(completion_mask == 0, -100)
    logps = sequence_logps(model, input_ids, labels)
    with torch.no_grad(), model.disable_adapter():
        ref_logps = sequence_logps(model, input_ids, labels)
    chosen_logps, rejected_logps = logps.chunk(2)
    ref_chosen, ref_rejected = ref_logps.chunk(2)
    chosen_scores, rejected_scores = chosen_logps - ref_chosen, rejected_logps - ref_rejected
    if loss_type == "sigmoid":
        per_pair = -F.logsigmoid(beta * (chosen_scores - rejected_scores))
    else:
        chosen_mask, rejected_mask = completion_mask.chunk(2)
        delta = chosen_scores / chosen_mask.sum(1).clamp(min=1.0) - rejected_scores / rejected_mask.sum(1).clamp(min=1.0)
        per_pair = (delta - 1 / (2 * beta)) ** 2
    chosen_rewards, rejected_rewards = beta * chosen_scores.detach(), beta * rejected_scores.detach()
    metrics = {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean(),
        "logps/chosen": chosen_logps.detach().mean(),
        "logps/rejected": rejected_logps.detach().mean(),
    }
    return per_pair.mean(), metrics, labels


def load(dtype):
    base = LlamaForCausalLM.from_pretrained(os.path.join(ROOT, "llama_gqa"), dtype=dtype)
    model = PeftModel.from_pretrained(base, os.path.join(ROOT, "llama_lora", "adapter"), is_trainable=True)
    model.eval()  # lora_dropout is 0; eval only turns off dropout modules that do nothing here
    return model.to(dtype)


def run(model, input_ids, completion_mask, loss_type):
    model.zero_grad(set_to_none=True)
    loss, metrics, labels = dpo_loss(model, input_ids, completion_mask, loss_type, BETA[loss_type])
    loss.backward()
    grads = {n.replace(".default", ""): p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), metrics, grads, labels


def main():
    model, model64 = load(torch.float32), load(torch.float64)
    input_ids, completion_mask = make_batch(model.config.vocab_size)
    out = {"input_ids": input_ids.to(torch.int32).contiguous()}
    for loss_type in ("sigmoid", "ipo"):
        loss, metrics, grads, labels = run(model, input_ids, completion_mask, loss_type)
        loss64, _, grads64, _ = run(model64, input_ids, completion_mask, loss_type)
        worst = max(((grads[k].double() - grads64[k]).abs().max() / grads64[k].abs().max()).item() for k in grads)
        print(f"{loss_type}: loss f32 {loss.item():.8f} f64 {loss64.item():.8f}; worst gradient f32 vs f64 {worst:.2e};",
              {k: round(v.item(), 6) for k, v in metrics.items()})
        out["labels"] = labels.to(torch.int32).contiguous()
        out[f"{loss_type}.beta"] = torch.tensor([BETA[loss_type]], dtype=torch.float32)
        out[f"{loss_type}.loss"] = loss.reshape(1).float()
        for name, value in metrics.items():
            out[f"{loss_type}.{name}"] = value.reshape(1).float()
        for name, grad in grads.items():
            out[f"{loss_type}.grad.{name}"] = grad.float().contiguous()
    os.makedirs(os.path.join(ROOT, "dpo"), exist_ok=True)
    save_file(out, os.path.join(ROOT, "dpo", "reference.safetensors"))


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
