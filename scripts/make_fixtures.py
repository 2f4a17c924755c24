#!/usr/bin/env python3
"""Regenerates the reference fixtures under tests/fixtures/ (see tests/fixtures/README.md).

Needs torch, transformers, peft, safetensors, sentencepiece, tokenizers and numpy (CPU is enough).
CI never runs this: the C++ tests read the committed outputs.

    python3 scripts/make_fixtures.py            # writes every folder of FIXTURES under tests/fixtures/
    python3 scripts/make_fixtures.py --out DIR  # writes the same tree under DIR instead
    python3 scripts/make_fixtures.py --only bpe_tokenizer  # rewrites just that folder

Everything is seeded and single-threaded, so two runs give byte-identical files.
"""
import argparse
import copy
import io
import json
import os
import random
import shutil
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "fixtures")

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import numpy as np  # noqa: E402
import sentencepiece as spm  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import transformers  # noqa: E402
import peft  # noqa: E402
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
warnings.filterwarnings("ignore", message="Could not find a config file in (llama_gqa|gpt_neox_parallel).*")

VOCAB = 320
BOS, EOS, UNK, PAD = 1, 2, 0, 3
BATCH, SEQ = 2, 11
INIT_STD = 0.1
LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
            bias="none")
NEOX_LORA = dict(LORA, target_modules=["query_key_value"])  # PEFT's default target for gpt_neox
ADAMW = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


# --------------------------------------------------------------------------------------------------------------
# 1. Tokenizer
# --------------------------------------------------------------------------------------------------------------

def make_corpus():
    rng = random.Random(1234)
    names = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Zoë", "José", "Renée", "Björn"]
    subjects = ["the weather", "a new book", "the train schedule", "dinner plans", "the project", "a café menu",
                "the meeting", "a broken laptop", "the garden", "our holiday", "the recipe", "a naïve question"]
    verbs = ["likes", "wants", "needs", "found", "reads", "writes", "asked about", "forgot", "fixed", "moved"]
    objects = ["the red box", "two apples", "a small dog", "three letters", "the blue car", "some coffee",
               "a long story", "the old map", "ten euros (€10)", "a quick summary", "the last page"]
    questions = ["What time is it?", "Where are you going?", "Can you help me?", "How much does it cost?",
                 "Did you see that?", "Why is the sky blue?", "Is this seat free?", "Who wrote this?"]
    answers = ["I think so.", "Not really, sorry.", "Yes, of course!", "It costs 42 dollars.", "About 3 o'clock.",
               "Let me check.", "No idea, honestly.", "Maybe tomorrow."]
    lines = []
    for _ in range(240):
        kind = rng.randrange(4)
        a, b = rng.sample(names, 2)
        if kind == 0:
            lines.append(f"{a} {rng.choice(verbs)} {rng.choice(objects)}.")
        elif kind == 1:
            lines.append(f"#Person1#: {rng.choice(questions)} #Person2#: {rng.choice(answers)}")
        elif kind == 2:
            lines.append(f"{a} and {b} talked about {rng.choice(subjects)} on day {rng.randrange(1, 31)}.")
        else:
            lines.append(f"Summary: {a} {rng.choice(verbs)} {rng.choice(objects)} and {b} {rng.choice(verbs)} "
                         f"{rng.choice(subjects)}.")
    return lines


ENCODE_CASES = [
    "Hello world",
    "Alice and Bob talked about the weather on day 12.",
    "#Person1#: Can you help me? #Person2#: Yes, of course!",
    "  leading and   multiple   spaces  ",
    "tabs\tand\nnewlines\r\nhere",
    "Zoë's café serves crème brûlée for €10 — naïve?",
    "emoji 🙂 and 中文 are not in the vocabulary",
    "",
    "a",
    "1234567890 !@#$%^&*()",
]


