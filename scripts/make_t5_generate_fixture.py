#!/usr/bin/env python3
"""Writes tests/fixtures/t5_generate/ with transformers + peft: what `finetune generate` must print for a T5.

Needs torch, transformers, peft, safetensors and sentencepiece. CI never runs this: the C++ test
(test_finetune_cli, "finetune generate on a T5") reads the committed outputs.

    python3 scripts/make_t5_generate_fixture.py

The model is the embedded tiny T5 (configs/tiny-t5, gated-gelu as FLAN-T5, trained by this trainer) with the tiny
SentencePiece tokenizer (configs/tiny-base/tokenizer.model). adapter/: PEFT LoRA (r 4, alpha 8, q and v, task
SEQ_2_SEQ_LM), lora_A from PEFT's seeded init, lora_B seeded noise of std 0.3, so that it changes what the model
says. reference.json: for the first three prompts of configs/data/summarize_eval.jsonl, the text of
T5ForConditionalGeneration.generate() (greedy, max_new_tokens 16, the encoder input encode(prompt) + [eos] as the
trainer feeds it) without the adapter, with it, and with it under repetition_penalty 1.3; each with the new token
ids (before EOS) and the smallest gap between the two largest logits over its steps (a gap near 0 would make the
comparison a coin toss between float32 implementations; the script requires 1e-3).
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import save_adapter  # noqa: E402

import sentencepiece  # noqa: E402
import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import T5ForConditionalGeneration  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "configs", "tiny-t5")
TOKENIZER = os.path.join(ROOT, "configs", "tiny-base", "tokenizer.model")
PROMPTS = os.path.join(ROOT, "configs", "data", "summarize_eval.jsonl")
OUT = os.path.join(ROOT, "tests", "fixtures", "t5_generate")
NEW_TOKENS, PENALTY, MIN_GAP = 16, 1.3, 1e-3
LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q", "v"], task_type="SEQ_2_SEQ_LM", bias="none")


def greedy(model, input_ids, eos_id, **options):
    """generate()'s new tokens before EOS and the smallest top-2 logit gap over the steps taken."""
    out = model.generate(input_ids=input_ids, max_new_tokens=NEW_TOKENS, do_sample=False, num_beams=1,
                         output_logits=True, return_dict_in_generate=True, **options)
    tokens = out.sequences[0, 1:].tolist()  # after decoder_start_token_id
    gap = min(float(step[0].topk(2).values[0] - step[0].topk(2).values[1]) for step in out.logits)
    if eos_id in tokens:
        tokens = tokens[:tokens.index(eos_id)]
    return tokens, gap


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    sp = sentencepiece.SentencePieceProcessor(model_file=TOKENIZER)
    with open(PROMPTS) as f:
        prompts = [json.loads(line)["prompt"] for line in f][:3]
    base = T5ForConditionalGeneration.from_pretrained(MODEL, dtype=torch.float32).eval()
    eos_id = base.config.eos_token_id
    assert sp.eos_id() == eos_id, (sp.eos_id(), eos_id)
    inputs = [torch.tensor([sp.encode(p) + [eos_id]]) for p in prompts]
    runs = {"base": [greedy(base, ids, eos_id) for ids in inputs]}

    torch.manual_seed(1)  # lora_A: PEFT's kaiming_uniform_ draws from the global generator
    model = get_peft_model(base, LoraConfig(**LORA))
    model.peft_config["default"].base_model_name_or_path = "configs/tiny-t5"
    noise = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=noise, dtype=torch.float32))
    model.eval()
    runs["adapter"] = [greedy(model, ids, eos_id) for ids in inputs]
    runs["adapter_repetition_penalty"] = [greedy(model, ids, eos_id, repetition_penalty=PENALTY) for ids in inputs]
    assert runs["adapter"] != runs["base"], "the adapter changes no output: make its noise larger"
    assert runs["adapter_repetition_penalty"] != runs["adapter"], "the penalty changes no output"

    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    save_adapter(model, trainable, os.path.join(OUT, "adapter"))
    reference = {"prompts": prompts, "max_new_tokens": NEW_TOKENS, "repetition_penalty": PENALTY}
    for run, rows in runs.items():
        reference[run] = [{"text": sp.decode(tokens), "tokens": tokens, "smallest_top2_gap": round(gap, 6)}
                          for tokens, gap in rows]
        for tokens, gap in rows:
            assert gap >= MIN_GAP, (run, tokens, gap)
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for run in runs:
        print(run, [row["text"] for row in reference[run]])


if __name__ == "__main__":
    main()
