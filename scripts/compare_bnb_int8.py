#!/usr/bin/env python3
"""Measures how our LLM.int8() forward differs from bitsandbytes' on a real-scale layer.

Writes tests/fixtures/int8_vs_bnb/figures.json and bnb_out_f16.bin; tests/test_int8_vs_bnb.cpp
regenerates the same operands, runs CpuBackend::int8_linear_forward on them and checks the figures.

The layer is Llama-2-7B's q_proj shape (out 4096, in 4096) on 64 tokens in float16, as a model loaded
with load_in_8bit runs it. All operands are exact float16 numbers generated from integers drawn by
splitmix64 (the same generator is in the C++ test), so nothing large is committed:
  draw(stream, i)  = splitmix64 output for state stream + (i + 1) * 0x9E3779B97F4A7C15 (mod 2^64)
  bell(stream, e)  = the sum of 12 bytes (bytes 0..7 of draw(stream, 2e), bytes 0..3 of draw(stream, 2e+1))
                     minus 1530: an integer in [-1530, 1530], bell-shaped with standard deviation ~256
  W[o, k]          = bell(W_STREAM, o * K + k) * 2^-14                  (std ~0.0156, |W| < 0.094)
  x[n, k]          = bell(X_STREAM, n * K + k) * 2^-8                   (std ~1.0, |x| < 5.98: never an outlier)
  outlier columns  = OUTLIER_COLUMNS below (emergent features, paper section 4), each with a sign s_c;
  x[n, c]          = s_c * m / 16 with r = draw(OUTLIER_STREAM, n * K + c):
                     r % 4 != 0 (3 rows in 4): m = 96 + (r >> 8) % 865, |x| in [6, 60]  (an outlier)
                     r % 4 == 0:               m = (r >> 8) % 96,       |x| in [0, 5.94) (the same feature
                                                                          below the threshold)
The figures compare, against the float64 product x @ W^T of those float16 operands:
  bnb_cpu_int8   bitsandbytes' Linear8bitLt in eval mode on CPU (MatMul8bitLt, the LLM.int8() path),
                 run for real; its float16 output is stored in bnb_out_f16.bin.
  bnb_rule_f64   bitsandbytes' outlier rule computed in float64 (re-implemented here from
                 backends/default/ops.py; the CUDA kernel kInt8VectorQuant applies the same rule):
                 the row scale is the absmax over the entries with |x| < threshold, so the sub-threshold
                 entries of outlier columns count in it.
  ours_f64       our rule (kernels/backend.h, int8_linear_forward) in float64: the row scale is the absmax
                 over the non-outlier columns only (outlier columns zeroed first).
  bnb_cpu_train  bitsandbytes' Linear8bitLt in training mode on CPU (MatMul8bitFp): no int8 product and
                 no outlier split, x @ dequant(W)^T in float16.
  fp16_linear    torch's float16 nn.functional.linear with the original weight (the unquantised baseline).
The int8 weight: both libraries store row absmax scales (identical here) and codes round(w * 127 / absmax),
but bitsandbytes computes w * (127 / absmax) in float32 and rounds that, while our quantize_rows_int8 rounds
the exact quotient half to even; at exact ties (w = absmax / 2 is common in float16 weights) bitsandbytes
lands on the lower magnitude. Each variant uses its own library's codes (ours_f64: ours; bnb_*: CB), and
  ours_rule_bnb_codes_f64  our rule with bitsandbytes' codes
separates the two differences: ours_rule_bnb_codes_f64 vs bnb_rule_f64 is the outlier rule alone,
ours_f64 vs ours_rule_bnb_codes_f64 the weight codes alone.

Run: python3 scripts/compare_bnb_int8.py   (needs torch and bitsandbytes; about 30 s on CPU)
"""
import hashlib
import json
import os
import platform
import sys

import numpy as np
import torch

import bitsandbytes as bnb

N_TOKENS, IN_FEATURES, OUT_FEATURES = 64, 4096, 4096
THRESHOLD = 6.0
W_STREAM, X_STREAM, OUTLIER_STREAM = 0x5157_5F70_726F_6A00, 0x4C4C_4D2E_696E_7438, 0x656D_6572_6765_6E74
OUTLIER_COLUMNS = [(187, 1), (1512, -1), (2033, 1), (2298, -1), (2941, 1), (3857, -1)]  # (column, sign)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "int8_vs_bnb")


