#!/usr/bin/env python3
"""Writes tests/fixtures/llama_bf16/: transformers' own bf16 mixed precision on the llama_gqa fixture with PEFT
LoRA on every linear module, beside the float32 numbers of the same model and batch.

    python3 scripts/make_bf16_fixture.py     # needs torch, transformers, peft (CPU), and tests/fixtures/llama_gqa

- adapter/: the PEFT adapter (r 4, alpha 8, q/k/v/o/gate/up/down_proj, lora_A from PEFT's seeded init, lora_B
  seeded noise so lora_A gets gradients), written by scripts/make_fixtures.py's save_adapter.
- reference.safetensors: input_ids and labels (make_fixtures.make_inputs), then for "f32." (float32 weights and
  activations) and "bf16." (the same float32 model under torch.autocast("cpu", dtype=torch.bfloat16): linears and
  matmuls run in bf16, softmax and RMSNorm upcast to float32 as transformers' Llama does) each of logits, loss
  (transformers' shifted mean cross-entropy) and grad.<PEFT key> for every adapter tensor. The backward runs
  outside the autocast region, as PyTorch recommends (its ops take the dtypes the forward chose).
tests/test_bf16_activations.cpp compares our bf16 activations path with both: its error against f32 must be of
the size of transformers' own bf16 error. Seeded and single-threaded: two runs give byte-identical files.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (seeded torch settings and the fixtures' helpers)
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

OUT = os.path.join(mf.DEFAULT_OUT, "llama_bf16")
LORA = dict(mf.LORA, target_modules=mf.ALL_LLAMA_LINEARS)
SEED = 11


def run(model, input_ids, labels, autocast):
    """Logits and loss of one forward (under bf16 autocast if asked), adapter gradients of its backward."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=input_ids, labels=labels)
    out.loss.backward()
    grads = {mf.saved_lora_name(n): p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return {"logits": out.logits.detach().float().clone(), "loss": out.loss.detach().float().reshape(1)}, grads


def relative(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    base = LlamaForCausalLM.from_pretrained(os.path.join(mf.DEFAULT_OUT, "llama_gqa"), dtype=torch.float32,
                                            attn_implementation="eager")
    model, trainable = mf.make_peft_model(base, LORA, "llama_gqa", SEED)
    mf.save_adapter(model, trainable, os.path.join(OUT, "adapter"))
    input_ids, labels = mf.make_inputs()

    f32, f32_grads = run(model, input_ids, labels, autocast=False)
    bf16, bf16_grads = run(model, input_ids, labels, autocast=True)
    f64, f64_grads = run(mf.copy.deepcopy(model).to(torch.float64), input_ids, labels, autocast=False)
    # float32 is the reference the test measures bf16 against: it must be far closer to float64 than bf16 is.
    worst_f32 = max(mf.compare("f32 logits+loss", f32, f64), mf.compare("f32 grads", f32_grads, f64_grads))
    assert worst_f32 < 1e-4, worst_f32
    print(f"bf16 autocast vs f32: loss {relative(bf16['loss'], f32['loss']):.2e}, "
          f"logits {relative(bf16['logits'], f32['logits']):.2e}, worst adapter gradient "
          f"{max(relative(bf16_grads[k], f32_grads[k]) for k in f32_grads):.2e} over {len(f32_grads)} tensors")

    ref = {"input_ids": input_ids.to(torch.int32), "labels": labels.to(torch.int32)}
    for prefix, values, grads in (("f32.", f32, f32_grads), ("bf16.", bf16, bf16_grads)):
        ref.update({prefix + k: v for k, v in values.items()})
        ref.update({prefix + "grad." + k: g.float() for k, g in grads.items()})
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(OUT, "reference.safetensors"))


if __name__ == "__main__":
    main()