def make_tokenizer(out_dir):
    os.makedirs(out_dir)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(make_corpus()),
        model_writer=model,
        model_type="bpe",
        vocab_size=VOCAB,
        character_coverage=1.0,
        unk_id=UNK, bos_id=BOS, eos_id=EOS, pad_id=PAD,
        num_threads=1,
        shuffle_input_sentence=False,
        minloglevel=2,
    )
    path = os.path.join(out_dir, "tokenizer.model")
    with open(path, "wb") as f:
        f.write(model.getvalue())
    sp = spm.SentencePieceProcessor(model_file=path)
    assert sp.get_piece_size() == VOCAB, sp.get_piece_size()
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (UNK, BOS, EOS, PAD)
    cases = []
    for text in ENCODE_CASES:
        ids = sp.encode(text)
        assert sp.decode(ids) is not None
        cases.append({"text": text, "ids": ids, "pieces": sp.encode(text, out_type=str), "decoded": sp.decode(ids)})
    with open(os.path.join(out_dir, "encode_reference.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"tokenizer: {VOCAB} pieces, e.g. {cases[1]['pieces']}")


# --------------------------------------------------------------------------------------------------------------
# 1b. Byte-level BPE tokenizer.json, configured like GPT-NeoX-20B's / Pythia's
# --------------------------------------------------------------------------------------------------------------

BPE_VOCAB = 512
BPE_SPECIAL = ["<|endoftext|>", "<|padding|>"]  # ids 0 and 1, as in GPT-NeoX-20B
BPE_SPACE_RUNS = range(2, 9)  # GPT-NeoX adds runs of 2..24 spaces as non-special, normalized tokens
# GPT-NeoX-20B's tokenizer.json stages, verbatim (no "use_regex": readers must default it to true).
NEOX_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}

BPE_EXTRA_LINES = [
    "I don't know, it's fine. We'll see; they've gone, you're late, I'm here and he'd agree.",
    "Zoë's café: crème brûlée, naïve façade, Ångström, São Paulo, Łódź, Dvořák.",
    "Emoji 🙂🚀🎉 and 中文文本, 日本語のテキスト, 한국어 문장, Ελληνικά, русский текст.",
    "Prices: $3.50, €10, £7, 1,000,000 units; ratio 3:2; 42% of 365 days (½ and ² too).",
    "def f(x):\n    return x ** 2  # square\n\n\nprint(f(12))\n",
    "Tabs\tand  double  spaces,   triple   spaces\r\nand CRLF lines.\n",
    "URLs like https://example.com/a?b=1&c=2 and e-mails like bob@example.org.",
]

BPE_ENCODE_CASES = [
    "Hello world",
    "Alice and Bob talked about the weather on day 12.",
    "#Person1#: Can you help me? #Person2#: Yes, of course!",
    "don't stop, it's fine; we'll see what they've done, I'm sure you'd agree, you're right",
    "DON'T SHOUT, IT'S LOUD",
    "'s at the start, 'quoted', rock'n'roll and the '90s",
    "  leading and   multiple   spaces  ",
    "x    y         nine spaces",
    "tabs\tand\nnewlines\r\nhere\n\n\nthree newlines",
    "trailing whitespace \n ",
    "   ",
    "Zoë's café serves crème brûlée for €10 — naïve?",
    "decomposed: Zoe\u0308 cafe\u0301 A\u030a (NFC composes them)",
    "singletons: \u212b \u2126 \u212a and Hangul jamo \u1112\u1161\u11ab",
    "combining marks reorder: q\u0307\u0323 and a\u0300\u0301",
    "marks newer than Unicode 9.0 keep their order in tokenizers' NFC: x\u1ac6\u1aba",
    "emoji 🙂🚀 and 中文 text, 日本語です, 한국어",
    "Ελληνικά и русский текст",
    "numbers: 3.14159, 1,000,000, ½ ² Ⅻ ٣",
    "1234567890 !@#$%^&*()",
    "mixed123abc 456def",
    "URL: https://example.com/path?q=1&r=2",
    "code:\n    def f(x):\n        return x ** 2\n",
    "spaces of other kinds: non\u00a0breaking, ideographic\u3000space, line\u2028separator, next\u0085line",
    "not whitespace: unit\x1fseparator, zero\u200bwidth, bom\ufeffmark",
    "<|endoftext|>",
    "first<|endoftext|>second",
    "a<|padding|>b<|endoftext|>",
    "<|endoftext|> with a space after and <|endoftext",
    "supercalifragilisticexpialidocious",
    "",
    "a",
]

# More strings for the pre-tokenizer's split alone (the tiny vocabulary hides many split errors in the ids).
BPE_SPLIT_CASES = [
    "it's 'S ''s ' s don't'll we've'd I'M 'm'",
    "a \n b\n\n c \t\td  e   ",
    "\u00a0\u00a0x \u3000y\x1f\x1fz \x0b\x0bw",
    "a \x85\x85b \u2028\u2028c \u1680\u1680d \u2000\u200a\u202f\u205fe \x1c\x1cf \u180e\u180eg",
    " ?! ?  ?a 1 12  34 x1y2",
    "e\u0301 \u0301start caf\u00e9 \u0915\u094d\u0937",
    "👩\u200d💻 🇫🇷 中文,日本 ½²Ⅻ",
    "\n",
    " ",
    "  \n  ",
]
# Strings also encoded with the pre-tokenizer's options flipped (add_prefix_space true; use_regex false).
BPE_VARIANT_CASES = ["Hello world", " leading space", "first<|endoftext|>second", "don't  stop\n", ""]


def train_bpe_tokenizer():
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=BPE_SPECIAL, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(make_corpus() + BPE_EXTRA_LINES * 3, trainer)
    tokenizer.add_tokens([AddedToken(" " * n, normalized=True, special=False) for n in BPE_SPACE_RUNS])
    config = json.loads(tokenizer.to_str())
    config["pre_tokenizer"] = config["post_processor"] = config["decoder"] = NEOX_BYTE_LEVEL
    config["model"]["merges"] = [" ".join(pair) for pair in config["model"]["merges"]]  # GPT-NeoX's "a b" form
    return config


def bpe_references(tokenizer, texts):
    cases = []
    for text in texts:
        encoding = tokenizer.encode(text)
        cases.append({"text": text, "ids": encoding.ids, "tokens": encoding.tokens,
                      "decoded": tokenizer.decode(encoding.ids)})
    return cases


def bpe_decode_cases(tokenizer):
    """decode() of id lists encode never makes: partial UTF-8, stray bytes, specials, unknown ids."""
    vocab = tokenizer.get_vocab()
    byte_ids = [vocab[c] for c in gpt2_byte_chars()]
    lists = [
        [byte_ids[0xE4], byte_ids[0xB8]],  # two of the three bytes of 中
        [byte_ids[0xFF], byte_ids[ord("A")], byte_ids[0x80]],  # bytes that never start UTF-8
        [vocab["<|endoftext|>"], byte_ids[ord("x")], vocab["<|padding|>"]],
        [tokenizer.token_to_id("    "), byte_ids[ord("y")]],
        [byte_ids[ord("z")], tokenizer.get_vocab_size() + 5],  # an id no token has
    ]
    return [{"ids": ids, "decoded": tokenizer.decode(ids)} for ids in lists]


def gpt2_byte_chars():
    """GPT-2's bytes_to_unicode(): the character standing for each byte, indexed by byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def make_bpe_tokenizer(out_dir):
    os.makedirs(out_dir)
    config = train_bpe_tokenizer()
    path = os.path.join(out_dir, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
        f.write("\n")
    tokenizer = Tokenizer.from_file(path)  # references come from the file as written
    assert [tokenizer.token_to_id(t) for t in BPE_SPECIAL] == [0, 1]
    reference = {"tokenizers_version": tokenizers.__version__, "cases": bpe_references(tokenizer, BPE_ENCODE_CASES)}
    for name, changes in (("add_prefix_space", {"add_prefix_space": True}), ("no_regex", {"use_regex": False})):
        variant = Tokenizer.from_str(json.dumps(dict(config, pre_tokenizer=dict(NEOX_BYTE_LEVEL, **changes))))
        reference[name] = bpe_references(variant, BPE_VARIANT_CASES)
    reference["decode"] = bpe_decode_cases(tokenizer)
    split = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    char_byte = {c: b for b, c in enumerate(gpt2_byte_chars())}
    reference["split"] = [
        {"text": text, "pieces": [bytes(char_byte[c] for c in piece).decode() for piece, _ in split.pre_tokenize_str(text)]}
        for text in BPE_ENCODE_CASES + BPE_SPLIT_CASES]
    for case in reference["cases"]:
        if "<|" not in case["text"]:
            assert case["decoded"] == tokenizer.normalizer.normalize_str(case["text"]), case
    with open(os.path.join(out_dir, "encode_reference.json"), "w", encoding="utf-8") as f:
        json.dump(reference, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"bpe_tokenizer: {tokenizer.get_vocab_size()} ids, {len(config['model']['merges'])} merges, "
          f"e.g. {reference['cases'][3]['tokens']}")


# --------------------------------------------------------------------------------------------------------------
# 2. Tiny Llama checkpoints
# --------------------------------------------------------------------------------------------------------------

def llama_config(tied, kv_heads, theta):
    return LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv_heads, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-5,
        rope_theta=theta, tie_word_embeddings=tied, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
        attn_implementation="eager",
    )


def build_model(config, seed, model_class=LlamaForCausalLM):
    torch.manual_seed(seed)
    model = model_class(config).to(torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied lm_head is the same Parameter: listed once
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + INIT_STD * noise)
            else:
                p.copy_(INIT_STD * noise)
    model.eval()  # no dropout anywhere (attention_dropout is 0 anyway)
    return model


def make_inputs(vocab=VOCAB):
    gen = torch.Generator().manual_seed(4242)
    input_ids = torch.randint(4, vocab, (BATCH, SEQ), generator=gen, dtype=torch.int64)
    labels = input_ids.clone()
    labels[0, :3] = -100
    labels[1, -2:] = -100
    return input_ids, labels


def forward_backward(model, input_ids, labels, grad_names):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids).logits.detach().clone()
    loss = model(input_ids, labels=labels).loss
    loss.backward()
    params = dict(model.named_parameters())
    grads = {n: params[n].grad.detach().clone() for n in grad_names}
    return logits, loss.detach().clone(), grads


def compare(tag, a32, a64):
    """Prints the worst |f32 - f64| relative to the f64 tensor's max |value|; returns it."""
    worst = 0.0
    for key in a64:
        ref = a64[key]
        diff = (a32[key].double() - ref).abs().max().item()
        scale = max(ref.abs().max().item(), 1e-30)
        worst = max(worst, diff / scale)
    print(f"  {tag}: float32 vs float64, max |diff| / max |ref| over {len(a64)} tensors = {worst:.2e}")
    return worst


def write_reference(model, out_dir, grad_names, note):
    """Writes reference.safetensors (inputs, logits, loss and the named gradients in float32) and checks the
    float32 numbers against a float64 copy of the model (not written); `note` ends the printed line."""
    input_ids, labels = make_inputs()
    logits, loss, grads = forward_backward(model, input_ids, labels, grad_names)
    ref = {"input_ids": input_ids.to(torch.int32), "labels": labels.to(torch.int32), "logits": logits,
           "loss": loss.reshape(1)}
    for n, g in grads.items():
        ref["grad." + n] = g
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out_dir, "reference.safetensors"))

    check_float64(f"{os.path.basename(out_dir)}", model, lambda m: forward_backward(m, input_ids, labels, grad_names),
                  (logits, loss, grads), note)