def draw(stream, index):
    """splitmix64 outputs for states stream + (index + 1) * golden, index a uint64 array."""
    with np.errstate(over="ignore"):
        z = np.uint64(stream) + (index.astype(np.uint64) + np.uint64(1)) * GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def bell(stream, count):
    """Integers in [-1530, 1530]: 12 bytes of two draws per element summed, minus 1530."""
    e = np.arange(count, dtype=np.uint64)
    total = np.zeros(count, dtype=np.int64)
    for r, n_bytes in ((draw(stream, 2 * e), 8), (draw(stream, 2 * e + np.uint64(1)), 4)):
        for b in range(n_bytes):
            total += ((r >> np.uint64(8 * b)) & np.uint64(0xFF)).astype(np.int64)
    return total - 1530


def make_operands():
    w = bell(W_STREAM, OUT_FEATURES * IN_FEATURES).reshape(OUT_FEATURES, IN_FEATURES) * 2.0**-14
    x = bell(X_STREAM, N_TOKENS * IN_FEATURES).reshape(N_TOKENS, IN_FEATURES) * 2.0**-8
    for column, sign in OUTLIER_COLUMNS:
        r = draw(OUTLIER_STREAM, np.arange(N_TOKENS, dtype=np.uint64) * np.uint64(IN_FEATURES) + np.uint64(column))
        high = (r >> np.uint64(8)).astype(np.int64)  # < 2^56: exact in int64
        m = np.where(r % np.uint64(4) != 0, 96 + high % 865, high % 96)
        x[:, column] = sign * m / 16.0
    # Every value is an exact float16 number: check before anyone relies on it.
    for a in (w, x):
        assert np.array_equal(a.astype(np.float16).astype(np.float64), a)
    return w.astype(np.float16), x.astype(np.float16)


def quantize_rows_f64(a):
    """Our quantize_rows_int8 in float64: scale = max|row|, code = round-half-even(a * 127 / scale)."""
    scale = np.abs(a).max(axis=1)
    codes = np.rint(a * 127.0 / np.where(scale > 0, scale, 1.0)[:, None])
    return codes, scale


def int8_forward_f64(x, cb, scb, outlier_cols, absmax_mask):
    """The LLM.int8() decomposition in float64 with the row scale taken over x where absmax_mask holds;
    outlier columns leave the int8 product and meet the dequantised weight columns in full precision."""
    inlier = np.ones(x.shape[1], dtype=bool)
    inlier[outlier_cols] = False
    sx = np.where(absmax_mask, np.abs(x), 0.0).max(axis=1)
    xq = np.rint(x * 127.0 / sx[:, None]) * inlier[None, :]
    acc = xq @ cb.T  # integers below 2^53: exact
    w_dequant = cb * (scb[:, None] / 127.0)
    out = acc * (sx[:, None] * scb[None, :] / (127.0 * 127.0))
    out += x[:, outlier_cols] @ w_dequant[:, outlier_cols].T
    return out, sx


def diff_figures(got, want):
    d = np.abs(got - want)
    return {
        "max_abs": float(d.max()),
        "mean_abs": float(d.mean()),
        "max_abs_over_max_ref": float(d.max() / np.abs(want).max()),
        "rel_frobenius": float(np.linalg.norm(got - want) / np.linalg.norm(want)),
    }


def bnb_layer(w16):
    layer = bnb.nn.Linear8bitLt(IN_FEATURES, OUT_FEATURES, bias=False, has_fp16_weights=False, threshold=THRESHOLD)
    layer.weight = bnb.nn.Int8Params(torch.from_numpy(w16.copy()), requires_grad=False, has_fp16_weights=False)
    return layer.to("cpu")  # Int8Params quantises on the move: CB = int8 codes, SCB = f32 row absmax


