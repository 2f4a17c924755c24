#!/usr/bin/env python3
"""Writes tests/fixtures/trl_tokenization.json: how trl's own trainers tokenize
prompt/completion rows, text rows and preference pairs.

    pip install trl datasets && python3 scripts/make_trl_tokenization_fixture.py

trl's SFTTrainer and DPOTrainer are built over the tiny BPE checkpoints
(tests/fixtures/qwen2_tiny: no bos; llama3_tiny: its tokenizer adds
<|begin_of_text|>) and their prepared train_dataset is read back: SFT's
input_ids and labels (-100 where no loss), DPO's prompt_ids, chosen_ids and
rejected_ids. The rows are chosen where a split tokenization would differ:
a prompt ending in a space (it merges into the completion's first token in
the joined text), completions already ending with the eos text (trl adds
none then), a pair whose two sides split the prompt differently; conversational rows and
pairs (trl's lists of messages, a pair's prompt left implicit too) rendered
with tests/fixtures/chat/<family>'s real template (chat_template). The
prompt/completion rows again with completion_only_loss=False, and rows of
messages with trl's default assistant_only_loss=False (every token trains),
carry the SFTConfig arguments they were prepared with (sft_args).
tests/test_data.cpp checks tokenize_example and tokenize_pairs against these.
"""
import json
import os
import tempfile
import warnings

import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "trl_tokenization.json")


def prompt_completion_rows(eos):
    return [{"prompt": "Summary: ", "completion": "Alice met Bob."},
            {"prompt": "Q: 2+2?\nA:", "completion": " 4" + eos},
            {"prompt": "Translate: chat ", "completion": " cat"},
            {"prompt": "", "completion": "no prompt at all"}]


def text_rows(eos):
    return [{"text": "Hello world, said Bob."}, {"text": "Ends with eos." + eos}]


def pair_rows(eos):
    return [{"prompt": "Summary: ", "chosen": "Alice met Bob.", "rejected": "Bob met Alice."},
            {"prompt": "Q: 2+2?\nA: ", "chosen": "4" + eos, "rejected": "five"}]


def implicit_pair_rows():  # trl's extract_prompt: the text both share, a space before the difference left out
    return [{"chosen": "Summary: Alice met Bob.", "rejected": "Summary: Bob met Alice."},
            {"chosen": "Caf\u00e9 au lait", "rejected": "Caf\u00e9 noir"},
            {"chosen": "Yes", "rejected": "Yes!"},
            {"chosen": "Mood: \U0001F600", "rejected": "Mood: \U0001F622"}]


def conversational_rows():
    return [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
             "completion": [{"role": "assistant", "content": "Hello!"}]},
            {"prompt": [{"role": "user", "content": "2+2?"}], "completion": [{"role": "assistant", "content": " 4"}]}]


def message_rows():
    return [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                          {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"},
                          {"role": "assistant", "content": " 4"}]}]


def conversational_pairs(implicit_prompt):
    question = [{"role": "user", "content": "Who met whom?"}]
    if implicit_prompt:  # trl extracts it: the messages both sides share
        return [{"chosen": question + [{"role": "assistant", "content": "Alice."}],
                 "rejected": question + [{"role": "assistant", "content": "Nobody."}]}]
    return [{"prompt": question, "chosen": [{"role": "assistant", "content": "Alice met Bob."}],
             "rejected": [{"role": "assistant", "content": "Bob met Alice."}]}]


def prepared(trainer_class, config_class, model, tokenizer, rows, folder, **args):
    config = config_class(output_dir=folder, report_to="none", bf16=False, use_cpu=True, **args)
    trainer = trainer_class(model=model, args=config, train_dataset=Dataset.from_list(rows),
                            processing_class=tokenizer)
    return list(trainer.train_dataset)


def main():
    warnings.filterwarnings("ignore")
    cases = []
    for name, family in [("qwen2_tiny", "qwen2"), ("llama3_tiny", "llama3")]:
        folder = os.path.join(ROOT, "tests", "fixtures", name)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        with open(os.path.join(ROOT, "tests", "fixtures", "chat", family, "tokenizer_config.json")) as f:
            tokenizer.chat_template = json.load(f)["chat_template"]
        model = AutoModelForCausalLM.from_pretrained(folder)
        eos = tokenizer.eos_token
        with tempfile.TemporaryDirectory() as scratch:
            sft_runs = [(prompt_completion_rows(eos), {}), (text_rows(eos), {}), (conversational_rows(), {}),
                        (prompt_completion_rows(eos), {"completion_only_loss": False}),
                        (conversational_rows(), {"completion_only_loss": False}),
                        (message_rows(), {"assistant_only_loss": False})]
            for rows, args in sft_runs:
                for row, out in zip(rows, prepared(SFTTrainer, SFTConfig, model, tokenizer, rows, scratch, **args)):
                    cases.append({"checkpoint": name, "chat_template": family, "trainer": "SFTTrainer", "row": row,
                                  "sft_args": args, "input_ids": out["input_ids"],
                                  "loss_mask": [int(label != -100) for label in out["labels"]]})
            for rows in [pair_rows(eos), implicit_pair_rows(), conversational_pairs(False), conversational_pairs(True)]:
                for row, out in zip(rows, prepared(DPOTrainer, DPOConfig, model, tokenizer, rows, scratch)):
                    cases.append({"checkpoint": name, "chat_template": family, "trainer": "DPOTrainer", "row": row,
                                  "prompt_ids": out["prompt_ids"], "chosen_ids": out["chosen_ids"],
                                  "rejected_ids": out["rejected_ids"]})
        print(name, "eos", eos, tokenizer.eos_token_id, "bos", tokenizer.bos_token_id)
    with open(OUT, "w") as f:
        json.dump({"trl": trl.__version__, "cases": cases}, f, ensure_ascii=False)
        f.write("\n")
    print(len(cases), "cases ->", OUT)


if __name__ == "__main__":
    main()
