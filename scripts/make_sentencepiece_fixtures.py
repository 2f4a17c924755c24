#!/usr/bin/env python3
"""Writes tests/fixtures/sentencepiece/: small SentencePiece models with the parts of the
format the tests/fixtures/tokenizer model lacks, and Python sentencepiece's encodings of them.

    pip install sentencepiece && python3 scripts/make_sentencepiece_fixtures.py

- bpe_rules/tokenizer.model: BPE, 64 pieces, a custom normalization rule table (a precompiled
  character map of 256 trie units instead of nmt_nfkc's 44,800: full-width letters, a ligature,
  a circled digit, U+3000 and a decomposed accent rewritten) and a user-defined piece.
- unigram_bytes/tokenizer.model: unigram, byte fallback (256 <0xXX> pieces), the same rule table
  and a denormalization rule table (a denormalizer_spec with its own character map).
Both are small, so they also seed the tokenizer.model fuzzer (tests/fuzz/make_corpus.py).
encode_reference.json: {model: [{"text", "ids", "decoded"}]}, plain encode (no bos/eos) and
decode. tests/test_tokenizer.cpp checks SentencePieceTokenizer against it; the C++ loader's
model check (tokenizer/sentencepiece_model_check.cpp) must accept both files.
Seeded and single-threaded: two runs give byte-identical files.
"""
import io
import json
import os
import random
import tempfile

import sentencepiece as spm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "sentencepiece")

# normalization_rule_tsv: source code points <TAB> replacement code points (hex).
RULES = ["FF21\t41", "FF22\t42", "FF23\t43", "FB01\t66 69", "2460\t31", "3000\t20", "65 301\tE9", "C5\t41 30A"]
DENORMALIZATION_RULES = ["E9\t65 301", "2581 2581\t20 2581"]

WORDS = ("the quick brown fox jumps over a lazy dog while Alice and Bob talk about coffee, apples, "
         "three letters and day 12 of the project; café naïve résumé fine office").split()

TEXTS = [
    "the quick brown fox",
    "  Alice   and Bob  ",
    "ＡＢＣ ﬁne ① day\u3000two",
    "cafe\u0301 and café",
    "Ångström <tool> call",
    "emoji 🙂 and 中文 and ü",
    "tabs\tand\nnewlines",
    "",
]


def corpus():
    rng = random.Random(1234)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(4, 12))) for _ in range(300)]
    return lines + ["<tool> ＡＢＣ ﬁ ① Ångström"] * 3


def train(folder, **options):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_writer=model, character_coverage=1.0, num_threads=1,
        shuffle_input_sentence=False, minloglevel=2, user_defined_symbols=["<tool>"],
        normalization_rule_tsv="rules.tsv", **options)
    os.makedirs(os.path.join(OUT, folder), exist_ok=True)
    path = os.path.join(OUT, folder, "tokenizer.model")
    with open(path, "wb") as f:
        f.write(model.getvalue())
    sp = spm.SentencePieceProcessor(model_file=path)
    cases = [{"text": text, "ids": sp.encode(text), "decoded": sp.decode(sp.encode(text))} for text in TEXTS]
    print(f"{folder}: {sp.get_piece_size()} pieces, {len(model.getvalue())} bytes, "
          f"e.g. {sp.encode(TEXTS[2], out_type=str)}")
    return cases


def main():
    with tempfile.TemporaryDirectory() as rules_dir:
        os.chdir(rules_dir)  # the model records the rule files' names as given: relative, so runs agree
        for name, rules in (("rules.tsv", RULES), ("denormalization_rules.tsv", DENORMALIZATION_RULES)):
            with open(name, "w") as f:
                f.write("\n".join(rules) + "\n")
        reference = {
            "bpe_rules": train("bpe_rules", model_type="bpe", vocab_size=64, hard_vocab_limit=False),
            "unigram_bytes": train("unigram_bytes", model_type="unigram", vocab_size=300,
                                   byte_fallback=True,
                                   denormalization_rule_tsv="denormalization_rules.tsv"),
        }
    with open(os.path.join(OUT, "encode_reference.json"), "w", encoding="utf-8") as f:
        json.dump(reference, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