def check_float64(tag, model, run, results, note=""):
    """Checks the float32 results (logits, loss, grads) of run(model) against run on a float64 copy of the model."""
    logits, loss, grads = results
    logits64, loss64, grads64 = run(copy.deepcopy(model).to(torch.float64))
    print(f"{tag}: loss f32 {loss.item():.8f}  f64 {loss64.item():.8f}  {note}")
    worst = compare("logits+loss", {"logits": logits, "loss": loss}, {"logits": logits64, "loss": loss64})
    worst = max(worst, compare("grads", grads, grads64))
    assert worst < 1e-4, worst


def make_llama(out_dir, tied, kv_heads, theta, seed):
    config = llama_config(tied, kv_heads, theta)
    model = build_model(config, seed)
    model.save_pretrained(out_dir, safe_serialization=True)

    with open(os.path.join(out_dir, "config.json")) as f:
        saved = json.load(f)
    assert saved.get("rope_scaling") is None, saved.get("rope_scaling")
    assert saved["head_dim"] == 16
    theta_saved = saved.get("rope_theta", saved.get("rope_parameters", {}).get("rope_theta"))
    assert theta_saved == theta, theta_saved
    # The saved checkpoint must reload to the same weights.
    reloaded = load_file(os.path.join(out_dir, "model.safetensors"))
    state = model.state_dict()
    for k, v in reloaded.items():
        assert torch.equal(v, state[k]), k

    grad_names = []
    for i in range(config.num_hidden_layers):
        grad_names += [f"model.layers.{i}.self_attn.q_proj.weight", f"model.layers.{i}.self_attn.v_proj.weight"]
    grad_names += ["model.embed_tokens.weight", "model.norm.weight"]
    write_reference(model, out_dir, grad_names, f"saved keys {sorted(reloaded)[:3]}... ({len(reloaded)} tensors)")
    check_numpy(os.path.basename(out_dir), out_dir, os.path.join(out_dir, "reference.safetensors"))
    return model


