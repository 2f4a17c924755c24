// CudaBackend::attention_forward / attention_backward against CpuBackend under
// the emulator, for both kernel families: the f32 FMA kernels (attention.cu;
// f32 and mixed operands) and the bf16 tensor-core kernels (attention_tc.cu;
// bf16 q, k and v). Odd sequence lengths that span several query and key
// tiles with ragged edges, every head_dim bucket (8 and 20 -> 64, 80 and 96
// -> 128, 256), GQA 1:1, 3:1 and 4:1, sliding windows narrower than T,
// packed rows (cu_seqlens) whose sequences start and end inside tiles.
// Results must be bit-identical under every thread schedule (the tensor-core
// backward's dQ atomics add in block order under the emulator). Operands
// read and gradients written as head views (GPT-NeoX's fused qkv rows) give
// the contiguous runs' values bit for bit.
//
// Both backends' backward passes get the CPU forward's out and lse, so the
// backward comparison does not inherit the forward's rounding differences.
// Packed cases also run our kernels without the offsets on the same inputs
// and require every output to miss the packed reference somewhere, so a
// kernel that ignored cu_seqlens could not pass.
//
// Tolerances, |got - want| <= atol + rtol * |want| with atol a fraction of
// the tensor's largest |want| (gradients are sums of up to T terms of either
// sign, so an element near zero carries the rounding of its larger terms):
//   - f32 kernels, f32 outputs: 1e-5 relative, 1e-5 of the largest. Measured:
//     errors reach 1.0e-6 of the largest |value| (dk, head_dim 96, T = 70).
//   - f32 kernels, bf16 outputs: 2^-7 relative as in cuda_test_util.h, 2^-8
//     (one bf16 ulp) of the largest: single-ulp roundings of the same f32 sums.
//   - tensor-core kernels: inputs are the same bf16 values and products and
//     sums are f32, but P and dS are rounded to bf16 (relative error up to
//     2^-9 each) before they multiply V, dO, Q or K. An output sums such
//     terms, so its error is up to 2^-9 of the sum of |terms|, which for
//     cancelling sums (gradients) exceeds 2^-9 of the result; bounded by
//     2^-7 relative plus 2^-6 of the largest |want|. lse comes from f32
//     scores (no bf16 P): 1e-5, as the f32 kernels.
// Measured, as the largest |got - want| over its bound: f32 kernels 5% (f32
// outputs) and 20% (bf16 dk); tensor-core kernels 28% (dq), 25% (dk), 22%
// (dv), 20% (out), 1% (lse).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention.h"
#include "tests/emu/cuda_test_util.h"

using namespace cuda_test;

namespace {

// Our kernels, never cuDNN: on a real GPU the shared backend hands bf16
// problems to cuDNN SDPA (test_cuda_attention_engine compares it with these).
CudaBackend ours(device_allocator, cuda::default_gemm_kind(), /*library_attention=*/false);

struct AttentionCase {
  int64_t batch, seq, q_heads, kv_heads, head_dim;
  DType q, kv, grad;  // q/out/dout dtype, k/v dtype, dq/dk/dv dtype
  int64_t window = 0;  // sliding window, 0 for plain causal
};

// Element-wise relative bound plus an absolute term proportional to the
// tensor's largest |want| (see the file comment for both families' values).
struct Bound {
  double rel, abs_of_max;
};

bool uses_tensor_cores(const AttentionCase& c) { return c.q == DType::bf16 && c.kv == DType::bf16; }

std::vector<float> slice(const std::vector<float>& all, size_t& at, int64_t n) {
  std::vector<float> out(all.begin() + ptrdiff_t(at), all.begin() + ptrdiff_t(at + size_t(n)));
  at += size_t(n);
  return out;
}

Tolerance tolerance(const std::vector<float>& want, Bound bound) {
  double max_abs = 0.0;
  for (float w : want) max_abs = std::max(max_abs, double(std::abs(w)));
  return {1e-6 + bound.abs_of_max * max_abs, bound.rel};
}

void check_tensor(const char* name, const std::vector<float>& got, const Tensor& want_tensor, Bound bound) {
  CAPTURE(name);
  std::vector<float> want = values(want_tensor);
  check_close(got, want, tolerance(want, bound));
}

// Whether some element of got lies outside the bound around want_tensor's.
bool misses(const std::vector<float>& got, const Tensor& want_tensor, Bound bound) {
  std::vector<float> want = values(want_tensor);
  const Tolerance tol = tolerance(want, bound);
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(double(got[i]) - double(want[i])) <= tol.atol + tol.rtol * std::abs(double(want[i]))))
      return true;
  return false;
}

