#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizers/llama_class/cases.json: what transformers 5 makes of a
Llama-2 / Mistral folder whose tokenizer_config.json names the LlamaTokenizer class.

    pip install transformers && python3 scripts/make_llama_class_fixture.py

transformers 5 keeps only the vocabulary, merges and post-processor of such a folder's
tokenizer.json and rebuilds the other stages from the class (no normalizer; Metaspace with
prepend_scheme "first", "always" when legacy, "never" without add_prefix_space). Each
variant's tokenizer_config.json sits beside the Llama-2 fixture's tokenizer.json (written
by make_tokenizer_fixtures.py) in a scratch folder read by AutoTokenizer; the fixture's
texts (special tokens inside text, leading spaces, newlines) plus Llama-2 chat turns give
encode(text, add_special_tokens=False) ("ids"), encode(text) ("ids_with_special") and
decode(ids, skip_special_tokens=True) ("decoded"). tests/test_tokenizer_json.cpp checks them.
"""
import json
import os
import shutil
import tempfile

import transformers
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
            "add_eos_token": False}
VARIANTS = [
    {"tokenizer_class": "LlamaTokenizer", "legacy": False},
    {"tokenizer_class": "LlamaTokenizerFast", "legacy": True},
    {"tokenizer_class": "LlamaTokenizer", "legacy": False, "add_prefix_space": False},
    {"tokenizer_class": "LlamaTokenizerFast"},
]
CHAT = ["<s>[INST] Hi there [/INST] Hello</s><s>[INST] more [/INST]", "a</s>b", "  two leading spaces", " \n ",
        "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nWhat is 2+2? [/INST] 4 </s>"]


def main():
    source = os.path.join(FIXTURES, "llama2", "tokenizer.json")
    with open(os.path.join(FIXTURES, "llama2", "cases.json"), encoding="utf-8") as f:
        texts = CHAT + [c["text"] for c in json.load(f)["cases"]][:100]
    variants = []
    for variant in VARIANTS:
        config = dict(SPECIALS, **variant)
        with tempfile.TemporaryDirectory() as folder:
            shutil.copy(source, os.path.join(folder, "tokenizer.json"))
            with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump(config, f)
            tokenizer = AutoTokenizer.from_pretrained(folder)
            cases = []
            for text in texts:
                ids = tokenizer.encode(text, add_special_tokens=False)
                cases.append({"text": text, "ids": ids, "ids_with_special": tokenizer.encode(text),
                              "decoded": tokenizer.decode(ids, skip_special_tokens=True)})
        variants.append({"tokenizer_config": config, "cases": cases})
        print(f"{variant}: {len(cases)} cases")
    out = os.path.join(FIXTURES, "llama_class")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"transformers_version": transformers.__version__, "variants": variants}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
