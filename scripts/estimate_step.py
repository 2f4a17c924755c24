#!/usr/bin/env python3
"""Per-op time estimates of one LoRA training step on paper (no GPU needed).

Usage: scripts/estimate_step.py [MODEL_DIR] [--seq 2048] [--batch 1]
       (default configs/gpt-neox-20b: the headline config's architecture)

For each op of a GPT-NeoX layer stack (the shapes the memory planner plans:
micro batch x seq tokens, hidden C, MLP I, H heads of D, vocab V; LoRA r 16
on query_key_value; INT8 base; bf16 activations; per-layer activation
checkpointing, so a layer's forward runs again in backward), the FLOPs or bytes it must do or
move, divided by a datasheet peak times an efficiency assumed per kernel kind
(EFFICIENCY below). Three columns of engines:
  ours-today  attention as our f32-FMA flash kernel (CUDA cores), whose
              backward computes the scores in both its dK/dV and dQ kernels;
  ours-tc     attention on tensor cores (FA2-structured kernel or cuDNN SDPA);
  hf-bnb-fa2  transformers + bitsandbytes LLM.int8() + FlashAttention-2: the
              same FLOPs except that its checkpointing reruns each layer's
              whole forward, bnb's backward dequantises each whole weight to
              fp16 per call (CB.to(fp16) then mul_ by SCB / 127: 7 bytes a
              weight, where ours writes bf16 tiles: 3), and unfused
              elementwise ops move ~1.5x our bytes.
Ours reruns only what backward reads (CausalLM::forward_layer without out):
not dense_4h_to_h or the GELU, whose outputs only make the layer output, nor,
with the parallel residual, dense.
These are ESTIMATES, not measurements: scripts/bench_gpu measures on a GPU.
"""
import argparse
import json
import os

# Datasheet peaks (dense): bf16 tensor FLOP/s with f32 accumulate, int8 tensor
# OP/s, f32 FMA FLOP/s (CUDA cores), DRAM bytes/s.
GPUS = {
    "a100": dict(name="A100-SXM4-80GB", bf16=312e12, int8=624e12, f32=19.5e12, bw=2039e9),
    "h100": dict(name="H100-SXM5-80GB", bf16=989e12, int8=1979e12, f32=67e12, bw=3350e9),
    "4090": dict(name="RTX 4090", bf16=165.2e12, int8=660.6e12, f32=82.6e12, bw=1008e9),
}

# Fraction of the peak each kernel kind is assumed to reach on these shapes.
EFFICIENCY = {
    "gemm_bf16": 0.70,      # cuBLASLt, large bf16 GEMMs
    "gemm_int8": 0.60,      # cuBLASLt IMMA, large int8 GEMMs
    "gemm_int8_bnb": 0.45,  # bnb's int8 matmul path (extra layout/overhead per call)
    "attn_fwd_tc": 0.50,    # FA2-structured / cuDNN forward (FA2 reports 50-70% on A100)
    "attn_bwd_tc": 0.40,    # FA2-structured / cuDNN backward (35-50%)
    "attn_f32": 0.50,       # our f32-FMA flash kernel, of the f32 FMA peak
    "memory": 0.70,         # bandwidth-bound kernels, of DRAM bandwidth
}


ENGINES = ("ours-today", "ours-tc", "hf-bnb-fa2")


def forward_passes(cfg, engine):
    """How often each linear's forward runs in a step: twice where the
    checkpointed layer's recomputation needs its output, else once."""
    if engine == "hf-bnb-fa2":  # torch.utils.checkpoint reruns the layer's whole forward
        return {"query_key_value": 2, "dense": 2, "dense_h_to_4h": 2, "dense_4h_to_h": 2}
    parallel = cfg.get("use_parallel_residual", True)  # transformers' default for GPT-NeoX
    return {"query_key_value": 2, "dense": 1 if parallel else 2, "dense_h_to_4h": 2, "dense_4h_to_h": 1}


def input_gradient_layers(cfg, engine):
    """How many layers compute each linear's input gradient. The first layer's
    feeds only the frozen embedding: ours skips its input-side products
    (query_key_value's, and with the parallel residual dense_h_to_4h's);
    transformers computes them (PEFT's enable_input_require_grads, needed by
    its checkpointing)."""
    L = cfg["num_hidden_layers"]
    if engine == "hf-bnb-fa2":
        return {"query_key_value": L, "dense": L, "dense_h_to_4h": L, "dense_4h_to_h": L}
    parallel = cfg.get("use_parallel_residual", True)
    return {"query_key_value": L - 1, "dense": L, "dense_h_to_4h": L - 1 if parallel else L, "dense_4h_to_h": L}


