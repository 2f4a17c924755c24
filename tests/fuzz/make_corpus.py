#!/usr/bin/env python3
"""Builds the fuzzers' seed corpora, tests/fuzz/corpus/<harness>/, from the
committed fixtures and configs (stdlib only). The output is committed; rerun
after a fixture changes. Seeds are kept small: fuzzers mutate small inputs
faster, and the replay tests run every seed."""
import json
import pathlib
import shutil
import struct

root = pathlib.Path(__file__).resolve().parents[2]
corpus = root / "tests" / "fuzz" / "corpus"


def seed(harness, name, data):
    folder = corpus / harness
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, raw bytes)] -> file bytes."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def f32(values):
    return struct.pack(f"<{len(values)}f", *values)


def bf16(values):
    return b"".join(struct.pack("<f", v)[2:] for v in values)


M64 = (1 << 64) - 1


class Checksum:
    """model/checksum.cpp's Checksum, so a seed train state passes its check."""

    def __init__(self):
        self.data = b""

    def add(self, data):
        self.data += data

    def add_text(self, text):
        self.add(struct.pack("<Q", len(text.encode())) + text.encode())

    def hex(self):
        def mix(state, word):
            x = state ^ (word * 0xC2B2AE3D27D4EB4F & M64)
            return (((x << 31) | (x >> 33)) & M64) * 0x9E3779B185EBCA87 & M64
        state, whole = 0x9E3779B97F4A7C15, len(self.data) // 8 * 8
        for i in range(0, whole, 8):
            state = mix(state, struct.unpack_from("<Q", self.data, i)[0])
        h = mix(state ^ len(self.data), int.from_bytes(self.data[whole:].ljust(8, b"\0"), "little"))
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & M64
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & M64
        return "%016x" % (h ^ (h >> 31))


def safetensors_checksum(tensors, metadata):
    """model/safetensors.cpp's safetensors_checksum over the same contents."""
    checksum = Checksum()
    for key in sorted(metadata):
        checksum.add_text(key)
        checksum.add_text(metadata[key])
    names = {"F32": "f32", "BF16": "bf16"}
    for name, dtype, shape, raw in sorted(tensors):
        checksum.add_text(name)
        checksum.add_text(names[dtype])
        checksum.add_text("[" + ", ".join(str(d) for d in shape) + "]")
        checksum.add(raw)
    return checksum.hex()


