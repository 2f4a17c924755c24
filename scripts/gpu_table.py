"""The summary tables of a scripts/gpu_run results folder, as Markdown.

Reads bench_int8.json (and bench_int8_baseline.json where present), bench_gpu.json and bench_gpu_peer.jsonl;
prints the INT8 ops per shape (TFLOP/s, and the forward against the bf16 GEMM of the same shape), the forward's
passes in milliseconds, and the training steps of ours beside the peer. A missing file is said, not guessed.

Usage: gpu_table.py RESULTS_DIR
"""
import json
import os
import re
import sys


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_jsonl(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    rows.append(json.loads(line))
    except OSError:
        pass
    return rows


def shape_of(op):
    match = re.search(r"\[(\d+),(\d+)\]->(\d+)", op)
    return match.group(0) if match else None


def int8_rows(report):
    """{shape: {kind: row}} from a bench_gpu --int8-only report."""
    shapes = {}
    for row in (report or {}).get("int8", []):
        shape = shape_of(row.get("op", ""))
        if not shape:
            continue
        op = row["op"]
        kind = ("bf16_fwd" if op.startswith("bf16 GEMM (cuBLASLt) x W^T") else
                "bf16_dx" if op.startswith("bf16 GEMM (cuBLASLt) dout W") else
                "int8_gemm" if op.startswith("int8 GEMM") else
                "fwd_lora" if "LoRA" in op else
                "fwd" if op.startswith("int8_linear_forward") else
                "bwd" if op.startswith("int8_linear_backward") else None)
        if kind:
            shapes.setdefault(shape, {})[kind] = row
    return shapes


def tflops(row):
    return f"{row['tflops']:.0f}" if row and "tflops" in row else "-"


def ratio(a, b):
    return f"{a['tflops'] / b['tflops']:.2f}x" if a and b and "tflops" in a and "tflops" in b else "-"


def print_int8(new, base):
    print(f"INT8 linear, TFLOP/s (2 N K O over the median time), {new.get('device', '?')}")
    print()
    print("| N x K -> O | bf16 GEMM | int8 GEMM i32 | INT8 fwd | fwd / bf16 | baseline fwd | fwd + bias + LoRA |"
          " INT8 bwd | bf16 dx GEMM | bwd / bf16 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base_rows = int8_rows(base)
    for shape, r in int8_rows(new).items():
        b = base_rows.get(shape, {})
        print(f"| {shape} | {tflops(r.get('bf16_fwd'))} | {tflops(r.get('int8_gemm'))} | {tflops(r.get('fwd'))} | "
              f"{ratio(r.get('fwd'), r.get('bf16_fwd'))} | {tflops(b.get('fwd'))} | {tflops(r.get('fwd_lora'))} | "
              f"{tflops(r.get('bwd'))} | {tflops(r.get('bf16_dx'))} | {ratio(r.get('bwd'), r.get('bf16_dx'))} |")
    print()
    for label, rows in (("this build", int8_rows(new)), ("baseline", base_rows)):
        for shape, r in rows.items():
            for kind in ("fwd", "fwd_lora", "bwd"):
                row = r.get(kind)
                if row and "passes_ms" in row:
                    passes = ", ".join(f"{name} {ms:.3f}" for name, ms in row["passes_ms"].items())
                    print(f"- {label}, {row['op']}: {row['ms']:.3f} ms = {passes}")
    print()


def print_training(ours, peers):
    print("| config | ours tokens/s | MFU | ours peak GB | peer tokens/s | peer peak GB | ours / peer |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    by_config = {os.path.basename(p.get("config", "")): p for p in peers}
    for row in (ours or {}).get("training", []):
        name = os.path.basename(row.get("config", ""))
        if "error" in row:
            print(f"| {name} | error: {row['error'][:100]} | | | | | |")
            continue
        peer = by_config.get(name, {})
        cells = [name, f"{row['tokens_per_s']:.0f}", f"{row['mfu'] * 100:.0f}%",
                 f"{row['peak_memory_bytes'] / 1e9:.2f}"]
        if "tokens_per_s" in peer:
            cells += [f"{peer['tokens_per_s']:.0f}", f"{peer['peak_memory_bytes'] / 1e9:.2f}",
                      f"{row['tokens_per_s'] / peer['tokens_per_s']:.2f}x"]
        else:
            cells += [peer.get("error", "not measured")[:100], "-", "-"]
        print("| " + " | ".join(cells) + " |")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    new = load_json(os.path.join(out, "bench_int8.json"))
    if new is None:
        print("(no bench_int8.json)")
    else:
        print_int8(new, load_json(os.path.join(out, "bench_int8_baseline.json")))
    ours = load_json(os.path.join(out, "bench_gpu.json"))
    if ours is None:
        print("(no bench_gpu.json)")
    else:
        print_training(ours, load_jsonl(os.path.join(out, "bench_gpu_peer.jsonl")))


if __name__ == "__main__":
    main()