def ops(cfg, seq, batch, engine, r=16):
    """(name, kind, flops, bytes) for one training step; bytes only for memory kinds."""
    C, I, H, L, V = (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"],
                     cfg["num_hidden_layers"], cfg["vocab_size"])
    D, N = C // H, seq * batch
    linears = {"query_key_value": (3 * C, C), "dense": (C, C), "dense_h_to_4h": (I, C), "dense_4h_to_h": (C, I)}
    passes = forward_passes(cfg, engine)
    dx_layers = input_gradient_layers(cfg, engine)
    unfused = 1.5 if engine == "hf-bnb-fa2" else 1.0  # the peer's elementwise passes move ~1.5x our bytes
    out = []
    for name, (O, K) in linears.items():
        flops = 2.0 * N * O * K
        out.append((f"{name} int8 forward", "gemm_int8", passes[name] * L * flops, 0))
        # LLM.int8() around the product: x read twice (outliers, codes), codes and
        # the int32 product written and read, out written (bf16).
        extra = N * K * 2 * 2 + N * K + N * O * 4 * 2 + N * O * 2
        out.append((f"{name} int8 quantise/outliers/epilogue", "memory", 0, unfused * passes[name] * L * extra))
        out.append((f"{name} backward dx (bf16)", "gemm_bf16", dx_layers[name] * flops, 0))
        dequantise_bytes = 7 if engine == "hf-bnb-fa2" else 3
        out.append((f"{name} weight dequantise for dx", "memory", 0, dx_layers[name] * O * K * dequantise_bytes))
    lora_flops = 2.0 * N * r * (C + 3 * C)
    out.append(("LoRA A/B forward, dx, dA, dB", "gemm_bf16", L * lora_flops * (passes["query_key_value"] + 2), 0))
    attn_fwd = 2.0 * batch * seq * seq * H * D  # causal: half of 4 T^2 H D
    out.append(("attention forward (twice), tensor cores", "attn_fwd_tc", 2 * L * attn_fwd, 0))
    out.append(("attention backward, tensor cores", "attn_bwd_tc", L * 2.5 * attn_fwd, 0))
    out.append(("attention forward (twice), f32 FMA", "attn_f32", 2 * L * attn_fwd, 0))
    # The f32 backward computes S = Q K^T and dP = dO V^T in both of its
    # kernels (dK/dV, then dQ: no atomics), 7 products against the tensor-core
    # backward's 5 (one pass, dQ added into an f32 workspace).
    out.append(("attention backward, f32 FMA (S and dP twice)", "attn_f32", L * 3.5 * attn_fwd, 0))
    # Elementwise per layer, bf16 [N, C]-sized passes: 2 layernorms (fwd: read,
    # write; bwd: read x, dout, write dx), rope on q, k and dropout on the LoRA
    # input (all rerun by a recomputation); gelu on [N, I] and the residual
    # adds (rerun only where dense_4h_to_h's forward is). Backward also
    # recomputes the gelu. Ours reads q, k and v in place from the fused qkv
    # output and writes dq, dk and dv into dqkv; transformers copies them out
    # (rotary's concatenation, the split) and back (the split's backward).
    nc, ni = N * C * 2, N * I * 2
    copy_bytes = 6 * nc if engine == "hf-bnb-fa2" else 0
    rerun_bytes = 2 * 2 * nc + 2 * 2 * (2 * nc / 3 * 2) + 2 * nc + copy_bytes
    output_bytes = 2 * ni + 3 * 2 * nc
    bwd_bytes = 2 * 3 * nc + 2 * (2 * nc) + 2 * ni + 3 * ni + 3 * 2 * nc + 2 * nc + copy_bytes
    fwd_bytes = 2 * rerun_bytes + passes["dense_4h_to_h"] * output_bytes
    out.append(("norms, rope, gelu, adds, dropout (peer: + q/k/v copies)", "memory", 0,
                unfused * L * (fwd_bytes + bwd_bytes)))
    out.append(("lm_head forward + dx (bf16)", "gemm_bf16", 2 * 2.0 * N * C * V, 0))
    out.append(("loss, embedding, AdamW (LoRA)", "memory", 0, unfused * (N * V * 4 * 2 + N * C * 2 * 2)))
    return out