Bound bound_for(const AttentionCase& c, const Tensor& want, bool is_lse) {
  if (is_lse) return {1e-5, 1e-5};
  if (uses_tensor_cores(c)) return {1.0 / 128, 1.0 / 64};
  return want.dtype == DType::bf16 ? Bound{1.0 / 128, 1.0 / 256} : Bound{1e-5, 1e-5};
}

// cu_seqlens: the packed sequences' offsets over the batch's rows, or empty
// for one sequence per row.
void run_case(const AttentionCase& c, const std::vector<int32_t>& cu_seqlens = {}) {
  CAPTURE(c.batch);
  CAPTURE(c.seq);
  CAPTURE(c.q_heads);
  CAPTURE(c.kv_heads);
  CAPTURE(c.head_dim);
  CAPTURE(dtype_name(c.q));
  CAPTURE(dtype_name(c.kv));
  CAPTURE(dtype_name(c.grad));
  CAPTURE(c.window);
  CAPTURE(cu_seqlens.size());
  const int64_t B = c.batch, T = c.seq, Hq = c.q_heads, Hkv = c.kv_heads, D = c.head_dim;
  const float scale = 1.0f / std::sqrt(float(D));
  unsigned seed = unsigned(T * 1000 + D * 10 + Hq);
  // Wider q than k: sharper softmax rows than uniform inputs give.
  Tensor q = host_random({B, T, Hq, D}, c.q, seed, -2.0f, 2.0f);
  Tensor k = host_random({B, T, Hkv, D}, c.kv, seed + 1);
  Tensor v = host_random({B, T, Hkv, D}, c.kv, seed + 2);
  Tensor dout = host_random({B, T, Hq, D}, c.q, seed + 3);
  const Tensor host_offsets = host_ints(cu_seqlens);
  const Tensor* offsets = cu_seqlens.empty() ? nullptr : &host_offsets;

  Tensor out = cpu.empty(q.shape, c.q, MemCategory::activations);
  Tensor lse = cpu.empty({B, Hq, T}, DType::f32, MemCategory::activations);
  cpu.attention_forward(out, lse, q, k, v, scale, c.window, offsets);
  Tensor dq = cpu.empty(q.shape, c.grad, MemCategory::activations);
  Tensor dk = cpu.empty(k.shape, c.grad, MemCategory::activations);
  Tensor dv = cpu.empty(v.shape, c.grad, MemCategory::activations);
  cpu.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, c.window, offsets);

  // Our forward and backward, with the offsets on the device if packed or not.
  auto run_ours = [&](bool packed) {
    Tensor gq = to_device(q), gk = to_device(k), gv = to_device(v), gdout = to_device(dout);
    Tensor device_offsets = offsets ? to_device(*offsets) : Tensor{};
    const Tensor* g_offsets = packed ? &device_offsets : nullptr;
    Tensor gout = device_empty(q.shape, c.q), glse = device_empty({B, Hq, T}, DType::f32);
    ours.attention_forward(gout, glse, gq, gk, gv, scale, c.window, g_offsets);
    Tensor gdq = device_empty(q.shape, c.grad), gdk = device_empty(k.shape, c.grad);
    Tensor gdv = device_empty(v.shape, c.grad);
    ours.attention_backward(gdq, gdk, gdv, gdout, gq, gk, gv, to_device(out), to_device(lse), scale, c.window,
                            g_offsets);
    return values({&gout, &glse, &gdq, &gdk, &gdv});
  };
  const Tensor* wants[] = {&out, &lse, &dq, &dk, &dv};
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  std::vector<float> got = emu_test::same_under_schedules([&] { return run_ours(offsets != nullptr); });
  size_t at = 0;
  for (int i = 0; i < 5; ++i)
    check_tensor(names[i], slice(got, at, wants[i]->numel()), *wants[i], bound_for(c, *wants[i], i == 1));
  if (!offsets) return;
  // The first sequence of each row gives the same results unpacked: the
  // misses lie at tokens of later sequences.
  const std::vector<float> unpacked = run_ours(false);
  at = 0;
  for (int i = 0; i < 5; ++i) {
    CAPTURE(names[i]);
    CHECK(misses(slice(unpacked, at, wants[i]->numel()), *wants[i], bound_for(c, *wants[i], i == 1)));
  }
}

}  // namespace

