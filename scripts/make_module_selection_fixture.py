#!/usr/bin/env python3
"""module_selection fixture: which modules PEFT's LoraConfig adapts.

PEFT picks the modules LoRA adapts from target_modules (a list of names, each
matching a module so called or ending in "." + it; or one string, a regular
expression the whole module name must match), exclude_modules (the same two
forms, checked first), and layers_to_transform with layers_pattern (the layer
index read from the module name). tests/fixtures/module_selection/ holds:
  - cases.json: Python's re.fullmatch and PEFT's layer index on some names;
    and for a 12-layer Llama, a 12-layer GPT-NeoX and a T5 (3 encoder, 2
    decoder layers), each model's config.json and, per LoraConfig tried, the
    full names of the modules PEFT's get_peft_model adapted, or the error it
    raised (its type and message, sets sorted); and for those models, a
    2-layer Llama with a tied head and a T5 v1.0 (tied), every module's name,
    its type and what get_peft_model does given that name alone as the
    pattern (layers and blocks past the second left out: they repeat);
  - regex/ and layers/: two PEFT adapters on tests/fixtures/llama_gqa (a
    string target_modules; a list narrowed by layers_to_transform,
    layers_pattern and exclude_modules), lora_B set to seeded noise, each with
    reference.safetensors: input_ids, labels, logits, loss and the gradient of
    every adapter tensor (grad.<saved name>), float32, checked against a
    float64 run of the same model.
Needs torch, transformers, peft and safetensors (CPU is enough);
tests/test_module_selection.cpp reads the result.
"""
import json
import os
import re
import sys

import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import LORA, lora_reference, make_peft_model, save_adapter  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
SEED = 47
ATTN = ["q_proj", "v_proj"]

# (model, its fixture, layers to build it with or None, LoraConfig fields beyond r and lora_alpha)
CASES = [
    ("llama", "llama_gqa", 12, [
        dict(target_modules=r".*\.layers\.1\d?\.self_attn\.(q|v)_proj"),
        dict(target_modules="q_proj"),  # a string is a regular expression over the full name: matches nothing
        dict(target_modules="all-linear", exclude_modules=["o_proj", "model.layers.0.mlp.down_proj"]),
        dict(target_modules=ATTN, layers_to_transform=3),
        dict(target_modules=ATTN, layers_to_transform=[0, 11], layers_pattern="layers"),
        dict(target_modules=ATTN, layers_to_transform=[1], layers_pattern=["h", "layers"]),
        dict(target_modules=ATTN, layers_to_transform=[2], layers_pattern="h"),
        dict(target_modules=ATTN, layers_to_transform=[1], layers_pattern=""),
        dict(target_modules=ATTN, layers_to_transform=[]),
        dict(target_modules=["q_proj", "down_proj"], exclude_modules=r".*\.layers\.[0-5]\..*"),
        dict(target_modules=["self_attn.q_proj", "mlp.up_proj"], exclude_modules=["layers.1.self_attn.q_proj"]),
        dict(target_modules=ATTN, exclude_modules=""),
        dict(target_modules=["q_proj"], exclude_modules=["q_proj"]),
        dict(target_modules=r".*q_proj", layers_to_transform=[1]),
        dict(target_modules=ATTN, layers_pattern="layers"),
        dict(target_modules=["q_proj", "w1"]),  # a name that matches no module is skipped
        dict(target_modules="all-linear", layers_to_transform=[5, 6]),
        dict(target_modules=["model.layers.0.self_attn.q_proj", "v_proj"], layers_to_transform=[1]),  # a full name
    ]),
    ("gpt_neox", "gpt_neox_sequential", 12, [
        dict(target_modules=["query_key_value", "dense_4h_to_h"], layers_to_transform=[10]),
        dict(target_modules=r"gpt_neox\.layers\.\d+\.attention\.dense"),
        dict(target_modules="all-linear", exclude_modules=r".*mlp.*"),
        dict(target_modules=["dense"], layers_to_transform=[1, 11], layers_pattern="layers"),
    ]),
    ("t5", "t5_v1_1", None, [
        dict(target_modules=["q", "v"], layers_to_transform=[1]),
        dict(target_modules=["q", "v"], layers_to_transform=[1], layers_pattern="layer"),
        dict(target_modules=r"decoder\..*\.(q|v)"),
        dict(target_modules=["q", "k", "v", "o", "wi_0", "wi_1", "wo"],
             exclude_modules=["EncDecAttention.q", "EncDecAttention.k"]),
        dict(target_modules="all-linear", layers_to_transform=[0]),
    ]),
]

# Models whose every module (past their second layer or block, which repeat) is tried alone as the
# pattern: target_modules=re.escape(name).
SINGLE_MODULES = [
    ("llama", "llama_gqa", 12),
    ("llama_tied", "llama_tied", None),
    ("gpt_neox", "gpt_neox_sequential", 12),
    ("t5_v1_0", "t5_v1_0", None),
    ("t5_v1_1", "t5_v1_1", None),
]

# The two adapters with reference values, on the 2-layer llama_gqa.
ADAPTERS = {
    "regex": dict(target_modules=r"model\.layers\.1\.(self_attn\.(q|k)_proj|mlp\.down_proj)"),
    "layers": dict(target_modules=["q_proj", "v_proj", "up_proj"], layers_to_transform=[1], layers_pattern="layers",
                   exclude_modules=["layers.1.self_attn.v_proj"]),
}


