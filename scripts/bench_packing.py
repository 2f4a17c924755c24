#!/usr/bin/env python3
"""Padded against padding-free packed training on a realistic length spread.

bench_packing.py FINETUNE ROOT WORKDIR OUTPUT.json STEPS WARMUP ROUNDS [DOCS_PAGE]
(run by scripts/bench_cpu --packing, which builds finetune first).

The data: 4,000 text rows whose token lengths follow a log-normal with median
~150 tokens and a tail to 2,000 (sigma 1.0, clipped to [8, 2000]), as
instruction sets such as Alpaca spread; the words come from the default
data's dialogues, so the tokenizer splits them as it splits real text. The
model: configs/tiny-base's shape (Llama, hidden 192, 4 layers, GQA 6/2) with
max_position_embeddings 2048 and random weights, LoRA on q/v, INT8 base, fp32:
the default config otherwise. Both runs use seq_len 2048 and micro_batch_size 8:
padded (data.packing: false; each micro-batch is cut to its longest row, as
dynamic padding does) and padding_free. Reported per run over the steps after
WARMUP: useful tokens/s (tokens that carry loss: every token of a text row
but its first), the packing efficiency (useful / computed tokens) and the
ratio of the two runs' useful tokens/s; ROUNDS runs of each, alternately, the median reported.
"""
import datetime
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys

TOKENS_PER_WORD = 1.7  # the tiny-base tokenizer on the dialogue text: 30,261 tokens for 17,704 words (300 rows)
SEQ_LEN = 2048
MICRO_BATCH = 8  # the default config's


def words_of_default_data(root):
    words = []
    with open(os.path.join(root, "configs", "data", "pretrain.jsonl")) as f:
        for line in f:
            words.extend(re.findall(r"\S+", json.loads(line)["text"]))
            if len(words) > 200_000:
                break
    return words


