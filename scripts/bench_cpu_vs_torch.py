"""Our CPU trainer against PyTorch on the same machine (scripts/bench_cpu --vs-torch runs it).

Model: Llama, hidden 768, 12 layers, 12 heads, MLP 2048, vocab 32000 (134.4M parameters, lm_head untied),
frozen; LoRA r 8 (alpha 16, dropout 0.05) on q_proj and v_proj (DoRA under BENCH_CPU_DORA=1, in ours and
peft); batch 4 x 256 tokens of random ids (or BENCH_CPU_SHAPE=BxT, e.g. 1x1024); AdamW on the adapters; the same thread count everywhere. Every trainer runs
in its own process, alternately, ROUNDS times; each reports the median step time of its timed steps (after
WARMUP steps) and its peak resident memory (ru_maxrss). tokens/s = the positions a step computes over its time:
B * T for PyTorch; for ours each step's own count (its batch is cut after the last loss token; the data is
concatenated into windows, so that is B * T or close to it). Ours run with FT_PROFILE_OPS=1 (its cost, about
0.1 us an op call, is not measurable in a step): each op's share of the step and the kernel and ISA it ran on,
from the last round's op_profile.json. PyTorch's paths: its ATen dispatch ISA and which library (and oneDNN
kernel) runs its GEMM of each dtype. Then per-op GEMM GFLOP/s of ours (bench_cpu_gemm) against PyTorch's GEMMs at
2048^3 (f32, bf16, int8 via torch._int_mm) measured here.

  driver:    bench_cpu_vs_torch.py FINETUNE GEMM_BENCH WORK_DIR OUTPUT.json THREADS ROUNDS WARMUP STEPS [DOCS_PAGE]
             (DOCS_PAGE: also write the tokens/s and RSS table into that page's section for this CPU and
             shape, bench_cpu_vs_torch_avx512 or bench_cpu_vs_torch_avx2, then _as_avx2 under
             BENCH_CPU_AS_AVX2=1 (scripts/bench_cpu --avx2 sets it with the libraries' caps), then _1x1024
             for another shape than 4x256, then _dora under BENCH_CPU_DORA=1; scripts/docs_table.py)
  one torch: bench_cpu_vs_torch.py --torch {plain|peft} {fp32|bf16} THREADS WARMUP STEPS
  its paths: bench_cpu_vs_torch.py --torch-isa THREADS
"""
import ctypes
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

VOCAB, HIDDEN, LAYERS, HEADS, FFN, RANK, ALPHA, DROPOUT = 32000, 768, 12, 12, 2048, 8, 16, 0.05
DEFAULT_SHAPE = "4x256"
AS_AVX2 = os.environ.get("BENCH_CPU_AS_AVX2") == "1"  # scripts/bench_cpu --avx2: the caps are in the environment
DORA = os.environ.get("BENCH_CPU_DORA") == "1"  # scripts/bench_cpu --dora: DoRA in ours and in peft
SHAPE = os.environ.get("BENCH_CPU_SHAPE", DEFAULT_SHAPE)  # batch x sequence length; children inherit it
try:
    BATCH, SEQ = (int(n) for n in SHAPE.split("x"))
except ValueError:
    sys.exit(f"BENCH_CPU_SHAPE: expected BATCHxSEQ_LEN such as 1x1024, got {SHAPE!r}")
if not 1 <= SEQ <= 2048 or BATCH < 1:
    sys.exit(f"BENCH_CPU_SHAPE: {SHAPE!r}: batch >= 1 and a sequence of 1 to 2048 tokens (the model's positions)")
TOKENS_PER_STEP = BATCH * SEQ


# ---- PyTorch peers (run in a child process) ------------------------------------------------------