def numpy_forward(model_dir, input_ids, labels, lora_dir=None):
    """An independent float64 NumPy Llama forward from the saved files (the formulas the C++ code implements).

    Returns (logits, loss). Used only to check that the fixtures mean what the README says.
    """
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    w = {k: v.double().numpy() for k, v in load_file(os.path.join(model_dir, "model.safetensors")).items()}
    if lora_dir is not None:  # merge: W += (B @ A) * lora_alpha / r
        with open(os.path.join(lora_dir, "adapter_config.json")) as f:
            ac = json.load(f)
        a = {k: v.double().numpy() for k, v in load_file(os.path.join(lora_dir, "adapter_model.safetensors")).items()}
        for k in a:
            if ".lora_A." in k:
                base = k.replace("base_model.model.", "", 1).replace(".lora_A.weight", ".weight")
                w[base] = w[base] + a[k.replace("lora_A", "lora_B")] @ a[k] * (ac["lora_alpha"] / ac["r"])
    H, nh, nkv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    theta = c.get("rope_theta", c.get("rope_parameters", {}).get("rope_theta"))
    eps = c["rms_norm_eps"]
    ids = input_ids.numpy()
    B, T = ids.shape

    def rms(x, g):
        return g * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))

    inv_freq = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    ang = np.arange(T)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))  # [T, hd]

    def rope(x):  # x: [B, heads, T, hd]; rotate_half pairs i with i + hd/2
        rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * cos + rot * sin

    x = w["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(B, T, nh, hd).transpose(0, 2, 1, 3)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(B, T, nkv, hd).transpose(0, 2, 1, 3)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(B, T, nkv, hd).transpose(0, 2, 1, 3)
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)  # query head j uses kv head j // rep
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = (s @ v).transpose(0, 2, 1, 3).reshape(B, T, nh * hd)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
    logits = x @ head.T
    lab = labels.numpy()[:, 1:]  # logits[:, t] predicts labels[:, t + 1]; -100 ignored; mean over counted tokens
    lg = logits[:, :-1]
    lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
    keep = lab != -100
    picked = np.take_along_axis(lg, np.where(keep, lab, 0)[..., None], -1)[..., 0]
    loss = ((lse - picked) * keep).sum() / keep.sum()
    return logits, loss


def check_numpy(tag, model_dir, ref_path, lora_dir=None):
    ref = load_file(ref_path)
    logits, loss = numpy_forward(model_dir, ref["input_ids"].long(), ref["labels"].long(), lora_dir)
    d_logits = np.abs(logits - ref["logits"].double().numpy()).max() / np.abs(logits).max()
    d_loss = abs(loss - ref["loss"].double().item()) / abs(loss)
    print(f"  {tag}: independent NumPy f64 forward vs fixture: logits rel {d_logits:.2e}, loss rel {d_loss:.2e}")
    assert d_logits < 1e-5 and d_loss < 1e-5


