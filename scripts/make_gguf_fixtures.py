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

    python3 scripts/make_gguf_fixtures.py
"""
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


def add_vocab(writer, tokenizer_path, vocab_size):
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
        ids = {"bos": sp.bos_id(), "eos": sp.eos_id(), "unk": sp.unk_id(), "pad": sp.pad_id()}
        for key, value in ids.items():
            if value >= 0:
                getattr(writer, f"add_{key}_token_id")(value)
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
    if tok.bos_token_id is not None:
        writer.add_bos_token_id(tok.bos_token_id)
    writer.add_eos_token_id(tok.eos_token_id)
    if tok.pad_token_id is not None:
        writer.add_pad_token_id(tok.pad_token_id)
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
    add_vocab(writer, os.path.join(FIXTURES, tokenizer), config["vocab_size"])
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


def main():
    torch.manual_seed(0)
    os.makedirs(OUT, exist_ok=True)
    for name, case in CASES.items():
        write_case(name, *case)


if __name__ == "__main__":
    main()
