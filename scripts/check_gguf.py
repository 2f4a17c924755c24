#!/usr/bin/env python3
"""Checks `finetune export --gguf` with real GGUF clients: the `gguf` package and llama.cpp.

Needs torch, transformers, peft, sentencepiece, numpy, `gguf` and
`llama-cpp-python` (pip install gguf llama-cpp-python; the latter builds
llama.cpp from source, about 20 minutes on 2 cores). Not part of the test
suite (tests/test_gguf.cpp is): run it by hand after changing the exporter.

    python3 scripts/check_gguf.py [--finetune build/trainer/finetune]

For each tiny checkpoint (Llama-3 with llama3 rope and a BPE tokenizer, Qwen2,
Mistral made here with a BPE tokenizer, Llama with GQA + a PEFT adapter and a
SentencePiece tokenizer, GPT-NeoX) and each --outtype (f16, q8_0):
  1. export it with finetune;
  2. read it with gguf.GGUFReader: the architecture and hyper-parameters must be
     config.json's, every tensor (dequantised with gguf.quants) the checkpoint's
     (merged with PEFT's merge_and_unload where there is an adapter, q/k rows
     permuted as convert_hf_to_gguf.py does) within the type's rounding;
  3. load it with llama_cpp.Llama, feed each prompt's token ids and compare the
     next-token logits with transformers' (float32): f16 within 1e-2 of the
     largest |logit|, q8_0 the same top-1 token; and llama.cpp's own
     tokenisation of the prompt must give the same ids (skipped for the
     SentencePiece test tokenizer, which has no <0xXX> byte pieces: llama.cpp
     aborts on characters outside such a vocabulary).
Prints one line per check; exit status 1 if any fails.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import gguf
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, MistralConfig, MistralForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
PROMPTS = ["The quick brown fox", "Hello, world! 123", "#Person1#: How are you today?"]
# Largest |dequantised - checkpoint| allowed, relative to the tensor's largest |value|.
TOLERANCE = {"F32": 0.0, "F16": 1e-3, "BF16": 8e-3, "Q8_0": 1.0 / 127}
failures = []


def report(ok, text):
    print(("ok    " if ok else "FAIL  ") + text)
    if not ok:
        failures.append(text)


def make_mistral(folder):
    """A tiny random Mistral with llama3_tiny's byte-level BPE tokenizer (700 ids)."""
    torch.manual_seed(0)
    config = MistralConfig(vocab_size=700, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                           sliding_window=None, bos_token_id=0, eos_token_id=1)
    MistralForCausalLM(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(FIXTURES, "llama3_tiny", name), folder)


def reference_model(model, adapter):
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    if adapter:
        from peft import PeftModel
        hf = PeftModel.from_pretrained(hf, adapter).merge_and_unload()
    return hf.eval()


def prompt_ids(tokenizer_path):
    if tokenizer_path.endswith(".model"):
        from sentencepiece import SentencePieceProcessor
        sp = SentencePieceProcessor(model_file=tokenizer_path)
        return [[sp.bos_id()] + sp.encode(p) for p in PROMPTS]
    tok = AutoTokenizer.from_pretrained(os.path.dirname(tokenizer_path))
    return [tok(p)["input_ids"] for p in PROMPTS]


