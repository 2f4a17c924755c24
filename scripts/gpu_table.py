"""The summary tables of a scripts/gpu_run results folder, as Markdown.

Reads bench_int8.json (and bench_int8_baseline.json where present), bench_gpu.json and bench_gpu_peer.jsonl;
prints the INT8 ops per shape (TFLOP/s, and the forward against the bf16 GEMM of the same shape), the forward's
passes in milliseconds, and the training steps of ours beside the peer. A missing file is said, not guessed.

Usage: gpu_table.py RESULTS_DIR [--docs]
  --docs: also write the training table into docs/performance.md, in the section of the card it ran
  on (<!-- gpu_training_h200:begin --> ... for an H200; scripts/docs_table.py), with a caption
  naming the card, the day bench_gpu.json was written and the steps.
"""
import datetime
import json
import os
import re
import sys

import docs_table


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
                "fused_lora" if "fused" in op and "LoRA" in op else
                "fused" if "fused" in op else
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
          " fused fwd (CUTLASS) | fused / bf16 | fused + bias + LoRA | INT8 bwd | bf16 dx GEMM | bwd / bf16 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base_rows = int8_rows(base)
    for shape, r in int8_rows(new).items():
        b = base_rows.get(shape, {})
        print(f"| {shape} | {tflops(r.get('bf16_fwd'))} | {tflops(r.get('int8_gemm'))} | {tflops(r.get('fwd'))} | "
              f"{ratio(r.get('fwd'), r.get('bf16_fwd'))} | {tflops(b.get('fwd'))} | {tflops(r.get('fwd_lora'))} | "
              f"{tflops(r.get('fused'))} | {ratio(r.get('fused'), r.get('bf16_fwd'))} | "
              f"{tflops(r.get('fused_lora'))} | "
              f"{tflops(r.get('bwd'))} | {tflops(r.get('bf16_dx'))} | {ratio(r.get('bwd'), r.get('bf16_dx'))} |")
    print()
    for label, rows in (("this build", int8_rows(new)), ("baseline", base_rows)):
        for shape, r in rows.items():
            for kind in ("fwd", "fwd_lora", "fused", "fused_lora", "bwd"):
                row = r.get(kind)
                if row and "passes_ms" in row:
                    passes = ", ".join(f"{name} {ms:.3f}" for name, ms in row["passes_ms"].items())
                    print(f"- {label}, {row['op']}: {row['ms']:.3f} ms = {passes}")
    print()


def training_table(ours, peers):
    """The training steps of ours beside the peer, as Markdown lines."""
    lines = ["| config | ours tokens/s | MFU | ours peak GB | peer tokens/s | peer peak GB | ours / peer |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    by_config = {os.path.basename(p.get("config", "")): p for p in peers}
    for row in (ours or {}).get("training", []):
        name = os.path.basename(row.get("config", ""))
        if "error" in row:
            lines.append(f"| {name} | error: {row['error'][:100]} | | | | | |")
            continue
        peer = by_config.get(name, {})
        cells = [name, f"{row['tokens_per_s']:.0f}", f"{row['mfu'] * 100:.0f}%",
                 f"{row['peak_memory_bytes'] / 1e9:.2f}"]
        if "tokens_per_s" in peer:
            cells += [f"{peer['tokens_per_s']:.0f}", f"{peer['peak_memory_bytes'] / 1e9:.2f}",
                      f"{row['tokens_per_s'] / peer['tokens_per_s']:.2f}x"]
        else:
            cells += [peer.get("error", "not measured")[:100], "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def print_training(ours, peers):
    print("\n".join(training_table(ours, peers)))


def card_name(device):
    """'NVIDIA H100 80GB HBM3' -> 'h100': the docs section's suffix."""
    match = re.search(r"[A-Za-z]*\d+", device.replace("NVIDIA", ""))
    return match.group(0).lower() if match else "gpu"


def write_training_docs(ours_path, peers, source, page=docs_table.PERFORMANCE_PAGE):
    """Writes the training table of ours_path (a bench_gpu.json) beside the peer's rows into the
    page's gpu_training_<card> section."""
    ours = load_json(ours_path)
    if ours is None:
        sys.exit(f"gpu_table: no {ours_path} to write into {page}")
    device = ours.get("device", "an unnamed GPU")
    day = datetime.date.fromtimestamp(os.path.getmtime(ours_path)).isoformat()
    steps = sorted({row["steps"] for row in ours.get("training", []) if "steps" in row})
    counted = f"median of {'/'.join(map(str, steps))} steps after one warm-up" if steps else "no step measured"
    peer = "the peer, `scripts/bench_gpu_peer.py`, in the same run" if peers else "no peer measured"
    caption = f"Measured on {device}, {day} (`{source}`: {counted}; {peer}):"
    name = f"gpu_training_{card_name(device)}"
    docs_table.replace_section(page, name, caption + "\n\n" + "\n".join(training_table(ours, peers)))
    print(f"written: {os.path.relpath(page)} ({name})")


def main():
    args = [arg for arg in sys.argv[1:] if arg != "--docs"]
    if len(args) != 1:
        sys.exit(__doc__)
    out = args[0]
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
    if "--docs" in sys.argv[1:]:
        write_training_docs(os.path.join(out, "bench_gpu.json"), load_jsonl(os.path.join(out, "bench_gpu_peer.jsonl")),
                            "scripts/gpu_run")


if __name__ == "__main__":
    main()