def write_data(root, path, rows=4000):
    rng = random.Random(7)
    words = words_of_default_data(root)
    lengths = []
    with open(path, "w") as f:
        for _ in range(rows):
            tokens = int(min(2000, max(8, rng.lognormvariate(math.log(150), 1.0))))
            count = max(2, round(tokens / TOKENS_PER_WORD))
            start = rng.randrange(len(words) - count)
            f.write(json.dumps({"text": " ".join(words[start:start + count])}) + "\n")
            lengths.append(tokens)
    lengths.sort()
    return {"rows": rows, "target_median_tokens": lengths[rows // 2], "target_max_tokens": lengths[-1]}


def write_model(root, model_dir):
    os.makedirs(model_dir, exist_ok=True)
    config = json.load(open(os.path.join(root, "configs", "tiny-base", "config.json")))
    config["max_position_embeddings"] = SEQ_LEN
    json.dump(config, open(os.path.join(model_dir, "config.json"), "w"), indent=2)
    shutil.copy(os.path.join(root, "configs", "tiny-base", "tokenizer.model"), model_dir)


def run(finetune, root, workdir, data, packing, steps):
    out = os.path.join(workdir, "run_" + packing)
    shutil.rmtree(out, ignore_errors=True)
    command = [finetune, os.path.join(root, "configs", "default.yaml"),
               "--set", f"model={os.path.join(workdir, 'model')}", "--set", "init=random",
               "--set", f"data.train={data}", "--set", 'data.eval=""', "--set", f"data.packing={packing}",
               "--set", f"seq_len={SEQ_LEN}", "--set", f"micro_batch_size={MICRO_BATCH}",
               "--set", f"max_steps={steps}", "--set", "save_every=0", "--set", "task_metric=none",
               "--set", "generate.num_samples=0", "--set", f"output_dir={out}"]
    printed = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    summary = re.search(r"train: (\d+) examples, (\d+) loss tokens", printed)
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in line]
    return rows, {"examples": int(summary.group(1)), "loss_tokens": int(summary.group(2))}


def figures_of(rows, warmup):
    """One run's throughput: the timed steps' totals (padded steps differ in size, so a rate per step would
    weigh a short step like a long one)."""
    timed = rows[warmup:]
    useful = sum(row["loss_tokens"] for row in timed)
    computed = sum(row["tokens"] for row in timed)
    seconds = sum(row["step_s"] for row in timed)
    return {"useful_tokens_per_s": useful / seconds, "computed_tokens_per_s": computed / seconds,
            "packing_efficiency": useful / computed, "step_s": seconds / len(timed), "steps": len(timed),
            "peak_memory_bytes": rows[-1]["peak_memory_bytes"]}


def median_run(runs):
    """The run whose useful tokens/s is the median of the rounds'."""
    return sorted(runs, key=lambda f: f["useful_tokens_per_s"])[len(runs) // 2]


def main(finetune, root, workdir, output, steps, warmup, rounds, docs):
    os.makedirs(workdir, exist_ok=True)
    data = os.path.join(workdir, "train.jsonl")
    spread = write_data(root, data)
    write_model(root, os.path.join(workdir, "model"))
    figures = {"seq_len": SEQ_LEN, "micro_batch_size": MICRO_BATCH, "warmup_steps": warmup, "rounds": rounds,
               "data": spread}
    runs = {"padded": [], "padding_free": []}
    for _ in range(rounds):  # alternately, so a slower spell of the machine hits both
        for name, packing in (("padded", "false"), ("padding_free", "padding_free")):
            rows, summary = run(finetune, root, workdir, data, packing, steps)
            figures["data"]["mean_tokens"] = summary["loss_tokens"] / summary["examples"] + 1
            runs[name].append(figures_of(rows, warmup))
    for name, measured in runs.items():
        figures[name] = median_run(measured)
        figures[name]["rounds_useful_tokens_per_s"] = [f["useful_tokens_per_s"] for f in measured]
    ratio = figures["padding_free"]["useful_tokens_per_s"] / figures["padded"]["useful_tokens_per_s"]
    figures["speedup"] = ratio
    json.dump(figures, open(output, "w"), indent=2)
    for name in ("padded", "padding_free"):
        f = figures[name]
        print(f"{name}: {f['useful_tokens_per_s']:.0f} useful tokens/s, efficiency {f['packing_efficiency']:.1%}, "
              f"{f['step_s']:.2f} s/step")
    print(f"padding_free / padded useful tokens/s: {ratio:.2f}x")
    print(f"written: {output}")
    if docs:
        sys.path.insert(0, os.path.join(root, "scripts"))
        import docs_table
        from bench_cpu_vs_torch import machine
        threads = os.environ.get("OMP_NUM_THREADS", "unset")
        lines = [f"`scripts/bench_cpu --packing {steps - warmup} {warmup} {rounds}` on {machine()} (OMP_NUM_THREADS {threads}), "
                 f"{datetime.date.today().isoformat()}: {spread['rows']:,} text rows, median "
                 f"{spread['target_median_tokens']} and longest {spread['target_max_tokens']:,} tokens drawn "
                 f"(mean {figures['data']['mean_tokens']:.0f} as tokenized), seq_len {SEQ_LEN}, micro_batch_size "
                 f"{MICRO_BATCH}; each run's totals over {figures['padded']['steps']} steps after {warmup} of warm-up, "
                 f"the median of {rounds} runs each, run alternately:", "",
                 "| data.packing | useful tokens/s | packing efficiency | s/step | peak tracked memory |",
                 "|---|---:|---:|---:|---:|"]
        for name, label in (("padded", "`false` (padded to each micro-batch's longest row)"),
                            ("padding_free", "`padding_free`")):
            f = figures[name]
            lines.append(docs_table.table_row([label, f"{f['useful_tokens_per_s']:,.0f}",
                                               f"{f['packing_efficiency']:.1%}", f"{f['step_s']:.2f}",
                                               f"{f['peak_memory_bytes'] / 2**20:,.1f} MiB"]))
        lines += ["", f"Padding-free packing: **{ratio:.2f}x** the useful tokens/s of padded rows."]
        docs_table.replace_section(docs, "bench_packing", "\n".join(lines))
        print(f"written: {docs} (bench_packing)")


if __name__ == "__main__":
    a = sys.argv[1:]
    main(os.path.abspath(a[0]), os.path.abspath(a[1]), os.path.abspath(a[2]), os.path.abspath(a[3]), int(a[4]),
         int(a[5]), int(a[6]), a[7] if len(a) > 7 else "")