TEST_CASE("cuda: attention forward and backward, f32") {
  const DType f = DType::f32;
  const AttentionCase cases[] = {
      {2, 1, 2, 2, 8, f, f, f},     // one token: softmax of a single score
      {2, 7, 4, 2, 20, f, f, f},    // one ragged tile, GQA
      {2, 70, 6, 2, 20, f, f, f},   // two forward query tiles (64), three backward tiles (32), GQA 3:1
      {2, 37, 4, 4, 96, f, f, f},   // head_dim 96 (GPT-NeoX-20B): 128 bucket, 2 x 32 / 3 x 16 tiles
      {2, 70, 4, 2, 96, f, f, f},   // 128 bucket, GQA, several key tiles per query tile
      {2, 19, 2, 1, 256, f, f, f},  // head_dim 256 (Pythia): 16 / 8 row tiles, ragged
      {1, 70, 4, 2, 20, f, f, f, 9},   // sliding window: key tiles skipped before it
      {1, 37, 2, 1, 96, f, f, f, 20},  // window across the 32 / 16 row tiles
  };
  for (const AttentionCase& c : cases) run_case(c);
}

TEST_CASE("cuda: attention forward and backward, mixed dtypes (f32 kernels)") {
  const DType f = DType::f32, h = DType::bf16;
  const AttentionCase cases[] = {
      {2, 37, 4, 2, 20, h, f, f},  // bf16 q, f32 k/v and f32 gradients
      {2, 37, 2, 2, 96, f, h, h},
      {1, 37, 2, 2, 96, f, h, h, 7},
  };
  for (const AttentionCase& c : cases) run_case(c);
}

TEST_CASE("cuda: attention forward and backward, bf16 (tensor-core kernels)") {
  const DType f = DType::f32, h = DType::bf16;
  const AttentionCase cases[] = {
      {2, 1, 2, 2, 64, h, h, h},       // one token
      {1, 17, 4, 1, 80, h, h, h},      // GQA 4:1, head_dim 80: five 16-column chunks of a 128 bucket
      {1, 77, 3, 1, 96, h, h, h},      // GQA 3:1, head_dim 96 (GPT-NeoX-20B), two query tiles
      {1, 77, 2, 2, 64, h, h, h},      // several key tiles per query tile, ragged
      {1, 40, 2, 1, 128, h, h, f},     // f32 gradients from bf16 operands
      {1, 17, 2, 2, 256, h, h, h},     // head_dim 256 (Pythia)
      {1, 7, 2, 2, 20, h, h, h},       // head_dim 20, padded to 32 with zeros
      {1, 77, 4, 1, 64, h, h, h, 20},  // sliding window below T, GQA 4:1: whole key tiles skipped
      {1, 77, 2, 2, 128, h, h, h, 5},  // window narrower than a tile
      {1, 37, 2, 1, 256, h, h, h, 16},
  };
  for (const AttentionCase& c : cases) run_case(c);
}

TEST_CASE("cuda: attention with a sliding window") {
  const DType f = DType::f32, h = DType::bf16;
  const AttentionCase cases[] = {
      {2, 70, 6, 2, 20, f, f, f, 5},    // 64-row query tiles: row 63 sees nothing in key tile 0
      {2, 70, 4, 2, 20, f, f, f, 1},    // each query sees only itself
      {2, 70, 4, 2, 20, f, f, f, 33},   // a window just past one 32-key tile
      {2, 70, 4, 2, 96, f, f, f, 17},   // 128 bucket: 16-key tiles skipped
      {2, 19, 2, 1, 256, f, f, f, 4},   // 256 bucket
      {2, 37, 4, 2, 20, f, f, f, 37},   // window = T: plain causal
      {2, 37, 4, 2, 20, f, f, f, 500},  // window > T
      {2, 37, 6, 2, 20, h, h, h, 9},
  };
  for (const AttentionCase& c : cases) run_case(c);
}

