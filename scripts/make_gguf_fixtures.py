#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/*.gguf: what llama.cpp's converter makes of tiny checkpoints.

Needs torch, transformers, peft, sentencepiece, numpy and the `gguf` package
(pip install gguf). CI never runs this: tests/test_gguf.cpp exports the same
checkpoints with `finetune export --gguf` and compares with these files.

Each file is built with gguf's own GGUFWriter, tensor-name map
(gguf.get_tensor_name_map), quantisers (gguf.quants.quantize: F16, BF16 and
Q8_0 bit-exact with ggml-quants.c) and SpecialVocab (merges, special ids),
following convert_hf_to_gguf.py's rules: Llama's q/k rows permuted
(LlamaModel.permute), GPT-NeoX's fused qkv regrouped, Llama-3's rope_freqs,
1-D tensors / norms / biases in F32, Q8_0 falling back to F16 for rows that
are not a multiple of 32, the vocabulary padded with [PADi] to vocab_size.
The adapter case merges with PEFT's merge_and_unload() first.

special_ids.json: what SpecialVocab picks as special ids for small folders
(tokenizer.json, tokenizer_config.json, config.json) that exercise its rules;
tests/test_gguf.cpp writes each folder and compares gguf_special_ids with it.

    python3 scripts/make_gguf_fixtures.py
"""
import importlib.metadata
import json
import math
import os

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(FIXTURES, "gguf")

# name: (model folder, tokenizer file, adapter folder or None, outtype)
CASES = {
    "llama3_tiny_q8_0": ("llama3_tiny", "llama3_tiny/tokenizer.json", None, "q8_0"),
    "qwen2_tiny_f16": ("qwen2_tiny", "qwen2_tiny/tokenizer.json", None, "f16"),
    "llama_lora_bf16": ("llama_gqa", "tokenizer/tokenizer.model", "llama_lora/adapter", "bf16"),
    "gpt_neox_q8_0": ("gpt_neox_parallel", "tokenizer/tokenizer.model", None, "q8_0"),
}
QTYPES = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
          "bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}
FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}
ARCHS = {"llama": gguf.MODEL_ARCH.LLAMA, "mistral": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2,
         "gpt_neox": gguf.MODEL_ARCH.GPTNEOX}


def permute(w, n_head, n_head_kv):  # convert_hf_to_gguf.py LlamaModel.permute
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def weights(model_dir, adapter_dir):
    if adapter_dir is None:
        return {k: v.float() for k, v in load_file(os.path.join(model_dir, "model.safetensors")).items()}
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    state = {k: v.detach().float() for k, v in merged.state_dict().items()}
    if merged.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def rope(config):
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    return params, theta


def llama3_rope_freqs(config, params, theta):  # convert_hf_to_gguf.py LlamaModel.generate_extra_tensors
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = params.get("factor", 8.0), params.get("low_freq_factor", 1.0), params.get("high_freq_factor", 4.0)
    old = params.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


def add_tensor(writer, name, data, outtype):
    qtype = QTYPES[outtype]
    if data.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        qtype = gguf.GGMLQuantizationType.F32
    try:
        q = gguf.quants.quantize(data, qtype)
    except gguf.QuantError:
        qtype = gguf.GGMLQuantizationType.F16
        q = gguf.quants.quantize(data, qtype)
    writer.add_tensor(name, q, raw_dtype=qtype)


def looks_special(t):
    return t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (t.startswith("<|") and t.endswith("|>")) or \
        (t.startswith("<｜") and t.endswith("｜>")) or (t.startswith("<unused") and t.endswith(">"))


def special_ids(tokenizer_folder, model_dir, vocab_size):
    """SpecialVocab's ids, as GGUF keys in its order: the tokenizer files of tokenizer_folder, config.json of model_dir."""
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if os.path.exists(os.path.join(tokenizer_folder, name)):
                os.symlink(os.path.join(tokenizer_folder, name), os.path.join(folder, name))
        os.symlink(os.path.join(model_dir, "config.json"), os.path.join(folder, "config.json"))
        found = gguf.SpecialVocab(folder, n_vocab=vocab_size).special_token_ids
    return [(SPECIAL_KEYS[t], i) for t, i in found.items() if t in SPECIAL_KEYS]


SPECIAL_KEYS = {"bos": gguf.Keys.Tokenizer.BOS_ID, "eos": gguf.Keys.Tokenizer.EOS_ID, "unk": gguf.Keys.Tokenizer.UNK_ID,
                "sep": gguf.Keys.Tokenizer.SEP_ID, "pad": gguf.Keys.Tokenizer.PAD_ID,
                "mask": gguf.Keys.Tokenizer.MASK_ID, "eot": gguf.Keys.Tokenizer.EOT_ID,
                "eom": gguf.Keys.Tokenizer.EOM_ID}  # cls: GGUF has no key, SpecialVocab skips it