# --------------------------------------------------------------------------------------------------------------
# 3. PEFT LoRA on llama_gqa
# --------------------------------------------------------------------------------------------------------------

def saved_lora_name(param_name):
    # PEFT drops the adapter name from saved keys: ...q_proj.lora_A.default.weight -> ...q_proj.lora_A.weight
    return param_name.replace(".default.", ".")


def lora_forward_backward(peft_model, input_ids, labels):
    peft_model.zero_grad(set_to_none=True)
    logits = peft_model(input_ids=input_ids).logits.detach().clone()
    loss = peft_model(input_ids=input_ids, labels=labels).loss
    loss.backward()
    grads = {saved_lora_name(n): p.grad.detach().clone()
             for n, p in peft_model.named_parameters() if p.requires_grad}
    return logits, loss.detach().clone(), grads


def lora_reference(tag, peft_model):
    """The reference of peft_model's LoRA step on make_inputs' batch, its float32 values checked against a float64
    copy: input_ids, labels, logits, loss and grad.<saved name> of every adapter tensor."""
    input_ids, labels = make_inputs(peft_model.config.vocab_size)
    logits, loss, grads = lora_forward_backward(peft_model, input_ids, labels)
    logits64, loss64, grads64 = lora_forward_backward(copy.deepcopy(peft_model).to(torch.float64), input_ids, labels)
    print(f"{tag}: loss f32 {loss.item():.8f}  f64 {loss64.item():.8f}  ({len(grads)} LoRA tensors)")
    worst = compare("logits+loss", {"logits": logits, "loss": loss}, {"logits": logits64, "loss": loss64})
    worst = max(worst, compare("grads", grads, grads64))
    assert worst < 1e-4, worst
    ref = {"input_ids": input_ids.to(torch.int32), "labels": labels.to(torch.int32), "logits": logits,
           "loss": loss.reshape(1)}
    ref.update({f"grad.{k}": g for k, g in grads.items()})
    return ref


def make_peft_model(base, lora, base_name, seed):
    """PEFT's LoRA on base: lora_A from PEFT's seeded init, every lora_B set to seeded noise so A gets gradients."""
    base.eval()
    torch.manual_seed(seed)  # lora_A: PEFT's kaiming_uniform_(a=sqrt(5)) draws from the global generator
    model = get_peft_model(base, LoraConfig(**lora))
    model.peft_config["default"].base_model_name_or_path = base_name
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(INIT_STD * torch.randn(p.shape, generator=gen, dtype=torch.float32))
    model.eval()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n, _ in trainable), [n for n, _ in trainable]
    return model, trainable


def save_pretrained_fixture(model, adapter_dir):
    """model.save_pretrained(adapter_dir), reproducible: no model card, target_modules sorted."""
    model.save_pretrained(adapter_dir, safe_serialization=True)
    card = os.path.join(adapter_dir, "README.md")  # PEFT's boilerplate model card: not a fixture
    if os.path.exists(card):
        os.remove(card)
    # PEFT keeps a list target_modules or exclude_modules as a Python set, so the saved list's order follows the
    # string hash seed: sort it (written back exactly as PEFT writes the file: json.dumps(indent=2,
    # sort_keys=True), no trailing newline). A string (a regular expression) stays as it is.
    config_path = os.path.join(adapter_dir, "adapter_config.json")
    with open(config_path) as f:
        adapter_config = json.load(f)
    for field in ("target_modules", "exclude_modules"):
        if isinstance(adapter_config.get(field), list):
            adapter_config[field] = sorted(adapter_config[field])
    with open(config_path, "w") as f:
        f.write(json.dumps(adapter_config, indent=2, sort_keys=True))


def save_adapter(model, trainable, adapter_dir):
    save_pretrained_fixture(model, adapter_dir)
    saved = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    names = {saved_lora_name(n): p for n, p in trainable}
    assert set(saved) == set(names), (sorted(saved), sorted(names))
    for k, v in saved.items():
        assert torch.equal(v, names[k].detach()), k