def plain_llama(torch, dtype):
    nn, F = torch.nn, torch.nn.functional

    class LoraLinear(nn.Module):
        def __init__(self, features):
            super().__init__()
            self.base = nn.Linear(features, features, bias=False).requires_grad_(False)
            self.A = nn.Parameter(torch.randn(RANK, features) / features ** 0.5)
            self.B = nn.Parameter(torch.zeros(features, RANK))
            self.drop = nn.Dropout(DROPOUT)

        def forward(self, x):
            return self.base(x) + (self.drop(x) @ self.A.t() @ self.B.t()) * (ALPHA / RANK)

    def frozen(i, o):
        return nn.Linear(i, o, bias=False).requires_grad_(False)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.mlp_norm = nn.RMSNorm(HIDDEN, eps=1e-5), nn.RMSNorm(HIDDEN, eps=1e-5)
            self.q, self.v = LoraLinear(HIDDEN), LoraLinear(HIDDEN)
            self.k, self.o = frozen(HIDDEN, HIDDEN), frozen(HIDDEN, HIDDEN)
            self.gate, self.up, self.down = frozen(HIDDEN, FFN), frozen(HIDDEN, FFN), frozen(FFN, HIDDEN)
            for norm in (self.attn_norm, self.mlp_norm):
                norm.requires_grad_(False)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            h = self.attn_norm(x)
            heads = lambda t: t.view(B, T, HEADS, HIDDEN // HEADS).transpose(1, 2)
            q, k, v = heads(self.q(h)), heads(self.k(h)), heads(self.v(h))
            rotate = lambda t: torch.cat((-t[..., t.shape[-1] // 2:], t[..., : t.shape[-1] // 2]), dim=-1)
            q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, HIDDEN)
            x = x + self.o(a)
            h = self.mlp_norm(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, HIDDEN).requires_grad_(False)
            self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
            self.norm = nn.RMSNorm(HIDDEN, eps=1e-5).requires_grad_(False)
            self.lm_head = frozen(HIDDEN, VOCAB)
            inv_freq = 1.0 / (10000.0 ** (torch.arange(0, HIDDEN // HEADS, 2).float() / (HIDDEN // HEADS)))
            angles = torch.outer(torch.arange(SEQ).float(), inv_freq)
            angles = torch.cat((angles, angles), dim=-1)
            self.register_buffer("cos", angles.cos())
            self.register_buffer("sin", angles.sin())

        def forward(self, ids, targets):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x, self.cos, self.sin)
            logits = self.lm_head(self.norm(x)).float()
            return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))

    return Llama().to(dtype)


def peft_llama(torch, dtype):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=2048,
                         tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(dtype)
    lora = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=DROPOUT, target_modules=["q_proj", "v_proj"],
                      use_dora=DORA)
    model = get_peft_model(model, lora)

    def step_loss(ids, targets):
        return model(input_ids=ids, labels=ids).loss

    model.step_loss = step_loss
    return model


def run_torch(kind, precision, threads, warmup, steps):
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = plain_llama(torch, dtype) if kind == "plain" else peft_llama(torch, dtype)
    loss_of = model if kind == "plain" else model.step_loss
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    targets = torch.roll(ids, -1, dims=1)
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        loss = loss_of(ids, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    print(json.dumps({"step_s": statistics.median(times)}))


def onednn_verbose_lines(torch, run):
    """The lines oneDNN's verbose mode prints (on the C library's stdout) while run() runs."""
    with tempfile.TemporaryFile() as log:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(log.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                run()
        finally:
            ctypes.CDLL(None).fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        return [line for line in log.read().decode().splitlines() if line.startswith("onednn_verbose")]


def run_torch_isa(threads):
    """PyTorch's CPU paths as JSON: the ISA its ATen kernels dispatch to, the CPU features it detects, and which
    library runs a GEMM of each dtype, read from oneDNN's verbose lines for one small product of each (none: not
    oneDNN, so MKL's where PyTorch links MKL)."""
    import torch
    torch.set_num_threads(threads)
    a, b = torch.randn(64, 256), torch.randn(256, 256)
    a8, b8 = (torch.randint(-127, 128, shape, dtype=torch.int8) for shape in ((64, 256), (256, 256)))
    products = {"f32": lambda: a @ b, "bf16": lambda: a.bfloat16() @ b.bfloat16(),
                "int8": lambda: torch._int_mm(a8, b8)}
    gemm, onednn_isa = {}, ""
    for dtype, product in products.items():
        gemm[dtype] = "not oneDNN (MKL build)" if torch.backends.mkl.is_available() else "not oneDNN"
        for line in onednn_verbose_lines(torch, product):
            fields = line.split(",")
            for field in fields:
                if field.startswith("isa:"):  # the info line: the ISA oneDNN dispatches to
                    onednn_isa = field[len("isa:"):]
            if "exec" in fields:  # ...,exec,cpu,<primitive>,<implementation (may be empty)>,...
                at = fields.index("exec")
                gemm[dtype] = f"oneDNN {fields[at + 2]} {fields[at + 3] or f'(on {onednn_isa})'}"
    features = {name: getattr(torch.cpu, f"_is_{name}_supported", lambda: None)()
                for name in ("avx512_bf16", "vnni", "amx_tile")}
    print(json.dumps({"version": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                      "mkldnn": torch.backends.mkldnn.is_available(), "features": features, "gemm": gemm}))


def torch_isa_line(isa):
    """One line naming PyTorch's paths (run_torch_isa's JSON)."""
    features = ", ".join(f"{name} {'yes' if present else 'no'}" for name, present in isa["features"].items()
                         if present is not None)
    gemms = ", ".join(f"{dtype} {path}" for dtype, path in isa["gemm"].items())
    return (f"PyTorch {isa['version']}: ATen kernels {isa['cpu_capability']} (get_cpu_capability); GEMMs: {gemms} "
            f"(int8: torch._int_mm); CPU features it sees: {features}")


# ---- the driver ----------------------------------------------------------------------------------

def child_rss(command, env, cwd):
    """stdout and the peak resident memory of this one child (wait4's rusage)."""
    process = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout = process.stdout.read()
    stderr = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} failed ({process.returncode}): {stderr.strip()[-2000:]}")
    return stdout, usage.ru_maxrss * 1024


def write_model(work_dir):
    """Our model folder: config.json at the benchmark shape and a byte-level tokenizer.json with VOCAB entries
    (random-initialised weights, init: random; the data's text only sets the batch shape)."""
    model_dir = os.path.join(work_dir, "model")
    os.makedirs(model_dir, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
              "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
              "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "max_position_embeddings": 2048,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
              "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    json.dump(config, open(os.path.join(model_dir, "config.json"), "w"), indent=1)
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = [], 0
    for byte in range(256):  # GPT-2's byte-to-unicode table
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    vocab = {ch: i for i, ch in enumerate(chars)}
    vocab.update({f"<unused{i}>": i for i in range(256, VOCAB)})
    tokenizer = {"version": "1.0", "added_tokens": [], "normalizer": None, "post_processor": None,
                 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                   "use_regex": True},
                 "decoder": {"type": "ByteLevel"},
                 "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                           "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                           "merges": []}}
    json.dump(tokenizer, open(os.path.join(model_dir, "tokenizer.json"), "w"))
    return model_dir


def run_ours(finetune, config, model_dir, work_dir, quant, precision, threads, warmup, steps):
    """The median over the timed steps of positions (tokens, padding included) per second, the peak RSS, and the
    op profile of the steps after the first (op_profile.json: op_profile_report.h)."""
    out_dir = os.path.join(work_dir, f"ours_{quant}_{precision}")
    command = [finetune, config, "--set", f"model={model_dir}", "--set", "init=random",
               "--set", f"tokenizer={model_dir}/tokenizer.json", "--set", f"lora.r={RANK}",
               "--set", f"lora.lora_alpha={ALPHA}", "--set", f"lora.lora_dropout={DROPOUT}",
               "--set", f"lora.use_dora={'true' if DORA else 'false'}",
               "--set", f"micro_batch_size={BATCH}", "--set", f"seq_len={SEQ}", "--set", "data.packing=concatenate",
               "--set", f"quantization.mode={quant}", "--set", f"precision={precision}", "--set", "device=cpu",
               "--set", f"max_steps={warmup + steps}", "--set", "log_every=1", "--set", "save_every=0",
               "--set", "task_metric=none", "--set", 'data.eval=""', "--set", "generate.num_samples=0",
               "--set", f"output_dir={out_dir}", "--overwrite"]  # each round starts afresh in the same folder
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), FT_PROFILE_OPS="1")
    _, rss = child_rss(command, env, work_dir)
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl")) if '"loss"' in line]
    # A step computes the positions it holds: a batch is trimmed after its last loss token, so a step can
    # hold fewer than B x T (concatenated windows rarely do). Its rate is those positions over its time.
    profile = json.load(open(os.path.join(out_dir, "op_profile.json")))
    return statistics.median(row["tokens"] / row["step_s"] for row in rows[warmup:]), rss, profile