// Packed rows of T = 77 tokens, two batch rows split differently. Row 0:
// sequences of 1, 40, 1 and 35 tokens (40 starts one token into a tile and
// crosses the 32- and 16-row tiles); row 1: 3, 66 (across the forward's
// 64-row query tiles and every key tile size), 1, and a 7-token padding tail
// as its own sequence. The kernels' tiles: f32 forward Br x Bc 64x32 (head_dim
// <= 64) and 32x32 (<= 128), backward 32x32 and 16x16; tensor-core forward
// 64x64 and 64x32, backward 32x32 and 16x32.
const std::vector<int32_t> kPackedOffsets = {0, 1, 41, 42, 77, 80, 146, 147, 154};

TEST_CASE("cuda: attention over packed sequences, f32 (FMA kernels)") {
  const DType f = DType::f32, h = DType::bf16;
  const AttentionCase cases[] = {
      {2, 77, 6, 2, 20, f, f, f},      // GQA 3:1, 64 bucket
      {2, 77, 4, 4, 96, f, f, f},      // MHA, 128 bucket
      {2, 77, 6, 2, 20, f, f, f, 4},   // window narrower than the sequences
      {2, 77, 4, 4, 96, f, f, f, 40},  // window past the 40-token sequence's tiles
      {2, 77, 2, 2, 96, f, h, h, 40},  // mixed dtypes
  };
  for (const AttentionCase& c : cases) run_case(c, kPackedOffsets);
}

TEST_CASE("cuda: attention over packed sequences, bf16 (tensor-core kernels)") {
  const DType h = DType::bf16;
  const AttentionCase cases[] = {
      {2, 77, 6, 2, 64, h, h, h},      // GQA 3:1, 64 bucket
      {2, 77, 4, 4, 96, h, h, h},      // MHA, 128 bucket
      {2, 77, 6, 2, 64, h, h, h, 40},
      {2, 77, 4, 4, 96, h, h, h, 4},
  };
  for (const AttentionCase& c : cases) run_case(c, kPackedOffsets);
}

// The contract's checks of cu_seqlens' dtype, shape and device (its values
// need the host: the CUDA backend takes them as given).
TEST_CASE("cuda: attention refuses cu_seqlens of the wrong dtype or size") {
  const int64_t B = 2, T = 5;
  Tensor q = device_empty({B, T, 2, 8}, DType::f32), kv = device_empty({B, T, 1, 8}, DType::f32);
  Tensor out = device_empty({B, T, 2, 8}, DType::f32), lse = device_empty({B, 2, T}, DType::f32);
  Tensor dq = device_empty(q.shape, DType::f32), dk = device_empty(kv.shape, DType::f32);
  Tensor dv = device_empty(kv.shape, DType::f32), dout = device_empty(q.shape, DType::f32);
  const Tensor good = to_device(host_ints({0, 3, 5, 10}));
  const Tensor as_f32 = device_empty({4}, DType::f32);
  const Tensor too_few = to_device(host_ints({0, 10}));                      // fewer than B + 1 offsets
  const Tensor too_many = to_device(host_ints(std::vector<int32_t>(12, 0)));  // more than B * T + 1
  const Tensor two_d = to_device(host_ints({0, 3, 5, 10})).reshaped({2, 2});
  const Tensor on_host = host_ints({0, 3, 5, 10});
  CHECK_NOTHROW(gpu.attention_forward(out, lse, q, kv, kv, 1.0f, 0, &good));
  CHECK_NOTHROW(gpu.attention_backward(dq, dk, dv, dout, q, kv, kv, out, lse, 1.0f, 0, &good));
  for (const Tensor* bad : {&as_f32, &too_few, &too_many, &two_d, &on_host}) {
    CHECK_THROWS_AS(gpu.attention_forward(out, lse, q, kv, kv, 1.0f, 0, bad), Error);
    CHECK_THROWS_AS(gpu.attention_backward(dq, dk, dv, dout, q, kv, kv, out, lse, 1.0f, 0, bad), Error);
  }
}

