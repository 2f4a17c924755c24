#!/usr/bin/env python3
"""Writes tests/fixtures/chat/: chat conversations rendered by transformers' apply_chat_template.

    pip install transformers tokenizers jinja2 && python3 scripts/make_chat_fixture.py

For each family (ChatML, Qwen2's ChatML with a default system message, Llama-2, Llama-3,
Zephyr) a folder holds a tokenizer_config.json with the family's real chat_template string
(as its checkpoints ship it) and its bos/eos tokens, and cases.json: for a few multi-turn
conversations (with and without a system message) the text apply_chat_template renders
(Jinja), the ids AutoTokenizer gives for it (tokenized as apply_chat_template does, without
adding special tokens) and the assistant mask. The tokenizer is a fixture of
tests/fixtures/tokenizers/ with the family's special tokens (Zephyr uses the Llama-2 one,
as zephyr-7b does Mistral's). "unknown" holds Mistral's template, which the trainer does not
render. alpaca.json holds Alpaca rows with the prompt Stanford Alpaca's train.py formats for
them. tests/test_chat_data.cpp checks our rendering, ids and mask against these.

The mask: a token carries loss when its first character (tokenizers' offsets) lies in an
assistant turn's trained span: its content and the end marker the template puts after it
(ChatML <|im_end|>, Llama-3 <|eot_id|>, Zephyr eos; Llama-2 ' ' + content + ' ' + eos).
Spans are found in the full rendering after the rendering of the messages before the turn.
"""
import json
import os
import shutil
import tempfile

from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "chat")

# The chat_template strings as the checkpoints' tokenizer_config.json files hold them.
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Qwen/Qwen2-*-Instruct.
QWEN2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
         "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
         "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# meta-llama/Llama-2-7b-chat-hf.
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
          "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{% if loop.index0 == 0 and system_message != false %}"
          "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
          "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
          "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
          "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
# meta-llama/Meta-Llama-3-8B-Instruct.
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
          "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] "
          "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
# HuggingFaceH4/zephyr-7b-beta.
ZEPHYR = ("{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
          "{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n"
          "{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n"
          "{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
          "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}")
# mistralai/Mistral-7B-Instruct-v0.1: no bos per turn, no system block; not rendered by the trainer.
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}"
           "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

# stanford_alpaca's train.py PROMPT_DICT; the output follows the prompt directly.
ALPACA_PROMPTS = {
    "prompt_input": (
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:"
    ),
    "prompt_no_input": (
        "Below is an instruction that describes a task. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Response:"
    ),
}
ALPACA_ROWS = [
    {"instruction": "Give three tips for staying healthy.", "output": "Eat well, sleep, move."},
    {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
    {"instruction": "Name a colour.", "input": "", "output": "Blue"},
]

# name: (template, tokenizer fixture, bos, eos, what precedes the trained content, end marker)
FAMILIES = {
    "chatml": (CHATML, "qwen2", None, "<|im_end|>", "", "<|im_end|>"),
    "qwen2": (QWEN2, "qwen2", None, "<|im_end|>", "", "<|im_end|>"),
    "llama2": (LLAMA2, "llama2", "<s>", "</s>", " ", " </s>"),
    "llama3": (LLAMA3, "llama3", "<|begin_of_text|>", "<|eot_id|>", "", "<|eot_id|>"),
    "zephyr": (ZEPHYR, "llama2", "<s>", "</s>", "", "</s>"),
}
STRIPPED = {"llama2", "llama3"}  # templates that strip (Jinja trim) each content

CONVERSATIONS = [
    [{"role": "user", "content": "Summarize: Alice met Bob at the station."},
     {"role": "assistant", "content": "Alice and Bob met."}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "What is 12 + 30?"},
     {"role": "assistant", "content": "42"},
     {"role": "user", "content": "And doubled?"},
     {"role": "assistant", "content": "It is 84, twice 42."}],
    [{"role": "user", "content": "  Write two lines about tea.\n"},
     {"role": "assistant", "content": " Green tea, hot.\nA quiet café. "},
     {"role": "user", "content": "Now one word."},
     {"role": "assistant", "content": "Steam"},
     {"role": "user", "content": "Thanks!"},
     {"role": "assistant", "content": "You're welcome."}],
    [{"role": "system", "content": "Answer in French.\nBe brief."},
     {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "Bonjour !"}],
]


def write_config(folder, template, bos, eos):
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template, "eos_token": eos}
    if bos is not None:
        config["bos_token"] = bos
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1, ensure_ascii=False)
        f.write("\n")


def trained_spans(tokenizer, messages, text, name):
    """[start, end) character spans of each assistant turn's trained text in `text`."""
    _, _, _, _, lead, end_marker = FAMILIES[name]
    spans = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:k], tokenize=False) if k else ""
        assert text.startswith(before)
        content = message["content"].strip() if name in STRIPPED else message["content"]
        start = text.index(lead + content + end_marker, len(before))
        spans.append((start, start + len(lead + content + end_marker)))
    return spans


def case(tokenizer, messages, name):
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    # apply_chat_template(tokenize=True) gives the same ids: checked, not assumed.
    direct = tokenizer.apply_chat_template(messages, tokenize=True)
    direct = direct["input_ids"] if isinstance(direct, dict) or hasattr(direct, "keys") else direct
    assert list(direct) == encoding["input_ids"], name
    spans = trained_spans(tokenizer, messages, text, name)
    mask = [int(any(s <= start < e for s, e in spans)) for start, _ in encoding["offset_mapping"]]
    return {"messages": messages, "text": text, "ids": encoding["input_ids"], "mask": mask}


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    for name, (template, tokenizer_name, bos, eos, _, _) in FAMILIES.items():
        folder = os.path.join(OUT, name)
        write_config(folder, template, bos, eos)
        with tempfile.TemporaryDirectory() as scratch:
            shutil.copy(os.path.join(ROOT, "tests", "fixtures", "tokenizers", tokenizer_name, "tokenizer.json"), scratch)
            shutil.copy(os.path.join(folder, "tokenizer_config.json"), scratch)
            tokenizer = AutoTokenizer.from_pretrained(scratch)
            cases = [case(tokenizer, messages, name) for messages in CONVERSATIONS]
        with open(os.path.join(folder, "cases.json"), "w") as f:
            json.dump({"tokenizer": "tokenizers/" + tokenizer_name, "cases": cases}, f, ensure_ascii=False)
            f.write("\n")
        print(name, [len(c["ids"]) for c in cases], "tokens,", [sum(c["mask"]) for c in cases], "trained")
    write_config(os.path.join(OUT, "unknown"), MISTRAL, "<s>", "</s>")
    alpaca = [{"row": row, "prompt": ALPACA_PROMPTS["prompt_input" if row.get("input", "") != "" else
                                                     "prompt_no_input"].format_map(row)} for row in ALPACA_ROWS]
    with open(os.path.join(OUT, "alpaca.json"), "w") as f:
        json.dump(alpaca, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