# Python's answers for the regular expressions PEFT applies: re.fullmatch for a string target_modules or
# exclude_modules, and the layer index layers_to_transform reads (check_target_module_exists' patterns).
FULLMATCH = [
    (r".*\.layers\.1\d?\.self_attn\.(q|v)_proj", "model.layers.11.self_attn.v_proj"),
    (r".*\.layers\.1\d?\.self_attn\.(q|v)_proj", "model.layers.2.self_attn.v_proj"),
    ("q_proj", "model.layers.0.self_attn.q_proj"),
    ("a|ab", "ab"),  # fullmatch backtracks into the second alternative
    (r".*proj$", "model.layers.0.self_attn.q_proj"),
    (r"model\.layers\.0\..*", "model.layers.0.mlp"),
    ("", "q"),
]
LAYER_INDEX = [
    ("model.layers.3.mlp.up_proj", []),
    ("model.layers.12.self_attn.q_proj", ["h", "layers"]),
    ("transformer.h.7.attn.c_attn", []),
    ("encoder.block.1.layer.0.SelfAttention.q", []),
    ("encoder.block.1.layer.0.SelfAttention.q", ["layer"]),
    ("model.layers.1.experts.0.w1", []),  # the first numbered segment, not the expert's
    ("model.layers.3.mlp.up_proj", ["h"]),
    ("lm_head", []),
    ("model.layers.3.mlp.up_proj", ["lay.rs"]),  # a pattern is a regular expression
    ("model.layers.03.mlp.up_proj", []),
]


def peft_layer_index(module, layers_pattern):
    """check_target_module_exists' index: -1 where it finds none."""
    patterns = [r".*?\.[^.]*\.(\d+)\."] if not layers_pattern else [rf".*?\.{p}\.(\d+)\." for p in layers_pattern]
    for pattern in patterns:
        match = re.match(pattern, module)
        if match is not None:
            return int(match.group(1))
    return -1


def model_config(fixture, layers):
    with open(os.path.join(FIXTURES, fixture, "config.json")) as f:
        config = json.load(f)
    if layers is not None:
        config["num_hidden_layers"] = layers
    return config


def adapted_modules(config, fields):
    """The modules get_peft_model adapts, or the error it raises."""
    hf_config = AutoConfig.for_model(**config)
    seq2seq = config["model_type"] == "t5"
    torch.manual_seed(0)
    base = (AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM).from_config(hf_config)
    try:
        lora = LoraConfig(r=4, lora_alpha=8, task_type="SEQ_2_SEQ_LM" if seq2seq else "CAUSAL_LM", **fields)
        model = get_peft_model(base, lora)
    except Exception as error:  # PEFT's ValueError (and subclasses): the case records it
        # A set in the message prints in the string hash's order: sorted, so each run writes the same bytes.
        message = re.sub(r"\{([^{}]*)\}", lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}", str(error))
        return {"error": f"{type(error).__name__}: {message}"}
    inner = model.base_model.model
    return {"adapted": sorted(n for n, m in inner.named_modules() if isinstance(m, LoraLayer))}


def single_modules(config):
    """[name, type, outcome] of each module: what get_peft_model does when the pattern is its name alone."""
    hf_config = AutoConfig.for_model(**config)
    auto = AutoModelForSeq2SeqLM if config["model_type"] == "t5" else AutoModelForCausalLM
    modules = [(n, type(m).__name__) for n, m in auto.from_config(hf_config).named_modules(remove_duplicate=False)
               if n and all(int(i) < 2 for i in re.findall(r"\.(\d+)(?=\.|$)", n))]
    outcomes = [adapted_modules(config, dict(target_modules=re.escape(n))) for n, _ in modules]
    # PEFT's refusal quotes the module's repr, many lines for a block: its first line says enough.
    outcomes = [{"error": o["error"].split("\n")[0][:120]} if "error" in o else o for o in outcomes]
    return [[n, t, o] for (n, t), o in zip(modules, outcomes)]


def make_cases(out_dir):
    models = []
    for name, fixture, layers, cases in CASES:
        config = model_config(fixture, layers)
        results = [dict(fields=fields, **adapted_modules(config, fields)) for fields in cases]
        for r in results:
            print(name, json.dumps(r["fields"]), "->", r.get("error") or f"{len(r['adapted'])} modules")
        models.append(dict(name=name, config=config, cases=results))
    singles = []
    for name, fixture, layers in SINGLE_MODULES:
        config = model_config(fixture, layers)
        singles.append(dict(name=name, config=config, modules=single_modules(config)))
        print(name, len(singles[-1]["modules"]), "single-module patterns")
    regexes = dict(fullmatch=[[p, m, re.fullmatch(p, m) is not None] for p, m in FULLMATCH],
                   layer_index=[[m, p, peft_layer_index(m, p)] for m, p in LAYER_INDEX])
    with open(os.path.join(out_dir, "cases.json"), "w") as f:
        f.write(json.dumps(dict(models=models, single_modules=singles, **regexes), indent=1) + "\n")


def make_adapter(out_dir, name, fields):
    base = AutoModelForCausalLM.from_pretrained(os.path.join(FIXTURES, "llama_gqa"), dtype=torch.float32,
                                                attn_implementation="eager")
    model, trainable = make_peft_model(base, dict(LORA, **fields), "llama_gqa", SEED)
    folder = os.path.join(out_dir, name)
    save_adapter(model, trainable, os.path.join(folder, "adapter"))
    ref = lora_reference(name, model)
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(folder, "reference.safetensors"))


def main():
    out_dir = os.path.join(FIXTURES, "module_selection")
    os.makedirs(out_dir, exist_ok=True)
    make_cases(out_dir)
    for name, fields in ADAPTERS.items():
        make_adapter(out_dir, name, fields)


if __name__ == "__main__":
    main()
