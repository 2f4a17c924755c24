#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizers/classes/cases.json: what transformers 5 makes of a folder
whose tokenizer_config.json names a tokenizer class that rebuilds its stages.

    pip install transformers && python3 scripts/make_tokenizer_class_fixture.py

transformers 5 keeps only the vocabulary, merges and post-processor of such a folder's
tokenizer.json and rebuilds the other stages from the class: LlamaTokenizer (no normalizer;
Metaspace with prepend_scheme "first", "always" when legacy, "never" without
add_prefix_space), GPT2Tokenizer, GPTNeoXTokenizer and Qwen2Tokenizer (ByteLevel with the
config's add_prefix_space). Each variant's tokenizer_config.json sits beside a fixture's
tokenizer.json (written by make_tokenizer_fixtures.py) in a scratch folder read by
AutoTokenizer; the fixture's texts (special tokens inside text, leading spaces, newlines)
(the first 60) plus Llama-2 chat turns give encode(text, add_special_tokens=False) ("ids"), encode(text)
("ids_with_special") and decode(ids, skip_special_tokens=True) ("decoded").
tests/test_tokenizer_json.cpp checks them.
"""
import json
import os
import shutil
import tempfile

import transformers
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
LLAMA = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}
BYTE_LEVEL = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
# (the fixture's tokenizer.json, tokenizer_config.json)
VARIANTS = [
    ("llama2", dict(LLAMA, tokenizer_class="LlamaTokenizer", legacy=False)),
    ("llama2", dict(LLAMA, tokenizer_class="LlamaTokenizerFast", legacy=True)),
    ("llama2", dict(LLAMA, tokenizer_class="LlamaTokenizer", legacy=False, add_prefix_space=False)),
    ("llama2", dict(LLAMA, tokenizer_class="LlamaTokenizerFast")),
    ("gpt_neox", dict(BYTE_LEVEL, tokenizer_class="GPTNeoXTokenizer", add_prefix_space=True)),
    ("gpt_neox", dict(BYTE_LEVEL, tokenizer_class="GPTNeoXTokenizerFast")),
    ("gpt_neox", dict(BYTE_LEVEL, tokenizer_class="GPT2Tokenizer", add_prefix_space=True)),
    ("qwen2", dict(BYTE_LEVEL, tokenizer_class="Qwen2Tokenizer", add_prefix_space=True)),
    ("qwen2", dict(BYTE_LEVEL, tokenizer_class="Qwen2TokenizerFast", add_prefix_space=False)),
]
CHAT = ["<s>[INST] Hi there [/INST] Hello</s><s>[INST] more [/INST]", "a</s>b", "  two leading spaces", " \n ",
        "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nWhat is 2+2? [/INST] 4 </s>"]


def main():
    variants = []
    for fixture, config in VARIANTS:
        with open(os.path.join(FIXTURES, fixture, "cases.json"), encoding="utf-8") as f:
            texts = CHAT + [c["text"] for c in json.load(f)["cases"]][:60]
        with tempfile.TemporaryDirectory() as folder:
            shutil.copy(os.path.join(FIXTURES, fixture, "tokenizer.json"), os.path.join(folder, "tokenizer.json"))
            with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump(config, f)
            tokenizer = AutoTokenizer.from_pretrained(folder)
            cases = []
            for text in texts:
                ids = tokenizer.encode(text, add_special_tokens=False)
                cases.append({"text": text, "ids": ids, "ids_with_special": tokenizer.encode(text),
                              "decoded": tokenizer.decode(ids, skip_special_tokens=True)})
        variants.append({"tokenizer_json": fixture, "tokenizer_config": config, "class": type(tokenizer).__name__,
                         "cases": cases})
        print(f"{fixture} {config['tokenizer_class']} -> {type(tokenizer).__name__}: {len(cases)} cases")
    out = os.path.join(FIXTURES, "classes")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"transformers_version": transformers.__version__, "variants": variants}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