def main():
    shutil.rmtree(corpus, ignore_errors=True)

    seed("fuzz_safetensors", "mixed_dtypes", safetensors([
        ("a", "F32", [2, 2], f32([1, -2, 0.5, 3])),
        ("b", "BF16", [3], bf16([1, 2, -4])),
        ("c", "F16", [2], struct.pack("<2e", 0.25, -8)),
        ("d", "I8", [4], bytes([1, 255, 127, 128])),
        ("e", "I32", [1], struct.pack("<i", -7)),
        ("empty", "F32", [0, 3], b""),
    ], {"format": "pt"}))
    seed("fuzz_safetensors", "lora_adapter", (root / "tests/fixtures/llama_lora/adapter/adapter_model.safetensors").read_bytes())
    seed("fuzz_safetensors", "empty_header", safetensors([]))

    for config in sorted(root.glob("tests/fixtures/*/config.json")) + sorted(root.glob("configs/*/config.json")):
        seed("fuzz_model_config", config.parent.name, config.read_bytes())

    for config in sorted(root.glob("configs/*.yaml")):
        seed("fuzz_train_config", config.stem, config.read_bytes())
    # PEFT's module selection keys, which no shipped config sets.
    seed("fuzz_train_config", "module_selection",
         "model: m\ndata: {train: t.jsonl}\nlora:\n  target_modules: [q_proj, v_proj]\n"
         "  exclude_modules: '.*\\.layers\\.0\\..*'\n  layers_to_transform: [1, 3]\n  layers_pattern: [h, layers]\n")

    for data in sorted(root.glob("configs/data/*.jsonl")):
        lines = data.read_text().splitlines(keepends=True)
        seed("fuzz_jsonl", data.stem, "".join(line[:400] + ("\n" if len(line) > 400 else "") for line in lines[:3]))
    seed("fuzz_jsonl", "mixed_rows", '{"prompt": "a", "completion": "b"}\n\n{"text": "x"}\n{"prompt": 1}\n')
    seed("fuzz_jsonl", "alpaca_rows",
         '{"instruction": "Name a colour.", "output": "Blue"}\n'
         '{"instruction": "Translate.", "input": "Hi", "output": "Salut"}\n'
         '{"instruction": "x", "input": 3, "output": "y"}\n')
    seed("fuzz_jsonl", "chat_rows",
         '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, '
         '{"role": "assistant", "content": "Hello"}]}\n'
         '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, '
         '{"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}\n'
         '{"messages": []}\n'
         '{"messages": [{"role": "tool", "content": 1}]}\n')
    call = '{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}'
    seed("fuzz_jsonl", "tool_rows",
         '{"tools": [{"type": "function", "function": {"name": "f"}}], "messages": [{"role": "user", "content": "q"}, '
         + call + ', {"role": "tool", "name": "f", "content": "2"}, {"role": "assistant", "content": "a"}]}\n'
         '{"messages": [{"role": "user", "content": "q"}, ' + call + ']}\n'
         '{"messages": [{"role": "tool"}, {"role": "assistant", "tool_calls": [{"function": 1}]}], "tools": 3}\n')

    for config in sorted((root / "tests/fixtures/chat").glob("*/tokenizer_config.json")):
        seed("fuzz_chat_template", config.parent.name, json.loads(config.read_text())["chat_template"])
    seed("fuzz_chat_template", "formatting",
         "{% with n = messages | length %}{{ '%-4s|%05.1f|%(k)s' % ('a', n) }}{% endwith %}"
         "{% filter upper %}{{ 'x' | center(5) }}{{ 1e3 }}{% endfilter %}"
         "{% for m in messages %}{{ loop.cycle('A', 'B') }}{{ m.content | format() }}{% endfor %}")
    seed("fuzz_tokenizer", "bpe_fixture", (root / "tests/fixtures/bpe_tokenizer/tokenizer.json").read_bytes())

    # Two small models with their own character maps, byte fallback and a denormalizer
    # (scripts/make_sentencepiece_fixtures.py). Not the 244 KB tests/fixtures/tokenizer model:
    # inputs that size run about 100 times a second instead of thousands (nmt_nfkc's map takes
    # the same checks as theirs; tests/test_hardening.cpp patches that model instead).
    for model in ("bpe_rules", "unigram_bytes"):
        seed("fuzz_sentencepiece", model, (root / "tests/fixtures/sentencepiece" / model / "tokenizer.model").read_bytes())

    for fixture in ("llama_lora", "gpt_neox_lora", "module_selection/regex", "module_selection/layers"):
        adapter = root / "tests/fixtures" / fixture / "adapter"
        config = (adapter / "adapter_config.json").read_bytes()
        seed("fuzz_peft_adapter", fixture.replace("/", "_"),
             struct.pack("<I", len(config)) + config + (adapter / "adapter_model.safetensors").read_bytes())

    state = []
    for prefix in ("param.", "adam_m.", "adam_v."):
        state.append((prefix + "w", "F32", [2, 3], f32([0.5, -1, 2, 0, 0.25, 3])))
        state.append((prefix + "b", "F32", [3], f32([1, 2, 3])))
    metadata = {"format": "finetune-train-state-2", "step": "5", "optimizer_steps": "5", "data_epoch": "1",
                "data_index": "2", "identity.data.train": "12 bytes, checksum 0123456789abcdef"}
    metadata["checksum"] = safetensors_checksum(state, metadata)
    seed("fuzz_train_state", "two_parameters", safetensors(state, metadata))


if __name__ == "__main__":
    main()