def make_lora(out_dir, base_dir, seed):
    os.makedirs(out_dir)
    base = LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
    model, trainable = make_peft_model(base, LORA, "llama_gqa", seed)
    adapter_dir = os.path.join(out_dir, "adapter")
    save_adapter(model, trainable, adapter_dir)

    ref = lora_reference("llama_lora", model)  # with its float64 cross-check
    input_ids, labels = ref["input_ids"].long(), ref["labels"].long()
    grads = {k[len("grad."):]: g for k, g in ref.items() if k.startswith("grad.")}

    # One AdamW step over the LoRA parameters only (grads from the float32 backward above are still in .grad).
    before = {saved_lora_name(n): p.detach().clone() for n, p in trainable}
    optimizer = torch.optim.AdamW([p for _, p in trainable], foreach=False, fused=False, **ADAMW)
    optimizer.step()
    after = {saved_lora_name(n): p.detach().clone() for n, p in trainable}

    # Check against the closed form of AdamW's first step (decay first, then the bias-corrected Adam update).
    lr, (b1, b2), eps, wd = ADAMW["lr"], ADAMW["betas"], ADAMW["eps"], ADAMW["weight_decay"]
    worst_step = 0.0
    for k in after:
        g = grads[k].double()
        p = before[k].double() * (1 - lr * wd)
        m = (1 - b1) * g
        v = (1 - b2) * g * g
        p = p - (lr / (1 - b1)) * m / (v.sqrt() / np.sqrt(1 - b2) + eps)
        worst_step = max(worst_step, (after[k].double() - p).abs().max().item())
    print(f"  AdamW step vs closed form (f64): max |diff| = {worst_step:.2e}")
    assert worst_step < 1e-6

    with torch.no_grad():
        loss_after = model(input_ids=input_ids, labels=labels).loss.detach().clone()
    print(f"  loss after one AdamW step: {loss_after.item():.8f}")

    ref["loss_after_step"] = loss_after.reshape(1)
    for k, p in after.items():
        ref["after_step." + k] = p
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out_dir, "reference.safetensors"))
    with open(os.path.join(out_dir, "optimizer.json"), "w") as f:
        json.dump({"type": "AdamW", "lr": ADAMW["lr"], "beta1": ADAMW["betas"][0], "beta2": ADAMW["betas"][1],
                   "eps": ADAMW["eps"], "weight_decay": ADAMW["weight_decay"], "amsgrad": False, "maximize": False,
                   "steps": 1, "implementation": "torch.optim.AdamW(foreach=False, fused=False)"}, f, indent=2)
        f.write("\n")
    check_numpy("llama_lora", base_dir, os.path.join(out_dir, "reference.safetensors"), adapter_dir)


# --------------------------------------------------------------------------------------------------------------
# 4. Tiny GPT-NeoX checkpoints and PEFT LoRA on one
# --------------------------------------------------------------------------------------------------------------

def gpt_neox_config(parallel):
    return GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
        rotary_pct=0.25, rotary_emb_base=10000, max_position_embeddings=64, layer_norm_eps=1e-5,
        use_parallel_residual=parallel, hidden_act="gelu", tie_word_embeddings=False, bos_token_id=BOS,
        eos_token_id=EOS, attn_implementation="eager",
    )


def gpt_neox_grad_names(layers):
    """Every query_key_value weight and bias, and a sample of the other parameter kinds (LayerNorm weight and
    bias, an MLP bias, the embedding) so that every backward path of the model is compared."""
    names = []
    for i in range(layers):
        p = f"gpt_neox.layers.{i}."
        names += [p + "attention.query_key_value.weight", p + "attention.query_key_value.bias",
                  p + "post_attention_layernorm.weight", p + "post_attention_layernorm.bias",
                  p + "mlp.dense_4h_to_h.bias"]
    return names + ["gpt_neox.final_layer_norm.weight", "gpt_neox.final_layer_norm.bias", "gpt_neox.embed_in.weight"]


def make_gpt_neox(out_dir, parallel, seed):
    config = gpt_neox_config(parallel)
    model = build_model(config, seed, GPTNeoXForCausalLM)
    model.save_pretrained(out_dir, safe_serialization=True)

    with open(os.path.join(out_dir, "config.json")) as f:
        saved = json.load(f)
    rope = saved["rope_parameters"]  # transformers 5: no top-level rotary_pct / rotary_emb_base
    assert (rope["partial_rotary_factor"], rope["rope_theta"]) == (0.25, 10000), rope
    assert saved["use_parallel_residual"] == parallel and saved["hidden_act"] == "gelu"
    reloaded = load_file(os.path.join(out_dir, "model.safetensors"))
    assert "embed_out.weight" in reloaded and "lm_head.weight" not in reloaded, sorted(reloaded)
    state = model.state_dict()
    for k, v in reloaded.items():
        assert torch.equal(v, state["lm_head.weight" if k == "embed_out.weight" else k]), k

    write_reference(model, out_dir, gpt_neox_grad_names(config.num_hidden_layers), f"({len(reloaded)} tensors)")


def make_gpt_neox_lora(out_dir, base_dir, seed):
    os.makedirs(out_dir)
    base = GPTNeoXForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
    model, trainable = make_peft_model(base, NEOX_LORA, "gpt_neox_parallel", seed)
    save_adapter(model, trainable, os.path.join(out_dir, "adapter"))

    ref = lora_reference("gpt_neox_lora", model)
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out_dir, "reference.safetensors"))


# --------------------------------------------------------------------------------------------------------------
# 5. Model families: Llama-3 rope scaling and biases, Qwen2, Mistral, explicit head_dim; each with a PEFT adapter
# --------------------------------------------------------------------------------------------------------------

FAMILY_VOCAB = 96
FAMILY_COMMON = dict(vocab_size=FAMILY_VOCAB, num_hidden_layers=2, rms_norm_eps=1e-5, bos_token_id=BOS,
                     eos_token_id=EOS, pad_token_id=PAD, attn_implementation="eager")