def add_special_ids(writer, tokenizer_path, model_dir, vocab_size):
    for key, value in special_ids(os.path.dirname(tokenizer_path), model_dir, vocab_size):
        writer.add_uint32(key, value)


def add_vocab(writer, tokenizer_path, model_dir, vocab_size):
    folder = os.path.dirname(tokenizer_path)
    if tokenizer_path.endswith(".model"):  # _create_vocab_sentencepiece
        from sentencepiece import SentencePieceProcessor
        sp = SentencePieceProcessor()
        sp.LoadFromFile(tokenizer_path)
        tokens = [f"[PAD{i}]" for i in range(vocab_size)]
        scores, types = [-10000.0] * vocab_size, [5] * vocab_size
        for i in range(sp.vocab_size()):
            tokens[i], scores[i] = sp.IdToPiece(i), sp.GetScore(i)
            types[i] = 2 if sp.IsUnknown(i) else 3 if sp.IsControl(i) else 5 if sp.IsUnused(i) else \
                6 if sp.IsByte(i) else 1
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        add_special_ids(writer, tokenizer_path, model_dir, vocab_size)
        writer.add_add_bos_token(sp.bos_id() >= 0)
        writer.add_add_eos_token(False)
        return
    from transformers import AutoTokenizer  # get_vocab_base
    tok = AutoTokenizer.from_pretrained(folder)
    reverse = {i: t for t, i in tok.vocab.items()}
    added = tok.get_added_vocab()
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]"), types.append(5)
            continue
        t = reverse[i]
        tokens.append(t)
        types.append((3 if tok.added_tokens_decoder[i].special or looks_special(t) else 4) if t in added else 1)
    pre = {"llama3_tiny": "llama-bpe", "qwen2_tiny": "qwen2"}[os.path.basename(folder)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(gguf.SpecialVocab(folder, load_merges=True).merges)
    enc = tok("a", add_special_tokens=True)["input_ids"]
    plain = tok("a", add_special_tokens=False)["input_ids"]
    add_special_ids(writer, tokenizer_path, model_dir, vocab_size)
    writer.add_add_bos_token(len(enc) > len(plain) and enc[0] != plain[0])
    writer.add_add_eos_token(len(enc) > len(plain) and enc[-1] != plain[-1])


def write_case(name, model, tokenizer, adapter, outtype):
    model_dir = os.path.join(FIXTURES, model)
    config = json.load(open(os.path.join(model_dir, "config.json")))
    arch = ARCHS[config["model_type"]]
    n_layers = config["num_hidden_layers"]
    names = gguf.get_tensor_name_map(arch, n_layers)
    path = os.path.join(OUT, name + ".gguf")
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    params, theta = rope(config)
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads")
    hidden = config["hidden_size"]
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_rope_freq_base(theta)
    writer.add_file_type(FILE_TYPES[outtype])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    head_dim = config.get("head_dim") or hidden // heads
    if arch == gguf.MODEL_ARCH.GPTNEOX:
        writer.add_rope_dimension_count(int(params.get("partial_rotary_factor", config.get("rotary_pct", 0.25)) * head_dim))
        writer.add_parallel_residual(config.get("use_parallel_residual", True))
        writer.add_layer_norm_eps(config["layer_norm_eps"])
    else:
        writer.add_head_count_kv(kv)
        writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
        writer.add_rope_dimension_count(head_dim)
    if params.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(params["factor"])
    add_vocab(writer, os.path.join(FIXTURES, tokenizer), model_dir, config["vocab_size"])
    if params.get("rope_type") == "llama3":
        add_tensor(writer, "rope_freqs.weight", llama3_rope_freqs(config, params, theta), outtype)
    state = weights(model_dir, os.path.join(FIXTURES, adapter) if adapter else None)
    for hf_name, tensor in state.items():
        if hf_name.endswith(("rotary_emb.inv_freq", "attention.bias", "attention.masked_bias")):
            continue
        if arch == gguf.MODEL_ARCH.LLAMA and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            tensor = permute(tensor, heads, heads)
        if arch == gguf.MODEL_ARCH.LLAMA and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            tensor = permute(tensor, heads, kv)
        if arch == gguf.MODEL_ARCH.GPTNEOX and "query_key_value" in hf_name:  # GPTNeoXModel.modify_tensors
            shape = tensor.shape
            tensor = tensor.reshape(heads, 3, hidden // heads, -1).transpose(0, 1).reshape(shape)
        add_tensor(writer, names.get_name(hf_name, try_suffixes=(".weight", ".bias")), tensor.numpy(), outtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{path}: {os.path.getsize(path)} bytes")


ADDED = [{"id": i, "content": c} for i, c in enumerate(
    ["<|endoftext|>", "<|padding|>", "<s>", "</s>", "<unk>", "[CLS]", "[SEP]", "[MASK]", "<|eot_id|>", "<pad>"])]


def template(single, pair):
    item = lambda t: {"Sequence": {"id": t, "type_id": 0}} if t in "AB" else {"SpecialToken": {"id": t, "type_id": 0}}
    return {"type": "TemplateProcessing", "single": [item(t) for t in single], "pair": [item(t) for t in pair]}


# name: (tokenizer file, tokenizer.json's post_processor or None for no tokenizer.json, tokenizer_config or None, config)
SPECIAL_CASES = {
    "gpt_neox: names a bos it does not add": ("tokenizer.json", {}, {"add_bos_token": False, "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}, {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": None}),
    "config.json only": ("tokenizer.json", {}, None, {"bos_token_id": 2, "eos_token_id": 3, "pad_token_id": 9}),
    "sentencepiece: no tokenizer.json": ("tokenizer.model", None, {"bos_token": "<s>", "eos_token": "</s>"},
        {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}),
    "tokens as objects": ("tokenizer.json", {}, {"bos_token": {"content": "<s>", "lstrip": False},
        "eos_token": {"content": "</s>"}, "pad_token": {"lstrip": False}}, {}),
    "cls and sep stand in for bos and eos": ("tokenizer.json", {}, {"cls_token": "[CLS]", "sep_token": "[SEP]",
        "mask_token": "[MASK]"}, {}),
    "tokenizer_config first, config.json fills in": ("tokenizer.json", {}, {"eos_token": "</s>", "pad_token": "<nope>"},
        {"bos_token_id": 2, "eos_token_id": 8, "pad_token_id": 9}),
    "eos as a list, text_config": ("tokenizer.json", {}, None,
        {"eos_token_id": [3, 8], "text_config": {"bos_token_id": 2, "eos_token_id": 3, "pad_token_id": 9}}),
    "ids past the vocabulary skipped": ("tokenizer.model", None, None, {"bos_token_id": 2, "pad_token_id": 50}),
    "template ends in another special token": ("tokenizer.json", template(["<s>", "A", "<|eot_id|>"],
        ["<s>", "A", "<|eot_id|>", "B", "<|eot_id|>"]), {"bos_token": "<s>", "eos_token": "</s>"}, {}),
    "template puts eos between A and B": ("tokenizer.json", template(["<s>", "A"], ["<s>", "A", "</s>", "B"]),
        {"bos_token": "<s>", "eos_token": "</s>"}, {}),
    "template puts bos between A and B (Llama-3)": ("tokenizer.json", {"type": "Sequence", "processors": [
        {"type": "ByteLevel"}, template(["<s>", "A"], ["<s>", "A", "<s>", "B"])]},
        {"bos_token": "<s>", "eos_token": "</s>"}, {"bos_token_id": 9}),
    "roberta": ("tokenizer.json", {"type": "RobertaProcessing", "sep": ["</s>", 3], "cls": ["<s>", 2]},
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "[MASK]"}, {}),
    "empty tokenizer_config": ("tokenizer.json", {}, {}, {"bos_token_id": 2}),
}


def write_special_ids():
    import tempfile
    cases = []
    for name, (tokenizer_file, post, tokenizer_config, config) in SPECIAL_CASES.items():
        files = {"config.json": config}
        if post is not None:
            files["tokenizer.json"] = {"added_tokens": ADDED, "post_processor": post or None}
        if tokenizer_config is not None:
            files["tokenizer_config.json"] = tokenizer_config
        with tempfile.TemporaryDirectory() as folder:
            for file, content in files.items():
                json.dump(content, open(os.path.join(folder, file), "w"))
            found = gguf.SpecialVocab(folder, n_vocab=len(ADDED)).special_token_ids
        expected = [[SPECIAL_KEYS[t], i] for t, i in found.items() if t in SPECIAL_KEYS]
        cases.append({"name": name, "tokenizer": tokenizer_file, "vocab_size": len(ADDED), "files": files,
                      "expected": expected})
    path = os.path.join(OUT, "special_ids.json")
    json.dump({"gguf": importlib.metadata.version("gguf"), "cases": cases},
              open(path, "w"), indent=1)
    print(f"{path}: {len(cases)} cases")


def main():
    torch.manual_seed(0)
    os.makedirs(OUT, exist_ok=True)
    for name, case in CASES.items():
        write_case(name, *case)
    write_special_ids()


if __name__ == "__main__":
    main()