def torch_gemm_peaks(threads):
    import torch
    torch.set_num_threads(threads)
    n, peaks = 2048, {}
    for name, make, mm in (
            ("f32", lambda: torch.randn(n, n), torch.matmul),
            ("bf16", lambda: torch.randn(n, n).to(torch.bfloat16), torch.matmul),
            ("int8", lambda: torch.randint(-127, 128, (n, n), dtype=torch.int8), torch._int_mm)):
        a, b = make(), make()
        mm(a, b)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            mm(a, b)
            times.append(time.perf_counter() - start)
        peaks[name] = 2.0 * n ** 3 / statistics.median(times) / 1e9
    return peaks


def main(finetune, gemm_bench, work_dir, output, threads, rounds, warmup, steps, docs=""):
    os.makedirs(work_dir, exist_ok=True)
    config = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "default.yaml")
    model_dir = write_model(work_dir)
    versions = {}  # for the docs table's caption
    try:
        import torch
        have_torch = True
        versions["PyTorch"] = torch.__version__
    except ImportError:
        have_torch = False
        print("PyTorch not importable (pip install torch): the PyTorch peers are skipped")
    try:
        import peft
        import transformers
        have_peft = have_torch
        versions.update(transformers=transformers.__version__, peft=peft.__version__)
    except ImportError:
        have_peft = False
        print("transformers + peft not importable (pip install transformers peft): that peer is skipped")
    quick = os.environ.get("BENCH_CPU_QUICK") == "1"  # scripts/bench_cpu --vs-torch --quick
    trainers = [("ours int8 fp32", "ours", "int8", "fp32"), ("ours int8 bf16", "ours", "int8", "bf16")]
    if not quick:
        trainers += [("ours none fp32", "ours", "none", "fp32"), ("ours none bf16", "ours", "none", "bf16")]
    if have_torch and (not quick or not have_peft) and not DORA:  # plain PyTorch has no adapters
        trainers += [("torch plain fp32", "plain", None, "fp32"), ("torch plain bf16", "plain", None, "bf16")]
    if have_peft:
        trainers += [("transformers+peft fp32", "peft", None, "fp32"), ("transformers+peft bf16", "peft", None, "bf16")]
    if AS_AVX2:  # PyTorch's bf16 GEMM on its AVX2 code: ~1 GFLOP/s on a 2-core EPYC, ~7 minutes a step
        trainers = [t for t in trainers if t[1] == "ours" or t[3] != "bf16"]
        print("--avx2: the PyTorch bf16 peers are left out (minutes a step without native bf16)")
    rates = {name: [] for name, *_ in trainers}  # tokens/s, one per round
    rss = {name: 0 for name, *_ in trainers}
    profiles = {}  # ours: the last round's op profile
    me = os.path.abspath(__file__)
    torch_env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    # Without AVX512-BF16 or AMX, PyTorch's bf16 step takes minutes here (ours
    # widens bf16 to f32 for its GEMMs): its bf16 peers run one step, no
    # warm-up, in the first round only.
    native_bf16 = any(flag in machine() for flag in ("avx512_bf16", "amx_bf16")) and not AS_AVX2
    if not native_bf16 and any(kind != "ours" and precision == "bf16" for _, kind, _, precision in trainers):
        print("No native bf16 on this CPU: the PyTorch bf16 peers run one step without warm-up, once")
    for round_index in range(rounds):
        for name, kind, quant, precision in trainers:
            if kind == "ours":
                rate, peak, profiles[name] = run_ours(finetune, config, model_dir, work_dir, quant, precision,
                                                      threads, warmup, steps)
            else:  # cwd work_dir: the repository's kernels/ folder would shadow the `kernels` Python package
                one_step = precision == "bf16" and not native_bf16
                if one_step and round_index > 0:
                    continue
                stdout, peak = child_rss([sys.executable, me, "--torch", kind, precision, str(threads),
                                          str(0 if one_step else warmup), str(1 if one_step else steps)],
                                         torch_env, work_dir)
                rate = TOKENS_PER_STEP / json.loads(stdout.strip().splitlines()[-1])["step_s"]
            rates[name].append(rate)
            rss[name] = max(rss[name], peak)
            print(f"round {round_index + 1}/{rounds}: {name}: {rate:.0f} tokens/s, "
                  f"peak RSS {peak / 2 ** 20:.0f} MiB", flush=True)
    report = {"machine": machine(), "shape": SHAPE, "threads": threads, "rounds": rounds, "warmup_steps": warmup,
              "steps": steps, "load_average": os.getloadavg(), "trainers": {}}
    print(f"\n{report['machine']}, batch {BATCH} x {SEQ}, {threads} threads, load average "
          f"{report['load_average'][0]:.1f} (medians of {rounds} rounds x {steps} steps)")
    for name in rates:
        tokens_per_s = statistics.median(rates[name])
        report["trainers"][name] = {"tokens_per_s": tokens_per_s, "peak_rss_bytes": rss[name],
                                    "tokens_per_s_by_round": rates[name]}
        if name in profiles:
            report["trainers"][name]["op_profile"] = profiles[name]
        runs = "" if len(rates[name]) == rounds else f"   ({len(rates[name])} run of 1 step)"
        print(f"  {name:26s} {tokens_per_s:7.1f} tokens/s   peak RSS {rss[name] / 2 ** 20:7.0f} MiB{runs}")
    peer = "transformers+peft" if have_peft else "torch plain"
    for ours, theirs in (("ours int8 fp32", f"{peer} fp32"), ("ours int8 bf16", f"{peer} bf16"),
                         ("ours none fp32", f"{peer} fp32"), ("ours none bf16", f"{peer} bf16")):
        if ours in report["trainers"] and theirs in report["trainers"]:
            ratio = report["trainers"][ours]["tokens_per_s"] / report["trainers"][theirs]["tokens_per_s"]
            report.setdefault("ratios", {})[f"{ours} / {theirs}"] = ratio
            print(f"  {ours} / {theirs}: {ratio:.2f}x")
    print("\nWhere ours' step goes (FT_PROFILE_OPS=1, the last round's steps after the first): each op's share "
          "of the step, the kernel and ISA it ran on")
    for name, profile in profiles.items():
        print(f"  {name}: {1000 * profile['step_seconds'] / profile['steps']:.0f} ms a step, "
              f"{100 * profile['ops_share']:.1f}% of it in ops")
        for op, path, share in top_ops(profile):
            print(f"    {100 * share:5.1f}%  {op:24s} {path}")
    if have_torch:
        stdout, _ = child_rss([sys.executable, me, "--torch-isa", str(threads)], torch_env, work_dir)
        report["torch_isa"] = json.loads(stdout.strip().splitlines()[-1])
        print(torch_isa_line(report["torch_isa"]))
    peaks = torch_gemm_peaks(threads) if have_torch else {}
    report["torch_gemm_gflops_2048"] = peaks
    if peaks:
        # Two significant figures below 10: PyTorch's bf16 GEMM on its AVX2 code runs at ~0.15 GFLOP/s.
        print("\nPyTorch GEMM at 2048^3: " +
              ", ".join(f"{k} {v:.0f} GFLOP/s" if v >= 10 else f"{k} {v:.2g} GFLOP/s" for k, v in peaks.items()))
    stdout, _ = child_rss([gemm_bench, "1" if quick else "5"], torch_env, work_dir)
    report["ours_gemm"] = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    # The register-loop peaks: f32 FMA for f32 and bf16 inputs, int16 multiply-add for int8.
    loop_peaks = {row["dtype"]: row["gflops"] for row in report["ours_gemm"] if row["gemm"] == "machine"}
    if loop_peaks:
        print("Machine peaks (register-only loops, all threads): " +
              ", ".join(f"{row['op'][6:]} {row['gflops']:.0f} G/s" for row in report["ours_gemm"]
                        if row["gemm"] == "machine"))
    print("Ours (GFLOP/s; % of PyTorch's 2048^3 GEMM of the same input dtype; % of the loop peak):")
    for row in report["ours_gemm"]:
        if row["gemm"] == "machine":
            continue
        peak, loop_peak = peaks.get(row["dtype"]), loop_peaks.get("int8" if row["dtype"] == "int8" else "f32")
        share = f"{100 * row['gflops'] / peak:5.0f}%" if peak else "      "
        loop_share = f"{100 * row['gflops'] / loop_peak:5.0f}%" if loop_peak else ""
        print(f"  {row['gemm']:9s} {row['op']:30s} {row['dtype']:5s} {row['M']}x{row['N']}x{row['K']:<6d} "
              f"{row['gflops']:7.1f} {share} {loop_share}")
    json.dump(report, open(output, "w"), indent=2)
    print(f"written: {output}")
    if docs:
        write_docs(docs, report, versions, one_step_bf16=not native_bf16, quick=quick)