ALL_LLAMA_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def family_spec(name):
    """(config, model class, LoRA target_modules (None: PEFT's default for the model type)) of each fixture."""
    if name == "llama3_rope":  # rope llama3 with all three bands, biases everywhere, head_dim * heads != hidden
        rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        return (LlamaConfig(hidden_size=36, intermediate_size=44, num_attention_heads=3, num_key_value_heads=1,
                            head_dim=10, max_position_embeddings=256, attention_bias=True, mlp_bias=True,
                            tie_word_embeddings=False, rope_parameters=rope, **FAMILY_COMMON),
                LlamaForCausalLM, ALL_LLAMA_LINEARS)
    if name == "llama_linear_rope":
        rope = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.5}
        return (LlamaConfig(hidden_size=32, intermediate_size=40, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=64, tie_word_embeddings=False, rope_parameters=rope,
                            **FAMILY_COMMON), LlamaForCausalLM, None)
    if name == "llama_dynamic_rope":  # max_position_embeddings 8 < SEQ 11: the NTK base grows for this batch
        rope = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
        return (LlamaConfig(hidden_size=32, intermediate_size=40, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=8, tie_word_embeddings=False, rope_parameters=rope,
                            **FAMILY_COMMON), LlamaForCausalLM, None)
    if name == "qwen2":  # q/k/v biases, o_proj without, tied embeddings
        return (Qwen2Config(hidden_size=32, intermediate_size=40, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=64, rope_theta=1000000.0, tie_word_embeddings=True,
                            use_sliding_window=False, **FAMILY_COMMON), Qwen2ForCausalLM, None)
    if name == "mistral":  # sliding window 4 < SEQ 11, head_dim * heads != hidden
        return (MistralConfig(hidden_size=32, intermediate_size=40, num_attention_heads=4, num_key_value_heads=1,
                              head_dim=12, max_position_embeddings=64, sliding_window=4, rope_theta=10000.0,
                              tie_word_embeddings=False, **FAMILY_COMMON), MistralForCausalLM, None)
    raise ValueError(name)


def rope_inv_freq_of(model):
    """The rotary inverse frequencies the last forward used (dynamic rope updates them per forward)."""
    for name, buffer in model.named_buffers():
        if name.endswith("rotary_emb.inv_freq"):
            return buffer.detach().clone().float()
    raise KeyError("rotary_emb.inv_freq")


def adamw_step(model, trainable, input_ids, labels):
    """One AdamW step over the LoRA parameters (their .grad set); returns (params after, loss after)."""
    optimizer = torch.optim.AdamW([p for _, p in trainable], foreach=False, fused=False, **ADAMW)
    optimizer.step()
    after = {saved_lora_name(n): p.detach().clone() for n, p in trainable}
    with torch.no_grad():
        loss_after = model(input_ids=input_ids, labels=labels).loss.detach().clone()
    return after, loss_after


def make_family(out_dir, name, seed):
    config, model_class, targets = family_spec(name)
    model = build_model(config, seed, model_class)
    model.save_pretrained(out_dir, safe_serialization=True)
    with open(os.path.join(out_dir, "config.json")) as f:
        saved = json.load(f)
    reloaded = load_file(os.path.join(out_dir, "model.safetensors"))
    state = model.state_dict()
    for k, v in reloaded.items():
        assert torch.equal(v, state[k]), k

    base = model_class.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager")
    lora = dict(LORA, target_modules=targets)
    peft_model, trainable = make_peft_model(base, lora, name, seed + 1)
    adapter_targets = sorted(peft_model.peft_config["default"].target_modules)
    assert targets is not None or adapter_targets == ["q_proj", "v_proj"], adapter_targets  # PEFT's default
    save_adapter(peft_model, trainable, os.path.join(out_dir, "adapter"))

    input_ids, labels = make_inputs(FAMILY_VOCAB)
    with torch.no_grad(), peft_model.disable_adapter():
        base_logits = peft_model(input_ids=input_ids).logits.detach().clone()
    logits, loss, grads = lora_forward_backward(peft_model, input_ids, labels)
    inv_freq = rope_inv_freq_of(peft_model)
    model64 = copy.deepcopy(peft_model).to(torch.float64)
    logits64, loss64, grads64 = lora_forward_backward(model64, input_ids, labels)
    print(f"{name}: loss f32 {loss.item():.8f}  f64 {loss64.item():.8f}  ({len(grads)} LoRA tensors, "
          f"targets {adapter_targets}, rope {saved.get('rope_parameters')}, sliding_window "
          f"{saved.get('sliding_window')})")
    worst = compare("logits+loss", {"logits": logits, "loss": loss}, {"logits": logits64, "loss": loss64})
    worst = max(worst, compare("grads", grads, grads64))
    assert worst < 1e-4, worst
    after, loss_after = adamw_step(peft_model, trainable, input_ids, labels)

    ref = {"input_ids": input_ids.to(torch.int32), "labels": labels.to(torch.int32), "base_logits": base_logits,
           "logits": logits, "loss": loss.reshape(1), "loss_after_step": loss_after.reshape(1),
           "inv_freq": inv_freq}
    for k, g in grads.items():
        ref["grad." + k] = g
    for k, p in after.items():
        ref["after_step." + k] = p
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out_dir, "reference.safetensors"))


