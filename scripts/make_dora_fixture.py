#!/usr/bin/env python3
"""DoRA fixtures: tests/fixtures/dora/{llama,neox}/ with PEFT's use_dora=True.

For each base (tests/fixtures/llama_gqa: no biases, every linear adapted;
tests/fixtures/gpt_neox_parallel: biased linears, so PEFT's bias handling
(the magnitude scales x W^T, not the bias) is exercised), in float32:
  - init_magnitude.<module>: the lora_magnitude_vector PEFT initialises, the
    row norms ||W||_2 of the base weight (B is zero at init);
  - adapter/: a PEFT adapter folder whose lora_B is seeded noise and whose
    magnitude is the initial one times (1 + 0.1 noise), so every tensor gets
    a gradient and the magnitude differs from the weight norm;
  - reference.safetensors: input_ids, labels, logits, loss, the gradient of
    every adapter tensor (grad.<saved name>), the tensors after one AdamW step
    (after_step.<saved name>) and the loss after it, and the weights of
    merge_and_unload() (merged.<base tensor name>) for the adapted linears.
The float32 values are checked against float64 runs of the same model.
And dora/llama_dropout/: PEFT's DoRA with lora_dropout 0.1 in train mode,
its dropout masks replaced by the trainer's (the counter hash of
kernels/dropout_hash.h, seed 0), so that PEFT's dropout branch (the base
run again over the dropped input) is compared on the same masks: loss and
every gradient.
Needs torch, transformers, peft, safetensors and numpy (CPU is enough);
tests/test_dora.cpp reads the result.
"""
import copy
import os
import sys

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import ADAMW, INIT_STD, compare, make_inputs, save_pretrained_fixture  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
CASES = {
    "llama": ("llama_gqa", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 40),
    "neox": ("gpt_neox_parallel", ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"], 41),
}


def saved_name(param_name):
    """PEFT's saved key: the adapter name dropped, the magnitude without .weight."""
    name = param_name.replace(".default.", ".")
    return name[: -len(".weight")] if name.endswith("lora_magnitude_vector.weight") else name


def forward_backward(model, input_ids, labels):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=input_ids, labels=labels)
    out.loss.backward()
    grads = {saved_name(n): p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return out.logits.detach().clone(), out.loss.detach().clone(), grads


def make_dora_model(base_dir, base_name, targets, seed, dropout=0.0):
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
    base.eval()
    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=targets, use_dora=True,
                        task_type="CAUSAL_LM", bias="none")
    model = get_peft_model(base, config)
    model.peft_config["default"].base_model_name_or_path = base_name
    init = {}
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_magnitude_vector" in n:
                module = n.split(".lora_magnitude_vector")[0].replace("base_model.model.", "", 1)
                weight = base.get_submodule(module).base_layer.weight
                assert torch.allclose(p, weight.norm(dim=1), rtol=1e-6), n  # PEFT's init: the row norms
                init[module] = p.detach().clone()
                p.mul_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "lora_B" in n:
                p.copy_(INIT_STD * torch.randn(p.shape, generator=gen))
    model.eval()  # no dropout (and lora_dropout is 0): the forward is deterministic
    return model, init


