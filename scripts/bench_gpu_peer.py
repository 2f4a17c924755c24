"""The peer on the same GPU as tests/gpu/bench_gpu.cpp (scripts/bench_gpu runs both, one after the other):
transformers + peft with the training shape of each of our configs.

For each CONFIG.yaml: its model folder's config.json with random weights (transformers' own init) in bf16 (no
INT8 base: bf16 is the faster of the two for transformers, and what a user picks when the model fits); LoRA (bf16,
as peft makes it over a bf16 model) from the config's lora block (r, lora_alpha, lora_dropout, target_modules) through peft; attention through PyTorch's SDPA
(its flash kernel); gradient checkpointing where the config says activation_checkpointing: per_layer; fused
torch AdamW on the adapters; random token ids, micro_batch_size x seq_len, grad_accum_steps micro-batches per
optimizer step. The first step is warm-up; tokens/s is from the median of the timed steps. One JSON line per
config; a config that cannot run (out of memory, say) gets a line with its error.

Usage: bench_gpu_peer.py STEPS CONFIG.yaml...
"""
import json
import os
import statistics
import sys
import time


def load_config(path):
    import yaml

    with open(path) as f:
        config = yaml.safe_load(f)
    config["model"] = os.path.join(os.path.dirname(os.path.abspath(path)), config["model"])
    return config


def peer_model(torch, config):
    import transformers
    from peft import LoraConfig, get_peft_model

    model_config = transformers.AutoConfig.from_pretrained(config["model"])
    model_config.use_cache = False
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(model_config, dtype=torch.bfloat16,
                                                              attn_implementation="sdpa")
    model.requires_grad_(False)
    if config.get("activation_checkpointing") == "per_layer":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = config["lora"]
    return get_peft_model(model, LoraConfig(r=lora["r"], lora_alpha=lora["lora_alpha"],
                                            lora_dropout=lora.get("lora_dropout", 0.0),
                                            target_modules=lora["target_modules"], task_type="CAUSAL_LM"))


def measure(torch, config_path, steps):
    config = load_config(config_path)
    torch.cuda.reset_peak_memory_stats()
    model = peer_model(torch, config)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=float(config["lr"]), fused=True)
    batch, seq, accum = config["micro_batch_size"], config["seq_len"], config.get("grad_accum_steps", 1)
    ids = torch.randint(model.config.vocab_size, (batch, seq), device="cuda")
    step_seconds = []
    for step in range(steps + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(accum):
            loss = model(input_ids=ids, labels=ids).loss / accum
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step > 0:
            step_seconds.append(time.perf_counter() - start)
    median_s = statistics.median(step_seconds)
    return {"config": config_path, "peer": "transformers + peft, bf16",
            "attention": "sdpa", "torch": torch.__version__, "steps": steps, "step_s": median_s,
            "tokens_per_s": batch * seq * accum / median_s,
            "trainable_params": sum(p.numel() for p in trainable),
            "peak_memory_bytes": torch.cuda.max_memory_allocated()}


def main():
    args = sys.argv[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_gpu_peer: PyTorch sees no CUDA GPU")
    steps = int(args[0])
    for config_path in args[1:]:
        try:
            row = measure(torch, config_path, steps)
        except Exception as error:  # one config's failure (e.g. out of memory) is that config's row
            row = {"config": config_path, "error": f"{type(error).__name__}: {error}"}
        torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