OPS_SHOWN = 6  # per trainer, on stdout and in the docs; the rest summed in one row


def top_ops(profile):
    """(op, path, share of the step) of the profile's largest rows, then one row summing the rest."""
    rows = [(row["op"], row["path"], row["share"]) for row in profile["ops"]]
    rest = rows[OPS_SHOWN:]
    if rest:
        rows = rows[:OPS_SHOWN] + [(f"({len(rest)} more)", "", sum(share for _, _, share in rest))]
    return rows


# The docs table's names for the trainers, in its order.
DOCS_LABELS = {
    "ours int8 fp32": "ours, INT8 base, fp32",
    "ours int8 bf16": "ours, INT8 base, `precision: bf16`",
    "ours none fp32": "ours, no quantisation, fp32",
    "ours none bf16": "ours, no quantisation, `precision: bf16`",
    "torch plain fp32": "plain PyTorch, fp32",
    "torch plain bf16": "plain PyTorch, bf16 weights",
    "transformers+peft fp32": "transformers + peft, fp32",
    "transformers+peft bf16": "transformers + peft, bf16 weights",
}


def docs_markdown(report, versions, one_step_bf16, quick):
    """The tokens/s and peak RSS of every trainer, with a caption naming the machine and the method."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from docs_table import table_row
    method = (f"batch {BATCH} x {SEQ}, medians of {report['rounds']} rounds x {report['steps']} steps after "
              f"{report['warmup_steps']} warm-up, {report['threads']} threads, load average "
              f"{report['load_average'][0]:.1f}, "
              f"{datetime.date.today().isoformat()}")
    if quick:
        method += ", `--quick`"
    if one_step_bf16 and any(name.endswith("bf16") and not name.startswith("ours") for name in report["trainers"]):
        method += "; PyTorch's bf16 peers ran one step, once"
    peers = ", ".join(f"{name} {version}" for name, version in versions.items())
    command = "scripts/bench_cpu --vs-torch" + (" --dora" if DORA else "")
    lines = [f"Measured with `{command}` ({method}) on {report['machine']}"
             + (f" ({peers})" if peers else "") + ":", "",
             "| trainer | tokens/s | peak RSS |", "|---|---:|---:|"]
    for name, label in DOCS_LABELS.items():
        if name in report["trainers"]:
            row = report["trainers"][name]
            tokens_per_s = row["tokens_per_s"]
            lines.append(table_row([label, f"{tokens_per_s:,.0f}" if tokens_per_s >= 10 else f"{tokens_per_s:.1f}",
                                    f"{row['peak_rss_bytes'] / 2 ** 20:,.0f} MiB"]))
    return "\n".join(lines + op_share_markdown(report))


def op_share_markdown(report):
    """Ours' INT8 runs' largest ops (share of the step, kernel and ISA) and PyTorch's paths, below the table."""
    profiled = [name for name in ("ours int8 fp32", "ours int8 bf16") if "op_profile" in report["trainers"].get(name, {})]
    if not profiled:
        return []
    from docs_table import table_row
    lines = ["", "Where ours' step went (`FT_PROFILE_OPS=1`, the last round's steps after the first), and the kernel "
             "and ISA each op ran on:", "", "| ours | op | share of the step | kernel, ISA |", "|---|---|---:|---|"]
    for name in profiled:
        for op, path, share in top_ops(report["trainers"][name]["op_profile"]):
            lines.append(table_row([DOCS_LABELS[name][len("ours, "):], op, f"{100 * share:.1f}%", path]))
    if "torch_isa" in report:
        lines += ["", torch_isa_line(report["torch_isa"]) + "."]
    return lines


