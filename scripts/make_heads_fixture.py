#!/usr/bin/env python3
"""Output-head parity fixture: tests/fixtures/heads/reference.safetensors.

Needs torch, transformers, peft and safetensors (CPU is enough); CI never runs it.

    python3 scripts/make_heads_fixture.py

One forward of tests/fixtures/llama_gqa with PEFT's adapter
tests/fixtures/llama_lora/adapter gives every token's log-probability of its
target and, through a value head on the final (normed) hidden states -- trl's
ValueHead, v_head.summary = Linear(hidden, 1), drawn here -- every token's
value. The loss sum(g_logp * logp) + sum(g_value * value) over the target
tokens, with fixed random weights g, is what online RL's losses are to the
model once their derivatives in the log-probabilities and values are known
(trl's formulas are checked apart, tests/test_rl_math.cpp): its gradients in
every LoRA tensor and in the value head test that one backward carries both
heads' gradients through the model. Rows are right padded; targets -100 on
the prompt and the padding.

tests/fixtures/heads/seq2seq_reference.safetensors: the same on a seq2seq
policy as trl's AutoModelForSeq2SeqLMWithValueHead reads it --
tests/fixtures/t5_v1_1 with its PEFT adapter (LoRA on q and v of both
stacks): the encoder on right-padded prompts (attention_mask), the decoder
from decoder_start_token_id over each response, the value head on the
decoder's last hidden states (decoder_hidden_states[-1], after the final
norm); the gradients reach the encoder's adapters through cross-attention.
"""
import os

import torch
from peft import PeftModel
from safetensors.torch import save_file
from transformers import LlamaForCausalLM, T5ForConditionalGeneration

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
PAD = 3
ROWS = [(5, 6), (3, 9), (7, 2)]  # (prompt, response) lengths
T5_ROWS = [(6, 4), (9, 5), (3, 2)]  # (encoder, decoder) lengths


def trainable_grads(model):
    return {"grad." + name.replace(".default", "").replace("base_model.model.", "", 1): p.grad.float()
            for name, p in model.named_parameters() if p.requires_grad}


def main():
    gen = torch.Generator().manual_seed(99)
    base = LlamaForCausalLM.from_pretrained(os.path.join(ROOT, "llama_gqa"), dtype=torch.float64)
    model = PeftModel.from_pretrained(base, os.path.join(ROOT, "llama_lora", "adapter"), is_trainable=True).eval()
    model = model.to(torch.float64)
    C = base.config.hidden_size
    v_weight = (torch.randn(1, C, generator=gen, dtype=torch.float64) * 0.3).requires_grad_(True)
    v_bias = torch.tensor([0.25], dtype=torch.float64, requires_grad=True)
    T = max(p + r for p, r in ROWS)
    ids = torch.full((len(ROWS), T), PAD)
    targets = torch.full((len(ROWS), T), -100)
    for b, (p, r) in enumerate(ROWS):
        seq = torch.randint(4, base.config.vocab_size, (p + r,), generator=gen)
        ids[b, : p + r] = seq
        targets[b, p - 1 : p + r - 1] = seq[p:]  # targets[t] = seq[t + 1] on the response
    hidden = model.base_model.model.model(input_ids=ids).last_hidden_state
    logits = model.base_model.model.lm_head(hidden)
    mask = (targets != -100).to(torch.float64)
    logps = torch.gather(logits.log_softmax(-1), 2, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
    values = (hidden @ v_weight.T).squeeze(-1) + v_bias
    g_logp = torch.randn(ids.shape, generator=gen, dtype=torch.float64) * mask
    g_value = torch.randn(ids.shape, generator=gen, dtype=torch.float64) * mask
    ((g_logp * logps).sum() + (g_value * values).sum()).backward()
    out = {"input_ids": ids.to(torch.int32), "targets": targets.to(torch.int32),
           "g_logp": g_logp.float(), "g_value": g_value.float(),
           "logps": logps.detach().float(), "values": values.detach().float(),
           "v_head.summary.weight": v_weight.detach().float(), "v_head.summary.bias": v_bias.detach().float(),
           "grad.v_head.summary.weight": v_weight.grad.float(), "grad.v_head.summary.bias": v_bias.grad.float()}
    out.update(trainable_grads(model))
    os.makedirs(os.path.join(ROOT, "heads"), exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(ROOT, "heads", "reference.safetensors"))
    print("written; grads:", sorted(k for k in out if k.startswith("grad."))[:2], "...")



def seq2seq():
    gen = torch.Generator().manual_seed(101)
    base = T5ForConditionalGeneration.from_pretrained(os.path.join(ROOT, "t5_v1_1"), dtype=torch.float64)
    model = PeftModel.from_pretrained(base, os.path.join(ROOT, "t5_v1_1", "adapter"), is_trainable=True).eval()
    model = model.to(torch.float64)
    C, V, start = base.config.d_model, base.config.vocab_size, base.config.decoder_start_token_id
    v_weight = (torch.randn(1, C, generator=gen, dtype=torch.float64) * 0.3).requires_grad_(True)
    v_bias = torch.tensor([-0.5], dtype=torch.float64, requires_grad=True)
    S, T = max(e for e, _ in T5_ROWS), max(d for _, d in T5_ROWS)
    enc = torch.zeros((len(T5_ROWS), S), dtype=torch.long)
    mask = torch.zeros((len(T5_ROWS), S), dtype=torch.long)
    dec = torch.zeros((len(T5_ROWS), T), dtype=torch.long)
    targets = torch.full((len(T5_ROWS), T), -100)
    for b, (e, d) in enumerate(T5_ROWS):
        enc[b, :e] = torch.randint(2, V, (e,), generator=gen)
        mask[b, :e] = 1
        response = torch.randint(2, V, (d,), generator=gen)
        dec[b, 0] = start
        dec[b, 1:d] = response[:-1]
        targets[b, :d] = response
    outputs = model(input_ids=enc, attention_mask=mask, decoder_input_ids=dec, output_hidden_states=True)
    hidden = outputs.decoder_hidden_states[-1]
    counted = (targets != -100).to(torch.float64)
    logps = torch.gather(outputs.logits.log_softmax(-1), 2, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * counted
    values = (hidden @ v_weight.T).squeeze(-1) + v_bias
    g_logp = torch.randn(dec.shape, generator=gen, dtype=torch.float64) * counted
    g_value = torch.randn(dec.shape, generator=gen, dtype=torch.float64) * counted
    ((g_logp * logps).sum() + (g_value * values).sum()).backward()
    out = {"encoder_ids": enc.to(torch.int32), "encoder_lengths": mask.sum(1).to(torch.int32),
           "decoder_ids": dec.to(torch.int32), "targets": targets.to(torch.int32),
           "g_logp": g_logp.float(), "g_value": g_value.float(),
           "logps": logps.detach().float(), "values": values.detach().float(),
           "v_head.summary.weight": v_weight.detach().float(), "v_head.summary.bias": v_bias.detach().float(),
           "grad.v_head.summary.weight": v_weight.grad.float(), "grad.v_head.summary.bias": v_bias.grad.float()}
    out.update(trainable_grads(model))
    path = os.path.join(ROOT, "heads", "seq2seq_reference.safetensors")
    save_file({k: v.contiguous() for k, v in out.items()}, path)
    print("written", path, "; grads:", len([k for k in out if k.startswith("grad.")]))


if __name__ == "__main__":
    main()
    seq2seq()
