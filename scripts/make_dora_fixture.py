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
Needs torch, transformers, peft and safetensors (CPU is enough);
tests/test_dora.cpp reads the result.
"""
import copy
import os
import sys

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


def make_dora_model(base_dir, base_name, targets, seed):
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
    base.eval()
    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets, use_dora=True,
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


def main():
    for name, (base_folder, targets, seed) in CASES.items():
        make_case(name, base_folder, targets, seed)


if __name__ == "__main__":
    main()