def main():
    torch.manual_seed(0)
    w16, x16 = make_operands()
    w, x = w16.astype(np.float64), x16.astype(np.float64)
    full = x @ w.T

    layer = bnb_layer(w16)
    cb = layer.weight.CB.numpy().astype(np.float64)
    scb = layer.weight.SCB.numpy().astype(np.float64)
    our_codes, our_scale = quantize_rows_f64(w)
    assert np.array_equal(our_scale, scb), "bitsandbytes' SCB differs from our row absmax"
    codes_differ = our_codes != cb
    ties = np.abs(w * 127.0 / scb[:, None] % 1.0 - 0.5) == 0.0
    assert np.all(ties[codes_differ]) and np.all(np.abs(cb[codes_differ]) < np.abs(our_codes[codes_differ]))

    xt = torch.from_numpy(x16.copy())
    with torch.no_grad():
        layer.eval()
        bnb_int8 = layer(xt).numpy()
        layer.train()
        bnb_train = layer(xt).numpy()
        fp16_linear = torch.nn.functional.linear(xt, torch.from_numpy(w16.copy())).numpy()

    outlier_cols = np.flatnonzero((np.abs(x) >= THRESHOLD).any(axis=0))
    assert list(outlier_cols) == [c for c, _ in OUTLIER_COLUMNS]
    inlier_cols = np.ones(IN_FEATURES, dtype=bool)
    inlier_cols[outlier_cols] = False
    ours_mask = np.broadcast_to(inlier_cols, x.shape)
    ours, sx_ours = int8_forward_f64(x, our_codes, scb, outlier_cols, ours_mask)
    ours_bnb_codes, _ = int8_forward_f64(x, cb, scb, outlier_cols, ours_mask)
    bnb_rule, sx_bnb = int8_forward_f64(x, cb, scb, outlier_cols, np.abs(x) < THRESHOLD)
    rows_scale_differs = int((sx_ours != sx_bnb).sum())
    outlier_entries = int((np.abs(x) >= THRESHOLD).sum())

    bnb_int8_64 = bnb_int8.astype(np.float64)
    figures = {
        "vs_full_precision": {
            "ours_f64": diff_figures(ours, full),
            "bnb_cpu_int8": diff_figures(bnb_int8_64, full),
            "bnb_rule_f64": diff_figures(bnb_rule, full),
            "ours_rule_bnb_codes_f64": diff_figures(ours_bnb_codes, full),
            "bnb_cpu_train": diff_figures(bnb_train.astype(np.float64), full),
            "fp16_linear": diff_figures(fp16_linear.astype(np.float64), full),
        },
        "ours_f64_vs_bnb_cpu_int8": diff_figures(ours, bnb_int8_64),
        "ours_f64_vs_bnb_rule_f64": diff_figures(ours, bnb_rule),
        "rule_only__ours_rule_bnb_codes_f64_vs_bnb_rule_f64": diff_figures(ours_bnb_codes, bnb_rule),
        "weight_codes_only__ours_f64_vs_ours_rule_bnb_codes_f64": diff_figures(ours, ours_bnb_codes),
        "bnb_cpu_int8_vs_bnb_rule_f64": diff_figures(bnb_int8_64, bnb_rule),
    }

    os.makedirs(OUT_DIR, exist_ok=True)
    out_path = os.path.join(OUT_DIR, "bnb_out_f16.bin")
    bnb_int8.astype("<f2").tofile(out_path)
    with open(out_path, "rb") as f:
        out_sha256 = hashlib.sha256(f.read()).hexdigest()
    fixture = {
        "layer": "Llama-2-7B q_proj shape, float16 operands (generator: scripts/compare_bnb_int8.py docstring)",
        "n_tokens": N_TOKENS,
        "in_features": IN_FEATURES,
        "out_features": OUT_FEATURES,
        "threshold": THRESHOLD,
        "streams": {"weight": W_STREAM, "x": X_STREAM, "outliers": OUTLIER_STREAM},
        "outlier_columns": [{"column": c, "sign": s} for c, s in OUTLIER_COLUMNS],
        "checks": {
            "sum_w_integers": int(np.rint(w * 2**14).sum()),
            "sum_x_times_256": int(np.rint(x * 256).sum()),  # integers for every entry
            "sum_weight_codes_ours": int(our_codes.sum()),
            "sum_weight_codes_bnb": int(cb.sum()),
            "weight_codes_differing": int(codes_differ.sum()),
            "weight_codes_at_exact_ties": int(ties.sum()),
            "outlier_entries": outlier_entries,
            "rows_whose_scale_differs_between_rules": rows_scale_differs,
            "max_row_scale_ratio_bnb_over_ours": float((sx_bnb / sx_ours).max()),
        },
        "bnb_out": {"file": "bnb_out_f16.bin", "dtype": "float16 little-endian", "shape": [N_TOKENS, OUT_FEATURES],
                    "sha256": out_sha256},
        "figures": figures,
        "made_with": {"python": platform.python_version(), "torch": torch.__version__,
                      "bitsandbytes": bnb.__version__, "numpy": np.__version__,
                      "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()},
    }
    with open(os.path.join(OUT_DIR, "figures.json"), "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    json.dump({"checks": fixture["checks"], "figures": figures}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