TEST_CASE("cuda: attention rejects bad arguments") {
  Tensor q = device_empty({1, 3, 4, 8}, DType::f32), k = device_empty({1, 3, 3, 8}, DType::f32);
  Tensor out = device_empty({1, 3, 4, 8}, DType::f32), lse = device_empty({1, 4, 3}, DType::f32);
  CHECK_THROWS_AS(gpu.attention_forward(out, lse, q, k, k, 1.0f, 0), Error);  // 4 heads over 3 kv heads
  Tensor q_big = device_empty({1, 3, 2, 264}, DType::f32), k_big = device_empty({1, 3, 2, 264}, DType::f32);
  Tensor out_big = device_empty({1, 3, 2, 264}, DType::f32), lse_big = device_empty({1, 2, 3}, DType::f32);
  CHECK_THROWS_AS(gpu.attention_forward(out_big, lse_big, q_big, k_big, k_big, 1.0f, 0), Error);  // head_dim > 256
  Tensor lse_bf16 = device_empty({1, 4, 3}, DType::bf16), kv = device_empty({1, 3, 2, 8}, DType::f32);
  CHECK_THROWS_AS(gpu.attention_forward(out, lse_bf16, q, kv, kv, 1.0f, 0), Error);
  Tensor q2 = device_empty({1, 3, 2, 8}, DType::f32), out2 = device_empty({1, 3, 2, 8}, DType::f32);
  Tensor lse2 = device_empty({1, 2, 3}, DType::f32);
  CHECK_THROWS_AS(gpu.attention_forward(out2, lse2, q2, kv, kv, 1.0f, -1), Error);  // negative window
}

namespace {

// x's heads as a contiguous host tensor (copy_columns over its head rows).
Tensor host_heads(const HeadsView& x) {
  Tensor heads = cpu.empty(x.shape(), x.dtype(), MemCategory::activations);
  Tensor head_rows = heads.reshaped({heads.rows(), x.width});
  cpu.copy_columns(head_rows, 0, x.rows.reshaped({x.rows.rows(), x.pitch()}), x.first_column, x.width);
  return heads;
}

// The same view's columns of device rows read back: all rows' values, as host rows.
HeadsView read_back(const HeadsView& device_view) {
  return {host_copy(device_view.rows), device_view.first_column, device_view.width};
}

}  // namespace