def model_flops(cfg, seq, batch, r=16):
    """bench_gpu's MFU numerator: 2 FLOPs per weight and token forward, 2 for dx,
    2 more for a trained weight; causal attention 2 T H D per layer and token
    forward and twice that backward; recomputation not counted."""
    C, I, H, L, V = (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"],
                     cfg["num_hidden_layers"], cfg["vocab_size"])
    N = seq * batch
    frozen = L * (3 * C * C + C * C + 2 * C * I) + C * V
    lora = L * r * (C + 3 * C)
    attn = L * 2.0 * seq * C * 3  # per token: 2 T H D forward, 4 T H D backward (H D = C)
    return N * (4.0 * frozen + 6.0 * lora + attn)


def seconds(kind, flops, nbytes, gpu, engine):
    if kind == "memory":
        return nbytes / (gpu["bw"] * EFFICIENCY["memory"])
    if kind == "gemm_int8":
        eff = EFFICIENCY["gemm_int8_bnb" if engine == "hf-bnb-fa2" else "gemm_int8"]
        return flops / (gpu["int8"] * eff)
    if kind == "attn_f32":
        return flops / (gpu["f32"] * EFFICIENCY["attn_f32"])
    return flops / (gpu["bf16"] * EFFICIENCY[kind])


def uses(name, kind, engine):
    if kind == "attn_f32":
        return engine == "ours-today"
    if kind.startswith("attn_"):
        return engine != "ours-today"
    return True


def estimate(cfg, seq, batch, gpu):
    """{engine: [(op name, kind, amount, seconds)]}."""
    result = {}
    for engine in ENGINES:
        result[engine] = [(name, kind, flops or nbytes, seconds(kind, flops, nbytes, gpu, engine))
                          for name, kind, flops, nbytes in ops(cfg, seq, batch, engine) if uses(name, kind, engine)]
    return result


def print_per_op(details):
    """One row per op: its FLOPs (or bytes) for ours and the peer, and its ms
    on each GPU. Ours is ours-tc but for the f32-attention rows (ours-today's,
    which replace the tensor-core rows in that engine)."""
    ms = {key: {row[0]: row[3] * 1e3 for row in rows} for key, rows in details.items()}
    print("\nPer op (amount: FLOPs, or bytes for memory-bound ops; ms on each GPU, ours | peer):\n")
    print("| op | kind | ours: amount | peer: amount | " +
          " | ".join(f"{GPUS[g]['name']} ours | peer" for g in GPUS) + " |")
    print("|---|---|---:|---:|" + "---:|---:|" * len(GPUS))
    first = next(iter(GPUS))
    peer = {row[0]: row[2] for row in details[(first, "hf-bnb-fa2")]}
    ours = details[(first, "ours-tc")] + [row for row in details[(first, "ours-today")] if row[1] == "attn_f32"]
    for name, kind, amount, _ in ours:
        engine = "ours-today" if kind == "attn_f32" else "ours-tc"
        cells = [name, kind, f"{amount:.3e}", f"{peer[name]:.3e}" if name in peer else "-"]
        for g in GPUS:
            peer_ms = ms[(g, "hf-bnb-fa2")]
            cells += [f"{ms[(g, engine)][name]:.1f}", f"{peer_ms[name]:.1f}" if name in peer_ms else "-"]
        print("| " + " | ".join(cells) + " |")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", nargs="?", default=os.path.join(root, "configs", "gpt-neox-20b"))
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    with open(os.path.join(args.model_dir, "config.json")) as f:
        cfg = json.load(f)
    tokens = args.seq * args.batch
    mflops = model_flops(cfg, args.seq, args.batch)
    print(f"ESTIMATES (datasheet peaks x assumed efficiencies {EFFICIENCY}), not measurements;")
    print(f"{os.path.basename(args.model_dir)}, {args.batch} x {args.seq} tokens per micro-step, "
          f"model FLOPs {mflops:.3e}\n")
    print("| GPU | engine | step ms | attention share | tokens/s | MFU (bf16 peak) |")
    print("|---|---|---:|---:|---:|---:|")
    details = {}
    for key, gpu in GPUS.items():
        for engine, rows in estimate(cfg, args.seq, args.batch, gpu).items():
            total = sum(r[3] for r in rows)
            attn = sum(r[3] for r in rows if r[1].startswith("attn"))
            print(f"| {gpu['name']} | {engine} | {total * 1e3:.0f} | {100 * attn / total:.0f}% | "
                  f"{tokens / total:.0f} | {100 * mflops / total / gpu['bf16']:.0f}% |")
            details[(key, engine)] = rows
    print_per_op(details)


if __name__ == "__main__":
    main()
