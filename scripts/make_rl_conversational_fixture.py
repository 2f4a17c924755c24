#!/usr/bin/env python3
"""Writes tests/fixtures/rl/conversational.json: how trl's GRPOTrainer tokenizes
conversational prompts ({"prompt": [messages]}) for generation, and what its
reward model is given for a conversational prompt and a completion.

    pip install trl datasets && python3 scripts/make_rl_conversational_fixture.py

A GRPOTrainer is built over the tiny BPE checkpoints (tests/fixtures/qwen2_tiny:
no bos; llama3_tiny: its tokenizer adds <|begin_of_text|> unless told not to)
with tests/fixtures/chat/<family>'s real chat template, and trl's own methods
are called on it:
- `_tokenize_prompts(prompts)`: the prompt ids generation starts from
  (`apply_chat_template(prompts, add_generation_prompt=True, tokenize=True)`,
  which adds no special tokens of its own). The script also records
  `maybe_apply_chat_template`'s prompt text: for a prompt ending with an
  assistant message it continues that message (continue_final_message), which
  GRPOTrainer's generation does not; for the others the script checks it
  tokenizes to the same ids.
- `_calculate_rewards(...)` with a reward model (the same checkpoint as a
  *ForSequenceClassification, its tokenizer and template the reward processing
  class): the input_ids its forward receives (captured by a forward
  pre-hook, right padding removed), i.e. the reward tokenizer's chat template
  over prompt + [{"role": "assistant", "content": completion}], tokenized with
  add_special_tokens=False.
tests/test_rl.cpp checks load_prompt_rows and the reward model's inputs against these.
"""
import json
import os
import tempfile
import warnings

import torch
import transformers
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer
from trl.data_utils import maybe_apply_chat_template

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(FIXTURES, "rl", "conversational.json")

# (checkpoint, chat template family): a template that writes bos itself (llama3)
# and one that writes a default system message when the prompt has none (qwen2_5).
CHECKPOINTS = [("qwen2_tiny", "qwen2_5"), ("llama3_tiny", "llama3")]

PROMPTS = [
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "What colour is the sky?"}],
    [{"role": "user", "content": "Summarise: Alice met Bob at the café."}],
    [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "One, two,"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": " Tell me a joke.\n"}],
]
COMPLETIONS = ["Blue.", "Alice and Bob met.", " three!", "Why did the chicken cross the road?"]


def tokenizer_with_template(checkpoint, family):
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(FIXTURES, checkpoint))
    with open(os.path.join(FIXTURES, "chat", family, "tokenizer_config.json")) as f:
        tokenizer.chat_template = json.load(f)["chat_template"]
    return tokenizer


def grpo_trainer(checkpoint, tokenizer, reward_model, reward_tokenizer, folder):
    model = AutoModelForCausalLM.from_pretrained(os.path.join(FIXTURES, checkpoint))
    config = GRPOConfig(output_dir=folder, report_to="none", bf16=False, use_cpu=True, num_generations=2,
                        per_device_train_batch_size=2, max_completion_length=8)
    rows = Dataset.from_list([{"prompt": p} for p in PROMPTS])
    return GRPOTrainer(model=model, reward_funcs=[reward_model], args=config, train_dataset=rows,
                       processing_class=tokenizer, reward_processing_classes=[reward_tokenizer])


def reward_inputs(trainer, reward_model):
    """The ids the reward model's forward receives for each prompt and its completion."""
    seen = []

    def hook(module, args, kwargs):
        for ids, mask in zip(kwargs["input_ids"].tolist(), kwargs["attention_mask"].tolist()):
            seen.append([i for i, m in zip(ids, mask) if m])  # right padding removed

    handle = reward_model.register_forward_pre_hook(hook, with_kwargs=True)
    inputs = [{"prompt": p} for p in PROMPTS]
    completions = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    trainer._calculate_rewards(inputs, PROMPTS, completions, [[0]] * len(PROMPTS))
    handle.remove()
    return seen


def main():
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    cases, rewards = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for checkpoint, family in CHECKPOINTS:  # each the policy and, with its own template, the reward model
            tokenizer = tokenizer_with_template(checkpoint, family)
            reward_model = AutoModelForSequenceClassification.from_pretrained(os.path.join(FIXTURES, checkpoint),
                                                                              num_labels=1)
            reward_tokenizer = tokenizer_with_template(checkpoint, family)
            trainer = grpo_trainer(checkpoint, tokenizer, reward_model, reward_tokenizer, scratch)
            prompt_ids, _, _ = trainer._tokenize_prompts(PROMPTS)
            for prompt, ids in zip(PROMPTS, prompt_ids):
                text = maybe_apply_chat_template({"prompt": prompt}, tokenizer)["prompt"]
                if prompt[-1]["role"] != "assistant":
                    assert tokenizer(text, add_special_tokens=False)["input_ids"] == list(ids)
                cases.append({"checkpoint": checkpoint, "chat_template": family, "prompt": prompt,
                              "prompt_ids": list(ids), "maybe_apply_chat_template_prompt": text})
            for prompt, completion, ids in zip(PROMPTS, COMPLETIONS, reward_inputs(trainer, reward_model)):
                rewards.append({"reward_checkpoint": checkpoint, "reward_chat_template": family, "prompt": prompt,
                                "completion": completion, "reward_ids": ids})
    with open(OUT, "w") as f:
        json.dump({"trl": trl.__version__, "transformers": transformers.__version__, "prompts": cases,
                   "rewards": rewards}, f, ensure_ascii=False)
        f.write("\n")
    print(len(cases), "prompt cases,", len(rewards), "reward cases ->", OUT)


if __name__ == "__main__":
    main()