def write_docs(page, report, versions, one_step_bf16, quick):
    from docs_table import replace_section
    name = "bench_cpu_vs_torch_" + ("avx512" if "avx512f" in cpu_flags() else "avx2") + ("_as_avx2" if AS_AVX2 else "")
    if SHAPE != DEFAULT_SHAPE:
        name += "_" + SHAPE
    if DORA:
        name += "_dora"
    replace_section(page, name, docs_markdown(report, versions, one_step_bf16, quick))
    print(f"written: {page} ({name})")


# The CPU flags that pick the GEMM paths: AVX2/FMA f32, AVX-512, VNNI (exact int8 in oneDNN), native bf16, AMX.
FLAGS_THAT_MATTER = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def cpu_flags():
    """Which of FLAGS_THAT_MATTER this CPU has."""
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            return [flag for flag in FLAGS_THAT_MATTER if flag in present]
    return []


def machine():
    model = "unknown CPU"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    flags = cpu_flags()
    caps = (", every library capped to its AVX2 code (ONEDNN_MAX_CPU_ISA=AVX2, ATEN_CPU_CAPABILITY=avx2, "
            "MKL_ENABLE_INSTRUCTIONS=AVX2: `--avx2`)") if AS_AVX2 else ""
    return (f"{model}, {os.cpu_count()} logical CPUs, flags: {' '.join(flags) or 'none of ' + ' '.join(FLAGS_THAT_MATTER)}"
            + caps)


if __name__ == "__main__":
    if sys.argv[1] == "--torch":
        run_torch(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    elif sys.argv[1] == "--torch-isa":
        run_torch_isa(int(sys.argv[2]))
    else:
        a = sys.argv[1:]
        main(os.path.abspath(a[0]), os.path.abspath(a[1]), os.path.abspath(a[2]), os.path.abspath(a[3]), int(a[4]),
             int(a[5]), int(a[6]), int(a[7]), os.path.abspath(a[8]) if len(a) > 8 else "")