# --------------------------------------------------------------------------------------------------------------
# 6. Llama-3-style and Qwen2-style tiny checkpoints with their real tokenizer pipelines, as a user downloads them
# --------------------------------------------------------------------------------------------------------------

TOKENIZERS_DIR = os.path.join(ROOT, "tests", "fixtures", "tokenizers")


def chat_spec(name):
    """(config, model class, tokenizer folder, special tokens) of the end-to-end checkpoints."""
    common = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                  num_key_value_heads=2, rms_norm_eps=1e-5, attn_implementation="eager")
    if name == "llama3_tiny":  # Llama-3.2 style: rope llama3, theta 500000, tied like Llama-3.2-1B
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        special = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
        config = LlamaConfig(vocab_size=700, max_position_embeddings=1024, rope_parameters=rope,
                             tie_word_embeddings=True, bos_token_id=0, eos_token_id=1, **common)
        return config, LlamaForCausalLM, "llama3", special
    if name == "qwen2_tiny":  # Qwen2.5 style: q/k/v biases, theta 1e6, untied
        special = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
        config = Qwen2Config(vocab_size=700, max_position_embeddings=1024, rope_theta=1000000.0,
                             tie_word_embeddings=False, use_sliding_window=False, bos_token_id=None,
                             eos_token_id=0, **common)
        return config, Qwen2ForCausalLM, "qwen2", special
    raise ValueError(name)


def make_chat_checkpoint(out_dir, name, seed):
    config, model_class, tokenizer_name, special = chat_spec(name)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(TOKENIZERS_DIR, tokenizer_name, "tokenizer.json"),
                                        **special)
    assert len(tokenizer) <= config.vocab_size, len(tokenizer)
    model = build_model(config, seed, model_class)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    reloaded = model_class.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager")
    ids = tokenizer("Summary: Alice likes two apples.", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)
    print(f"{name}: {sorted(os.listdir(out_dir))}, ids {ids.tolist()}")


# --------------------------------------------------------------------------------------------------------------

FAMILIES = ("llama3_rope", "llama_linear_rope", "llama_dynamic_rope", "qwen2", "mistral")
FIXTURES = ("tokenizer", "bpe_tokenizer", "llama_gqa", "llama_tied", "llama_lora", "gpt_neox_parallel",
            "gpt_neox_sequential", "gpt_neox_lora") + FAMILIES + ("llama3_tiny", "qwen2_tiny")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=DEFAULT_OUT, help="fixtures root (default: tests/fixtures)")
    parser.add_argument("--only", nargs="+", choices=FIXTURES, metavar="NAME",
                        help=f"regenerate only these folders (any of {', '.join(FIXTURES)})")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}, "
          f"sentencepiece {spm.__version__}, python {sys.version.split()[0]}")

    dirs = {name: os.path.join(out, name) for name in args.only or FIXTURES}
    for d in dirs.values():
        if os.path.exists(d):
            shutil.rmtree(d)

    # The LoRA fixtures reload their base checkpoint from its folder, which must exist.
    makers = {
        "tokenizer": lambda d: make_tokenizer(d),
        "bpe_tokenizer": lambda d: make_bpe_tokenizer(d),
        "llama_gqa": lambda d: make_llama(d, tied=False, kv_heads=2, theta=10000.0, seed=1),
        "llama_tied": lambda d: make_llama(d, tied=True, kv_heads=4, theta=500000.0, seed=2),
        "llama_lora": lambda d: make_lora(d, os.path.join(out, "llama_gqa"), seed=3),
        "gpt_neox_parallel": lambda d: make_gpt_neox(d, parallel=True, seed=4),
        "gpt_neox_sequential": lambda d: make_gpt_neox(d, parallel=False, seed=5),
        "gpt_neox_lora": lambda d: make_gpt_neox_lora(d, os.path.join(out, "gpt_neox_parallel"), seed=6),
        "llama3_tiny": lambda d: make_chat_checkpoint(d, "llama3_tiny", seed=30),
        "qwen2_tiny": lambda d: make_chat_checkpoint(d, "qwen2_tiny", seed=31),
    }
    for i, family in enumerate(FAMILIES):
        makers[family] = lambda d, family=family, seed=20 + 2 * i: make_family(d, family, seed)
    for name, d in dirs.items():
        makers[name](d)

    total = 0
    print("files:")
    for d in dirs.values():
        for root, _, files in sorted(os.walk(d)):
            for name in sorted(files):
                path = os.path.join(root, name)
                size = os.path.getsize(path)
                total += size
                print(f"  {os.path.relpath(path, out):45s} {size:9d}")
    print(f"  total {total} bytes")
    assert total < 5 * 1024 * 1024


if __name__ == "__main__":
    main()
