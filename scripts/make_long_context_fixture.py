#!/usr/bin/env python3
"""Writes tests/fixtures/long_context/: transformers + PEFT at 32,768 tokens, for three rope scalings.

Needs what scripts/make_fixtures.py needs (its helpers are imported); CPU only, a few minutes; CI never runs it.

    python3 scripts/make_long_context_fixture.py

Each of llama3/, linear/ and dynamic/ holds a tiny Llama (hidden 32, 4 heads over 2 KV heads, 2 layers, vocab
96; make_fixtures' seeded weights) whose rope is scaled the way released long-context checkpoints scale it:
llama3 (Llama-3.1's bands, original 4,096 positions, max 65,536), linear (factor 8, max 65,536) and dynamic NTK
(factor 4, max 8,192, so T = 32,768 runs four times past it and the base grows). LoRA r=4 on q_proj/v_proj
(make_fixtures' make_peft_model: lora_B seeded noise) in adapter/. One row of T = 32,768 random tokens, every
next token a label. transformers runs it with SDPA (O(T) memory); reference.safetensors holds input_ids i32
[1, T], loss [1], logits_rows f32 [R, 96] at the positions in logit_positions i32 [R] (every 2,048th, and the
last), and grad.<lora tensor> for every LoRA tensor. A float64 run of the same model checks the float32 numbers.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

SEQ = 32768
OUT = os.path.join(mf.ROOT, "tests", "fixtures", "long_context")
ROPES = {
    "llama3": ({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 4096}, 65536),
    "linear": ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 8.0}, 65536),
    "dynamic": ({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}, 8192),
}


def config_of(rope, max_positions):
    common = dict(mf.FAMILY_COMMON, attn_implementation="sdpa")
    return LlamaConfig(hidden_size=32, intermediate_size=40, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=max_positions, tie_word_embeddings=False, rope_parameters=rope,
                       **common)


def main():
    torch.set_num_threads(os.cpu_count() or 1)
    for index, (name, (rope, max_positions)) in enumerate(ROPES.items()):
        out_dir = os.path.join(OUT, name)
        os.makedirs(out_dir, exist_ok=True)
        model = mf.build_model(config_of(rope, max_positions), 900 + index)
        model.save_pretrained(out_dir, safe_serialization=True)
        base = LlamaForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="sdpa")
        peft_model, trainable = mf.make_peft_model(base, dict(mf.LORA), name, 950 + index)
        mf.save_adapter(peft_model, trainable, os.path.join(out_dir, "adapter"))
        gen = torch.Generator().manual_seed(4343 + index)
        input_ids = torch.randint(4, mf.FAMILY_VOCAB, (1, SEQ), generator=gen, dtype=torch.int64)
        logits, loss, grads = mf.lora_forward_backward(peft_model, input_ids, input_ids)
        model64 = peft_model.to(torch.float64)
        logits64, loss64, grads64 = mf.lora_forward_backward(model64, input_ids, input_ids)
        positions = torch.tensor(list(range(0, SEQ, 2048)) + [SEQ - 1], dtype=torch.int64)
        rows, rows64 = logits[0, positions], logits64[0, positions]
        worst = mf.compare(name, {"logits_rows": rows, "loss": loss}, {"logits_rows": rows64, "loss": loss64})
        worst = max(worst, mf.compare(name + " grads", grads, grads64))
        assert worst < 1e-3, worst
        ref = {"input_ids": input_ids.to(torch.int32), "loss": loss.reshape(1), "logits_rows": rows,
               "logit_positions": positions.to(torch.int32)}
        for k, g in grads.items():
            ref["grad." + k] = g
        save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out_dir, "reference.safetensors"))
        print(f"{name}: loss {loss.item():.6f} (f64 {loss64.item():.6f}), {len(grads)} LoRA gradients; written")


if __name__ == "__main__":
    main()