// GPT-NeoX's layout: q, k and v read in place as column windows of one
// [B, T, H, 3D] tensor, dq, dk and dv written into one (grouped-query: q from
// a wider row, k and v from another), on both kernel families. Only the
// addressing differs from contiguous operands, so every value equals the
// contiguous run's bit for bit, under every schedule, and the gradient rows
// hold NaN exactly outside the views.
TEST_CASE("cuda: attention on views of fused qkv rows equals contiguous operands bit for bit") {
  struct ViewCase {
    int64_t q_heads, kv_heads, head_dim;
    DType dtype;
  };
  const DType f = DType::f32, h = DType::bf16;
  for (ViewCase c : {ViewCase{2, 2, 96, f}, ViewCase{2, 2, 96, h}, ViewCase{3, 3, 64, h}, ViewCase{4, 2, 40, f},
                     ViewCase{4, 2, 40, h}}) {
    CAPTURE(c.q_heads);
    CAPTURE(c.head_dim);
    CAPTURE(dtype_name(c.dtype));
    const int64_t B = 2, T = 37, D = c.head_dim, Hq = c.q_heads, Hkv = c.kv_heads;
    const bool fused = Hq == Hkv;
    const float scale = 1.0f / std::sqrt(float(D));
    const unsigned seed = unsigned(D * 10 + Hq);
    const Tensor q_rows = host_random({B, T, Hq, fused ? 3 * D : 2 * D}, c.dtype, seed, -2.0f, 2.0f);
    const Tensor kv_rows = fused ? q_rows : host_random({B, T, Hkv, 2 * D}, c.dtype, seed + 1, -2.0f, 2.0f);
    const int64_t q_col = fused ? 0 : D, k_col = fused ? D : 0, v_col = fused ? 2 * D : D;
    const Tensor dout = host_random({B, T, Hq, D}, c.dtype, seed + 2);
    const Tensor q = host_heads({q_rows, q_col, D}), k = host_heads({kv_rows, k_col, D});
    const Tensor v = host_heads({kv_rows, v_col, D});
    HeadsView dq, dk, dv;  // the device gradient views, kept for reading back
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor g_q_rows = to_device(q_rows), g_kv_rows = fused ? g_q_rows : to_device(kv_rows);
      Tensor gq = to_device(q), gk = to_device(k), gv = to_device(v), gdout = to_device(dout);
      const HeadsView vq(g_q_rows, q_col, D), vk(g_kv_rows, k_col, D), vv(g_kv_rows, v_col, D);
      Tensor out_view = device_empty({B, T, Hq, D}, c.dtype), lse_view = device_empty({B, Hq, T}, DType::f32);
      Tensor out = device_empty({B, T, Hq, D}, c.dtype), lse = device_empty({B, Hq, T}, DType::f32);
      ours.attention_forward(out_view, lse_view, vq, vk, vv, scale, 0);
      ours.attention_forward(out, lse, gq, gk, gv, scale, 0);
      Tensor dq_rows = device_empty(g_q_rows.shape, c.dtype);
      Tensor dkv_rows = fused ? dq_rows : device_empty(g_kv_rows.shape, c.dtype);
      ours.fill(dq_rows, NAN);
      ours.fill(dkv_rows, NAN);
      dq = {dq_rows, q_col, D}, dk = {dkv_rows, k_col, D}, dv = {dkv_rows, v_col, D};
      Tensor gdq = device_empty(q.shape, c.dtype), gdk = device_empty(k.shape, c.dtype);
      Tensor gdv = device_empty(v.shape, c.dtype);
      ours.attention_backward(dq, dk, dv, gdout, vq, vk, vv, out, lse, scale, 0);
      ours.attention_backward(gdq, gdk, gdv, gdout, gq, gk, gv, out, lse, scale, 0);
      Tensor dq_got = host_heads(read_back(dq)), dk_got = host_heads(read_back(dk));
      Tensor dv_got = host_heads(read_back(dv));
      return values({&out_view, &lse_view, &dq_got, &dk_got, &dv_got, &out, &lse, &gdq, &gdk, &gdv});
    });
    const size_t half = got.size() / 2;
    CHECK(std::equal(got.begin(), got.begin() + ptrdiff_t(half), got.begin() + ptrdiff_t(half)));
    size_t nan_count = 0;  // NaN left by the fill: exactly the gradient rows' columns outside the views
    for (float x : values(dq.rows)) nan_count += std::isnan(x);
    if (!fused)
      for (float x : values(dk.rows)) nan_count += std::isnan(x);
    CHECK(nan_count == (fused ? 0 : size_t(B * T * Hq * D)));  // GQA: dq's row holds D columns before its view
  }
}

// The attention kernels' offsets at a long context: Llama-3.1-8B's 32 query
// heads of 128 at 600,000 tokens put row 1's head 5 past 2^31 elements, which
// an int product would wrap. (Every kernel's element offsets are int64; this
// is the helper each attention kernel computes them with.)
TEST_CASE("cuda: attention head offsets past 2^31 elements do not wrap") {
  const int seq = 600000, heads = 32;
  const cuda::HeadRows rows = cuda::head_rows(128, heads, seq, 1, 5);
  CHECK(rows.base == (int64_t(seq) * heads + 5) * 128);
  CHECK(rows.base > (int64_t(1) << 31));
  CHECK(rows.stride == int64_t(heads) * 128);
  const cuda::HeadRows fused = cuda::head_rows(3 * 128, heads, seq, 1, 31);  // GPT-NeoX's qkv rows
  CHECK(fused.base == (int64_t(seq) * heads + 31) * 384);
}