def adamw_step(model):
    trainable = [p for _, p in model.named_parameters() if p.requires_grad]
    torch.optim.AdamW(trainable, foreach=False, fused=False, **ADAMW).step()
    return {saved_name(n): p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def make_case(name, base_folder, targets, seed):
    out_dir = os.path.join(FIXTURES, "dora", name)
    os.makedirs(out_dir, exist_ok=True)
    model, init = make_dora_model(os.path.join(FIXTURES, base_folder), base_folder, targets, seed)
    adapter_dir = os.path.join(out_dir, "adapter")
    save_pretrained_fixture(model, adapter_dir)
    saved = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))

    input_ids, labels = make_inputs(model.config.vocab_size)
    logits, loss, grads = forward_backward(model, input_ids, labels)
    assert set(saved) == set(grads), (sorted(saved), sorted(grads))
    logits64, loss64, grads64 = forward_backward(copy.deepcopy(model).to(torch.float64), input_ids, labels)
    print(f"dora/{name}: loss f32 {loss.item():.8f}  f64 {loss64.item():.8f}  ({len(grads)} adapter tensors)")
    worst = compare("logits+loss", {"logits": logits, "loss": loss}, {"logits": logits64, "loss": loss64})
    worst = max(worst, compare("grads", grads, grads64))
    assert worst < 1e-4, worst

    merged = copy.deepcopy(model).merge_and_unload()
    merged_weights = {f"merged.{m}.weight": merged.get_submodule(m).weight.detach().clone() for m in init}
    after = adamw_step(model)
    with torch.no_grad():
        loss_after = model(input_ids=input_ids, labels=labels).loss.detach().clone()
    print(f"  loss after one AdamW step: {loss_after.item():.8f}")

    ref = {"input_ids": input_ids.to(torch.int32), "labels": labels.to(torch.int32), "logits": logits,
           "loss": loss.reshape(1), "loss_after_step": loss_after.reshape(1), **merged_weights}
    ref.update({f"init_magnitude.{m}": v for m, v in init.items()})
    ref.update({f"grad.{k}": g for k, g in grads.items()})
    ref.update({f"after_step.{k}": p for k, p in after.items()})
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out_dir, "reference.safetensors"))


def our_dropout_mask(shape, p):
    """The trainer's LoRA dropout mask for an input of `shape` under dropout seed 0 (kernels/dropout_hash.h):
    element i survives when the top 24 bits of splitmix64 output i, times 2^-24, are >= p (in float32)."""
    with np.errstate(over="ignore"):
        z = np.uint64(0) + (np.arange(int(np.prod(shape)), dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    uniform = (z >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)
    return torch.from_numpy(uniform >= np.float32(p)).reshape(shape)


class OurDropout(torch.nn.Module):
    """nn.Dropout(p) with the trainer's mask in place of torch's draw."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        return x * our_dropout_mask(x.shape, self.p).to(x.dtype) / (1 - self.p)


def make_dropout_case(seed=42, p=0.1):
    """dora/llama_dropout/: PEFT's DoRA in train mode with lora_dropout p, every mask replaced by ours, so its
    branch F.linear(dropout(x), W) + lora_B(lora_A(dropout(x))) runs over the same dropped input as ours."""
    out_dir = os.path.join(FIXTURES, "dora", "llama_dropout")
    os.makedirs(out_dir, exist_ok=True)
    model, _ = make_dora_model(os.path.join(FIXTURES, "llama_gqa"), "llama_gqa", ["q_proj", "v_proj", "down_proj"],
                               seed, dropout=p)
    save_pretrained_fixture(model, os.path.join(out_dir, "adapter"))
    for module in model.modules():
        if hasattr(module, "lora_dropout") and "default" in module.lora_dropout:
            module.lora_dropout["default"] = OurDropout(p)
    model.train()  # PEFT's DoRA takes its dropout branch in train mode only
    input_ids, labels = make_inputs(model.config.vocab_size)
    _, loss, grads = forward_backward(model, input_ids, labels)
    _, loss64, grads64 = forward_backward(copy.deepcopy(model).to(torch.float64), input_ids, labels)
    print(f"dora/llama_dropout: loss f32 {loss.item():.8f}  f64 {loss64.item():.8f}  ({len(grads)} adapter tensors)")
    worst = compare("loss+grads", {"loss": loss, **grads}, {"loss": loss64, **grads64})
    assert worst < 1e-4, worst
    ref = {"input_ids": input_ids.to(torch.int32), "labels": labels.to(torch.int32), "loss": loss.reshape(1)}
    ref.update({f"grad.{k}": g for k, g in grads.items()})
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out_dir, "reference.safetensors"))


def main():
    for name, (base_folder, targets, seed) in CASES.items():
        make_case(name, base_folder, targets, seed)
    make_dropout_case()


if __name__ == "__main__":
    main()
