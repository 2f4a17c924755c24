#!/usr/bin/env python3
"""Writes tests/fixtures/t5_v1_0/ and tests/fixtures/t5_v1_1/ with transformers + peft (see tests/fixtures/README.md).

Needs torch, transformers, peft, safetensors and numpy. CI never runs this: the C++ tests read the committed outputs.

    python3 scripts/make_t5_fixtures.py

Each folder holds a tiny random T5ForConditionalGeneration (odd sizes: d_model 20, d_kv 6 with 3 heads, so
d_kv != d_model / heads; 3 encoder and 2 decoder layers; 10 relative-attention buckets with max distance 9, so
the logarithmic buckets and the cap are reached by 11 encoder tokens) in the hub's config.json form:
  t5_v1_0: feed_forward_proj "relu", tie_word_embeddings true (lm_head = shared, output scaled by d_model^-0.5);
  t5_v1_1: feed_forward_proj "gated-gelu", tie_word_embeddings false (its own lm_head), as FLAN-T5.
reference.safetensors: encoder input_ids [2, 11], labels [2, 7] (some -100), decoder_input_ids (transformers'
_shift_right of labels), logits, loss and the gradient of every parameter ("grad." + name), from the model as
T5ForConditionalGeneration.from_pretrained reads the folder, float32, cross-checked in float64; `generated`: each
input row's greedy generate() (max_new_tokens 9) before EOS (1), -1 after.
adapter/ and lora_reference.safetensors: PEFT LoRA (r 4, alpha 8, PEFT's default targets for t5, q and v, which
also match EncDecAttention), lora_B set to seeded noise; logits, loss, LoRA gradients, the adapters after one
torch.optim.AdamW step and the loss after it.
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import ADAMW, INIT_STD, check_float64, make_peft_model, save_adapter, saved_lora_name  # noqa: E402

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import T5Config, T5ForConditionalGeneration  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures")
VOCAB, ENC_SEQ, DEC_SEQ, BATCH = 97, 11, 7, 2
GEN_TOKENS = 9
LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0, task_type="SEQ_2_SEQ_LM", bias="none")  # targets: PEFT's default


def t5_config(gated):
    return dict(model_type="t5", architectures=["T5ForConditionalGeneration"], vocab_size=VOCAB, d_model=20, d_kv=6,
                d_ff=26 if gated else 28, num_layers=3, num_decoder_layers=2, num_heads=3,
                relative_attention_num_buckets=10, relative_attention_max_distance=9, dropout_rate=0.0,
                layer_norm_epsilon=1e-6, initializer_factor=1.0,
                feed_forward_proj="gated-gelu" if gated else "relu", tie_word_embeddings=not gated,
                is_encoder_decoder=True, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)


def build(out_dir, gated, seed):
    """Random weights saved with the hub's config.json (transformers 5 would write tie_word_embeddings true and
    scale_decoder_outputs instead), then read back by from_pretrained: the model users load from such a folder."""
    hub_config = t5_config(gated)
    kwargs = {k: v for k, v in hub_config.items() if k not in ("model_type", "architectures")}
    model = T5ForConditionalGeneration(T5Config(**kwargs)).to(torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if gated:  # untied: a head of its own, as FLAN-T5
            model.lm_head.weight = torch.nn.Parameter(torch.empty(VOCAB, 20))
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_(1.0 + INIT_STD * noise if name.endswith("layer_norm.weight") else 0.2 * noise)
    model.save_pretrained(out_dir, safe_serialization=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hub_config, f, indent=2, sort_keys=True)
        f.write("\n")
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(out_dir, extra)):
            os.remove(os.path.join(out_dir, extra))
    loaded = T5ForConditionalGeneration.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager")
    tied = loaded.lm_head.weight.data_ptr() == loaded.shared.weight.data_ptr()
    assert tied == (not gated) and loaded.config.scale_decoder_outputs == (not gated), (tied, loaded.config)
    return loaded.eval()


def make_inputs(model):
    gen = torch.Generator().manual_seed(4243)
    input_ids = torch.randint(2, VOCAB, (BATCH, ENC_SEQ), generator=gen, dtype=torch.int64)
    labels = torch.randint(2, VOCAB, (BATCH, DEC_SEQ), generator=gen, dtype=torch.int64)
    labels[0, -2:] = -100
    labels[1, 3] = -100
    decoder_input_ids = model._shift_right(labels)
    return input_ids, labels, decoder_input_ids


def forward_backward(model, input_ids, labels, names):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=input_ids, labels=labels)
    out.loss.backward()
    params = dict(model.named_parameters())
    grads = {saved_lora_name(n): params[n].grad.detach().clone() for n in names}
    return out.logits.detach().clone(), out.loss.detach().clone(), grads


def greedy(model, input_ids):
    """generate(do_sample=False) for each row alone: its new tokens before EOS (1), -1 after, [B, GEN_TOKENS]."""
    out = torch.full((input_ids.shape[0], GEN_TOKENS), -1, dtype=torch.int32)
    with torch.no_grad():
        for b in range(input_ids.shape[0]):
            tokens = model.generate(input_ids=input_ids[b:b + 1], max_new_tokens=GEN_TOKENS, do_sample=False,
                                    num_beams=1)[0, 1:]  # after the decoder start token
            tokens = tokens.tolist()
            tokens = tokens[:tokens.index(1)] if 1 in tokens else tokens
            out[b, :len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
    return out


def check_f64(tag, model, input_ids, labels, names, logits, loss, grads):
    check_float64(tag, model, lambda m: forward_backward(m, input_ids, labels, names), (logits, loss, grads))


def make(name, gated, seed):
    out_dir = os.path.join(OUT, name)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    model = build(out_dir, gated, seed)
    input_ids, labels, decoder_input_ids = make_inputs(model)
    names = [n for n, _ in model.named_parameters()]
    logits, loss, grads = forward_backward(model, input_ids, labels, names)
    check_f64(name, model, input_ids, labels, names, logits, loss, grads)
    inputs = {"input_ids": input_ids.to(torch.int32), "labels": labels.to(torch.int32),
              "decoder_input_ids": decoder_input_ids.to(torch.int32)}
    ref = dict(inputs, logits=logits, loss=loss.reshape(1))
    for n, g in grads.items():
        ref["grad." + n] = g
    ref["generated"] = greedy(model, input_ids)
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out_dir, "reference.safetensors"))

    peft_model, trainable = make_peft_model(model, LORA, name, seed + 100)
    save_adapter(peft_model, trainable, os.path.join(out_dir, "adapter"))
    lora_names = [n for n, _ in trainable]
    logits, loss, grads = forward_backward(peft_model, input_ids, labels, lora_names)
    check_f64(name + " lora", peft_model, input_ids, labels, lora_names, logits, loss, grads)
    optimizer = torch.optim.AdamW([p for _, p in trainable], foreach=False, fused=False, **ADAMW)
    optimizer.step()
    with torch.no_grad():
        loss_after = peft_model(input_ids=input_ids, labels=labels).loss.detach().clone()
    print(f"  {len(trainable)} LoRA tensors; loss after one AdamW step: {loss_after.item():.8f}")
    ref = dict(inputs, logits=logits, loss=loss.reshape(1), loss_after_step=loss_after.reshape(1))
    for n, g in grads.items():
        ref["grad." + n] = g
    for n, p in trainable:
        ref["after_step." + saved_lora_name(n)] = p.detach().clone()
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out_dir, "lora_reference.safetensors"))


def main():
    make("t5_v1_0", gated=False, seed=40)
    make("t5_v1_1", gated=True, seed=41)
    total = 0
    for name in ("t5_v1_0", "t5_v1_1"):
        for root, _, files in sorted(os.walk(os.path.join(OUT, name))):
            for f in sorted(files):
                size = os.path.getsize(os.path.join(root, f))
                total += size
                print(f"  {os.path.relpath(os.path.join(root, f), OUT):45s} {size:9d}")
    print(f"  total {total} bytes")
    assert total < 1024 * 1024


if __name__ == "__main__":
    main()