def expected_tensors(hf, config):
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads")
    arch = {"llama": gguf.MODEL_ARCH.LLAMA, "mistral": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2,
            "gpt_neox": gguf.MODEL_ARCH.GPTNEOX}[config["model_type"]]
    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    out = {}
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        t = t.detach().float()
        if arch == gguf.MODEL_ARCH.LLAMA and ("q_proj" in name or "k_proj" in name):
            h = heads if "q_proj" in name or kv is None else kv
            t = t.reshape(h, 2, t.shape[0] // h // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)
        if arch == gguf.MODEL_ARCH.GPTNEOX and "query_key_value" in name:
            t = t.reshape(heads, 3, config["hidden_size"] // heads, -1).transpose(0, 1).reshape(t.shape)
        out[names.get_name(name, try_suffixes=(".weight", ".bias"))] = t.numpy()
    return gguf.MODEL_ARCH_NAMES[arch], out


def check_with_gguf(path, config, hf, label):
    reader = gguf.GGUFReader(path)
    arch, expected = expected_tensors(hf, config)
    got_arch = reader.fields["general.architecture"].contents()
    report(got_arch == arch, f"{label}: gguf reads general.architecture {got_arch!r} (expected {arch!r})")
    keys = {"block_count": config["num_hidden_layers"], "embedding_length": config["hidden_size"],
            "feed_forward_length": config["intermediate_size"],
            "attention.head_count": config["num_attention_heads"]}
    bad = [k for k, v in keys.items() if reader.fields[f"{arch}.{k}"].contents() != v]
    report(not bad, f"{label}: gguf reads the hyper-parameters of config.json {'' if not bad else bad}")
    worst, names = 0.0, set()
    for t in reader.tensors:
        names.add(t.name)
        if t.name == "rope_freqs.weight":
            continue
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(expected[t.name].shape)
        ref = expected[t.name]
        err = np.abs(values - ref).max() / max(np.abs(ref).max(), 1e-30)
        worst = max(worst, err / max(TOLERANCE[t.tensor_type.name], 1e-12) if TOLERANCE[t.tensor_type.name] else
                    (0.0 if err == 0 else float("inf")))
    missing = set(expected) - names
    report(not missing and worst <= 1.0,
           f"{label}: gguf reads {len(reader.tensors)} tensors equal to the checkpoint's within their type's rounding"
           f" (worst error / bound {worst:.3f}{', missing ' + str(sorted(missing)) if missing else ''})")


def has_byte_pieces(tokenizer_path):
    """llama.cpp's SentencePiece tokeniser needs <0xXX> pieces for characters outside the vocabulary
    (real Llama and Mistral models have them; the 320-piece test tokenizer does not, and llama.cpp aborts)."""
    if not tokenizer_path.endswith(".model"):
        return True
    from sentencepiece import SentencePieceProcessor
    sp = SentencePieceProcessor(model_file=tokenizer_path)
    return any(sp.IsByte(i) for i in range(sp.vocab_size()))


def check_with_llama_cpp(path, hf, ids_list, outtype, label, tokenize):
    from llama_cpp import Llama
    llm = Llama(model_path=path, n_ctx=128, logits_all=True, verbose=False, n_threads=1)
    for ids, prompt in zip(ids_list, PROMPTS):
        llm.reset()
        llm.eval(ids)
        ours = np.array(llm.scores[len(ids) - 1])
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0, -1].numpy()
        rel = np.abs(ours - ref).max() / np.abs(ref).max()
        top1 = int(ours.argmax()) == int(ref.argmax())
        ok = top1 if outtype == "q8_0" else rel <= 1e-2
        report(ok, f"{label}: llama.cpp next-token logits on {prompt!r}: max diff {rel:.2e} of the largest |logit|,"
                   f" top-1 {'same' if top1 else 'DIFFERENT'} ({int(ours.argmax())} vs transformers' {int(ref.argmax())})")
        if not tokenize:
            continue
        tokens = llm.tokenize(prompt.encode(), add_bos=True, special=False)
        report(tokens == ids, f"{label}: llama.cpp tokenises {prompt!r} as the model's tokenizer does"
                              f"{'' if tokens == ids else f' ({tokens} vs {ids})'}")
    del llm


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--finetune", default=os.path.join(ROOT, "build", "trainer", "finetune"))
    args = parser.parse_args()
    try:
        import llama_cpp  # noqa: F401
        have_llama_cpp = True
    except ImportError:
        have_llama_cpp = False
        print("llama-cpp-python is not installed: only the gguf package's checks run (pip install llama-cpp-python)")
    work = tempfile.mkdtemp(prefix="check_gguf_")
    make_mistral(os.path.join(work, "mistral"))
    cases = [  # (label, model folder, tokenizer file, adapter folder)
        ("llama3_tiny", f"{FIXTURES}/llama3_tiny", f"{FIXTURES}/llama3_tiny/tokenizer.json", None),
        ("qwen2_tiny", f"{FIXTURES}/qwen2_tiny", f"{FIXTURES}/qwen2_tiny/tokenizer.json", None),
        ("mistral", f"{work}/mistral", f"{work}/mistral/tokenizer.json", None),
        ("llama_gqa+lora", f"{FIXTURES}/llama_gqa", f"{FIXTURES}/tokenizer/tokenizer.model",
         f"{FIXTURES}/llama_lora/adapter"),
        ("gpt_neox", f"{FIXTURES}/gpt_neox_parallel", f"{FIXTURES}/tokenizer/tokenizer.model", None),
    ]
    for label, model, tokenizer, adapter in cases:
        config = json.load(open(os.path.join(model, "config.json")))
        hf = reference_model(model, adapter)
        ids_list = prompt_ids(tokenizer)
        for outtype in ("f16", "q8_0"):
            path = os.path.join(work, f"{label}_{outtype}.gguf")
            command = [args.finetune, "export", model, "--tokenizer", tokenizer, "--gguf", path, "--outtype", outtype]
            if adapter:
                command += ["--adapter", adapter]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            check_with_gguf(path, config, hf, f"{label} {outtype}")
            if have_llama_cpp:
                tokenize = has_byte_pieces(tokenizer)
                if not tokenize:
                    print(f"skip  {label} {outtype}: llama.cpp's tokenisation (the tokenizer has no byte pieces)")
                check_with_llama_cpp(path, hf, ids_list, outtype, f"{label} {outtype}", tokenize)
    shutil.rmtree(work)
    print(f"{len(failures)} failed" if failures else "all passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
