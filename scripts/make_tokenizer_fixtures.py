#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizers/: tokenizer.json files run by the `tokenizers` library.

    pip install tokenizers && python3 scripts/make_tokenizer_fixtures.py

Each fixture is a small tokenizer built here with the pipeline of a model family (Llama-3,
Qwen2, Llama-2 / Mistral converted from SentencePiece, GPT-NeoX, SmolLM / StarCoder) or with
pipeline elements the families do not cover (NFKC, Lowercase, Strip, Whitespace, Punctuation,
every Split behaviour, Metaspace schemes, RobertaProcessing, the Strip and Replace decoders).
Its BPE vocabulary is trained with tokenizers' BpeTrainer on generated text, so files stay
small. For a few hundred generated strings per fixture (code, whitespace runs, CJK, emoji,
combining marks, unusual Unicode, special tokens inside text, digit runs) cases.json stores
encode(text, add_special_tokens=False) ("ids"), encode(text) ("ids_with_special") and
decode(ids, skip_special_tokens=True) ("decoded"). tests/test_tokenizer_json.cpp checks them.
"""
import json
import os
import random

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizers")

# Split patterns of the real tokenizer.json files.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = ("the quick brown fox jumps over lazy dog model training token tokenizer loss gradient adapter "
         "weight matrix hello world don't it's we're they've I'm you'll she'd DON'T IT'S We'LL café naïve "
         "résumé Zürich straße façade coöperate élève").split()
CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "if __name__ == '__main__':\n    main()\n",
    "const auto it = std::find(v.begin(), v.end(), 42);",
    "SELECT id, name FROM users WHERE age >= 18;",
    "x = {'a': 1, \"b\": [2, 3]}\r\n",
    "<div class=\"row\">&nbsp;</div>",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
]
UNICODE = [
    "中文分词测试", "日本語のテキスト", "한국어 문장입니다", "Ελληνικά ΣΟΦΟΣ σοφός", "Русский текст",
    "العربية نص", "עברית", "हिन्दी पाठ", "ภาษาไทย", "🙂😀🎉", "👩‍💻 👨‍👩‍👧 👍🏽", "🇫🇷🇯🇵",
    "e\u0301 a\u0308 o\u0302\u0323 \u1e9b\u0323", "Å Å Ω Ω", "\u00a0nbsp\u2003em\u3000ideo",
    "zero\u200bwidth\u200djoiner", "line\u2028sep\u2029para\u0085nel", "ﬁ ﬂ ﬀ ㎏ ㍿ ½ ² ⁴ Ⅻ",
    "ＦＵＬＬ ｗｉｄｔｈ １２３", "𝐁𝐨𝐥𝐝 𝔉𝔯𝔞𝔨 𝟙𝟚𝟛", "K Kelvin ſ long s İstanbul ı", "ǅ ǈ ǋ ǲ ẞ",
    "٣٤٥ ۱۲۳ ४५६ ๑๒๓", "\ufeffbom", "\U0001f600\U0001f4a9\U00010348", "x\u0301\u0302\u0303\u0304y",
    "\u1100\u1161\u11a8 \uac00\u11a8", "ᄀ각 각", "Ǆemo ǅ", "tab\there\x0bvt\x0cff",
    "mongolian\u180e\u180evs fs\x1c\x1dgs", "a \x85\x85b \u2028\u2028c \u1680\u1680d \u2000\u200a\u202f\u205fe",
]
DIGITS = ["1234567890", "3.14159", "2024-01-31", "1,000,000", "0x1F", "v2.0.1", "99 bottles", "12345678901234"]
SPACES = ["   ", "\n\n", "\t\t", " \n ", "\r\n", "    \n    ", "  \t  ", "\n", " "]


def random_text(rng, specials):
    parts = []
    for _ in range(rng.randint(1, 8)):
        kind = rng.random()
        if kind < 0.35:
            parts.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5))))
        elif kind < 0.45:
            parts.append(rng.choice(CODE))
        elif kind < 0.65:
            parts.append(rng.choice(UNICODE))
        elif kind < 0.75:
            parts.append(rng.choice(DIGITS))
        elif kind < 0.88:
            parts.append(rng.choice(SPACES))
        elif kind < 0.94 and specials:
            parts.append(rng.choice(specials))
        else:
            parts.append("".join(chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x2fff),
                                                  rng.randint(0x3000, 0x9fff), rng.randint(0x1f300, 0x1faff)]))
                                 for _ in range(rng.randint(1, 6))))
        if rng.random() < 0.5:
            parts.append(rng.choice([" ", "", "\n", "  "]))
    return "".join(parts)


def test_strings(specials, count, seed):
    rng = random.Random(seed)
    fixed = ["", " ", "Hello world", " Hello world", "Hello  world  ", "I'm here. It'S THEY'LL we've",
             "a\n\nb\n \n c", "   leading and trailing   ", "\t\tindented\n\t\tcode\n", "1234567 89 0",
             "café naïve e\u0301", "中文 and English", "emoji 🙂 end", "ﬁnal ² ½ ＡＢＣ", "ΣΟΦΟΣ İI"]
    fixed += [s + "text" + s for s in specials] + ["x" + "".join(specials) + "y"]
    return fixed + [random_text(rng, specials) for _ in range(count - len(fixed))]


def corpus(seed):
    rng = random.Random(seed)
    return [random_text(rng, []) for _ in range(3000)]


def train(tokenizer, vocab_size, special_tokens, byte_level=False, small_alphabet=False):
    """Trains on the generated corpus; small_alphabet keeps only Latin characters in it, so that
    other characters take the unk / byte_fallback paths (BpeTrainer's limit_alphabet would do
    it too, but breaks ties between equally frequent characters differently from run to run)."""
    kwargs = {"vocab_size": vocab_size, "special_tokens": special_tokens, "show_progress": False}
    if byte_level:
        kwargs["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    lines = corpus(1)
    if small_alphabet:
        lines = ["".join(c for c in line if ord(c) < 0x180) for line in lines]
    tokenizer.train_from_iterator(lines, BpeTrainer(**kwargs))
    return tokenizer


def with_model_options(tokenizer, **options):
    """The tokenizer with model fields set in its JSON (options the trainer does not keep)."""
    config = json.loads(tokenizer.to_str())
    config["model"].update(options)
    return Tokenizer.from_str(json.dumps(config))


def with_byte_tokens(tokenizer, specials):
    """Llama-2 layout: specials, then <0x00>..<0xFF>, then the trained tokens."""
    config = json.loads(tokenizer.to_str())
    vocab = config["model"]["vocab"]
    trained = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if t not in specials]
    order = specials + [f"<0x{b:02X}>" for b in range(256)] + trained
    config["model"]["vocab"] = {t: i for i, t in enumerate(order)}
    for token in config["added_tokens"]:
        token["id"] = config["model"]["vocab"][token["content"]]
    return Tokenizer.from_str(json.dumps(config))


def byte_level_family(pre_tokenizer, normalizer, specials, vocab_size=700):
    t = Tokenizer(BPE())
    t.normalizer = normalizer
    t.pre_tokenizer = pre_tokenizer
    t.decoder = decoders.ByteLevel()
    return train(t, vocab_size, specials, byte_level=True)


def llama3():
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    t = byte_level_family(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]), None, specials)
    t = with_model_options(t, ignore_merges=True)
    bos = t.token_to_id("<|begin_of_text|>")
    t.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    return t, specials


def qwen2():
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    t = byte_level_family(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), normalizers.NFC(), specials)
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    return t, specials


def gpt_neox():
    specials = ["<|endoftext|>", "<|padding|>"]
    t = byte_level_family(pre_tokenizers.ByteLevel(add_prefix_space=False), normalizers.NFC(), specials)
    t.post_processor = processors.ByteLevel(trim_offsets=True)
    t.add_tokens([tokenizers.AddedToken("    ", normalized=True), tokenizers.AddedToken("  ", normalized=True)])
    return t, specials


def duplicate_merges():
    t, specials = gpt_neox()
    data = json.loads(t.to_str())
    # The first 40 merges given again at the end: tokenizers keeps a pair's last rank. The file is
    # written as built here (to_str would write each pair once).
    data["model"]["merges"] = data["model"]["merges"] + data["model"]["merges"][:40]
    text = json.dumps(data, ensure_ascii=False)
    return Tokenizer.from_str(text), specials, text


def starcoder():
    specials = ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>"]
    t = byte_level_family(pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]), None, specials)
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    return t, specials


def sentencepiece_family(specials, normalizer, pre_tokenizer, decoder, unk=True):
    t = Tokenizer(BPE(unk_token="<unk>" if unk else None, fuse_unk=True, byte_fallback=True))
    t.normalizer = normalizer
    t.pre_tokenizer = pre_tokenizer
    t.decoder = decoder
    t = train(t, 600, specials, small_alphabet=True)
    return with_byte_tokens(t, specials)


LLAMA2_DECODER = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(content=" ", left=1, right=0)])


def llama2():
    """Llama-2 / Mistral v0.1 as transformers converts them (legacy): Prepend + Replace."""
    specials = ["<unk>", "<s>", "</s>"]
    t = sentencepiece_family(specials, normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]),
                             None, LLAMA2_DECODER)
    t.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                     special_tokens=[("<s>", t.token_to_id("<s>"))])
    return t, specials


def mistral():
    """Mistral / Llama-2 converted with legacy=False: Metaspace with prepend_scheme "first"."""
    specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]
    t = sentencepiece_family(specials, None, pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False),
                             LLAMA2_DECODER)
    t.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B:1",
                                                     special_tokens=[("<s>", t.token_to_id("<s>"))])
    return t, specials


def metaspace_split():
    specials = ["<unk>", "<s>", "</s>"]
    t = sentencepiece_family(specials, normalizers.NFKC(),
                             pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
                             decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True),
                                                decoders.ByteFallback(), decoders.Fuse()]))
    t.post_processor = processors.RobertaProcessing(("</s>", t.token_to_id("</s>")), ("<s>", t.token_to_id("<s>")))
    return t, specials


def metaspace_never():
    specials = ["<unk>", "<pad>"]
    t = sentencepiece_family(specials, normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase()]),
                             pre_tokenizers.Sequence([pre_tokenizers.Punctuation(behavior="contiguous"),
                                                      pre_tokenizers.Metaspace(replacement="_", prepend_scheme="never")]),
                             decoders.Sequence([decoders.ByteFallback(),
                                                decoders.Metaspace(replacement="_", prepend_scheme="never"),
                                                decoders.Strip(content=" ", left=0, right=1)]), unk=False)
    return t, specials


def words_lowercase():
    """NFKC, Lowercase, Strip, Whitespace pre-tokenizer, no decoder (tokens joined by spaces)."""
    specials = ["<unk>", "<s>", "</s>"]
    t = Tokenizer(BPE(unk_token="<unk>", fuse_unk=False))
    t.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(), normalizers.Strip()])
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t = train(t, 500, specials, small_alphabet=True)
    t.add_tokens([tokenizers.AddedToken("Hello World", normalized=True)])
    t.post_processor = processors.RobertaProcessing(("</s>", t.token_to_id("</s>")), ("<s>", t.token_to_id("<s>")))
    return t, specials


def whitespace_split_punctuation():
    specials = ["<unk>"]
    t = Tokenizer(BPE(unk_token="<unk>", fuse_unk=True))
    t.normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.Replace(Regex(r"\d"), "#"),
                                         normalizers.Strip(left=False, right=True)])
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(),
                                               pre_tokenizers.Digits(individual_digits=False)])
    t.decoder = decoders.Sequence([decoders.Replace(Regex(r"#+"), "<n>"), decoders.Strip(content="x", left=2, right=0)])
    t = train(t, 500, specials, small_alphabet=True)
    return t, specials


def split_behavior(name, pattern, behavior, invert):
    def build():
        specials = ["<|endoftext|>"]
        t = byte_level_family(pre_tokenizers.Sequence([
            pre_tokenizers.Split(pattern, behavior=behavior, invert=invert),
            pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)]), None, specials, vocab_size=500)
        return t, specials
    return name, build


FIXTURES = [
    ("llama3", llama3), ("qwen2", qwen2), ("gpt_neox", gpt_neox), ("starcoder", starcoder), ("llama2", llama2),
    ("mistral", mistral), ("metaspace_split", metaspace_split), ("metaspace_never", metaspace_never),
    ("words_lowercase", words_lowercase), ("whitespace_split_punctuation", whitespace_split_punctuation),
    split_behavior("split_removed", " ", "removed", False),
    split_behavior("split_isolated", Regex(r"\p{P}+"), "isolated", False),
    split_behavior("split_merged_with_previous", Regex(r"[.!?,;]"), "merged_with_previous", False),
    split_behavior("split_merged_with_next", Regex(r"\s"), "merged_with_next", False),
    split_behavior("split_contiguous", Regex(r"\p{N}|\s"), "contiguous", False),
    split_behavior("split_invert", Regex(r"\p{L}+|\p{N}+"), "removed", True),
    ("duplicate_merges", duplicate_merges),
]


def main():
    os.makedirs(OUT, exist_ok=True)
    total = 0
    for index, (name, build) in enumerate(FIXTURES):
        built = build()  # (tokenizer, specials[, the file's text])
        tokenizer, specials = built[:2]
        directory = os.path.join(OUT, name)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(built[2] if len(built) > 2 else tokenizer.to_str(pretty=False))
        cases = []
        for text in test_strings(specials, 250, seed=100 + index):
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            cases.append({"text": text, "ids": ids,
                          "ids_with_special": tokenizer.encode(text, add_special_tokens=True).ids,
                          "decoded": tokenizer.decode(ids, skip_special_tokens=True)})
        with open(os.path.join(directory, "cases.json"), "w", encoding="utf-8") as f:
            json.dump({"tokenizers_version": tokenizers.__version__, "cases": cases}, f, ensure_ascii=False)
        size = sum(os.path.getsize(os.path.join(directory, x)) for x in os.listdir(directory))
        total += size
        print(f"{name}: {len(cases)} cases, vocab {tokenizer.get_vocab_size()}, {size} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
