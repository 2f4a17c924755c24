// LLM.int8() on the CUDA backend under the emulator: the integer GEMM against
// a host loop (exact), int8_linear_forward / int8_linear_backward against
// CpuBackend, with several row chunks and weight tiles through the blocking
// entry points of kernels/cuda/int8_linear.h (kernels/int8_tiles.h's sizes
// give one block at any size the emulator can run).
//
// Tolerances:
//   - the integer GEMM and int8_row_absmax: exact;
//   - forward, f32 out: the same arithmetic in the same order as the CPU
//     (codes, int32 sums, the dequantisation, FMAs over the outlier columns
//     ascending), 1e-6 relative (measured: 0, bit-identical);
//   - forward with the epilogue (bias, LoRA update, given row scales): the
//     same, the order of kernels/backend.h on both sides (measured: 0,
//     bit-identical);
//   - forward, bf16 out: 2^-7 relative (one bf16 ulp: both sides round the
//     same f32 value, so in practice identical);
//   - forward fused on an int8 GEMM engine (bf16 x, out, h): |got - want| <=
//     4 u (|want| + sum over outlier columns |x w| + |scaling| sum_j |h B| +
//     |bias|), u = 2^-8, want the CPU's f32 value: the fused forward rounds
//     the int8 part plus bias, each dequantised outlier weight and scaled B
//     element, the output, and past the small GEMM's columns once more
//     (kernels/backend.h); f32 sums add ~1e-6 relative;
//   - backward: |got - want| <= rtol |want| + arel * sum_o |dout w| (plus |dx|
//     when accumulating): rtol 1e-5 for f32 dx, 2^-7 (one bf16 ulp) for bf16
//     dx; arel 1e-6 for f32 dout (the tile equals the CPU's f32 tile, only the
//     summation order differs), 2^-8 + 1e-6 for bf16 dout, whose tile is bf16
//     and so differs from the CPU's f32 tile by up to 2^-8 relative per
//     element (bf16's unit roundoff: 8 significant bits). Measured: 0 with
//     f32 dout; 0.0038 of sum |dout w| with bf16 dout (O = 3, where one
//     term dominates), 0.0077 with bf16 dout and bf16 dx.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <random>
#include <set>

#include "kernels/cuda/int8_linear.h"
#include "kernels/meta/meta_backend.h"
#include "tests/emu/cuda_test_util.h"

using namespace cuda_test;

namespace {

// i8 codes in [lo, hi].
Tensor host_codes(const Shape& shape, unsigned seed, int lo = -127, int hi = 127) {
  Tensor t = cpu.empty(shape, DType::i8, MemCategory::weights);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<int8_t>()[i] = int8_t(dist(rng));
  return t;
}

std::vector<int32_t> int32_values(const Tensor& t) {
  Tensor host = host_copy(t);
  return std::vector<int32_t>(host.ptr<int32_t>(), host.ptr<int32_t>() + host.numel());
}

// A frozen int8 weight [O, K] with row scales (as quantize_rows_int8 would
// give for rows of magnitude ~0.5), one of them 0 (an all-zero row).
struct Int8Weight {
  Tensor q, scales;
};
Int8Weight host_weight(int64_t O, int64_t K, unsigned seed) {
  Int8Weight w{host_codes({O, K}, seed), host_random({O}, DType::f32, seed + 1, 0.2f, 0.8f)};
  if (O > 1) w.scales.ptr<float>()[1] = 0.0f;
  return w;
}

// Largest |got - want| / |want| (|want| floored at 1e-3), for the report.
double worst_relative(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - want[i]) / std::max(1e-3, std::abs(double(want[i]))));
  return worst;
}

std::unique_ptr<cuda::Gemm> tiled = cuda::make_gemm(cuda::GemmKind::tiled, device_allocator);
cuda::Int8Context context() { return {*tiled, device_allocator, nullptr}; }
// Our int8 GEMM engine with its own allocator, so a tracking allocator in the
// context sees only what the fused forward itself allocates.
DeviceAllocator substitute_allocator;
std::unique_ptr<cuda::Int8GemmEngine> substitute = cuda::make_substitute_int8_gemm(*tiled, substitute_allocator);

}  // namespace

namespace {

// Column-major C [m, n] = alpha * op(A) @ op(B) + beta * C over codes in [lo, hi]
// through `engine`, against a host loop in int64: exact.
void check_int8_gemm(cuda::Gemm& engine, int64_t m, int64_t n, int64_t k, bool ta, bool tb, float alpha, float beta,
                     int lo, int hi) {
  CAPTURE(m);
  CAPTURE(k);
  CAPTURE(ta);
  CAPTURE(tb);
  const int64_t lda = ta ? k : m, ldb = tb ? n : k;
  Tensor a = host_codes({ta ? m : k, lda}, 40, lo, hi), b = host_codes({tb ? k : n, ldb}, 41, lo, hi);
  std::vector<int32_t> c0(size_t(m * n));
  for (size_t i = 0; i < c0.size(); ++i) c0[i] = int32_t(i * 7919 % 100003) - 50000;
  std::vector<int32_t> got = emu_test::same_under_schedules([&] {
    Tensor da = to_device(a), db = to_device(b), c = to_device(host_ints(c0));
    cuda::GemmArgs args{m, n, k, 1, alpha, beta, {da.data, DType::i8, ta, lda, 0}, {db.data, DType::i8, tb, ldb, 0},
                        {c.data, DType::i32, m, 0}};
    engine.gemm(args, nullptr);
    return int32_values(c);
  });
  const int8_t *av = a.ptr<int8_t>(), *bv = b.ptr<int8_t>();
  size_t bad = 0;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      int64_t sum = 0;
      for (int64_t p = 0; p < k; ++p)
        sum += int64_t(ta ? av[p + i * lda] : av[i + p * lda]) * (tb ? bv[j + p * ldb] : bv[p + j * ldb]);
      int64_t want = int64_t(alpha) * sum + (beta != 0.0f ? int64_t(beta) * c0[size_t(i + j * m)] : 0);
      bad += got[size_t(i + j * m)] != want;
    }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("cuda: int8 GEMM (tiled) is exact int32 arithmetic") {
  for (int transposes = 0; transposes < 4; ++transposes)  // two tiles each way, six k slices, ragged edges
    check_int8_gemm(*tiled, 70, 67, 83, transposes & 1, transposes & 2, 1.0f, 0.0f, -128, 127);
  check_int8_gemm(*tiled, 9, 5, 13, true, false, 2.0f, -3.0f, -128, 127);
  // Sums past 2^24, where an f32 accumulator would round.
  check_int8_gemm(*tiled, 5, 3, 2000, true, false, 1.0f, 0.0f, 100, 127);

  Tensor a = to_device(host_codes({4, 4}, 42)), c = device_empty({4, 4}, DType::i32);
  Tensor f = device_empty({4, 4}, DType::f32);
  cuda::GemmArgs args{4, 4, 4, 1, 0.5f, 0.0f, {a.data, DType::i8, true, 4, 0}, {a.data, DType::i8, false, 4, 0},
                      {c.data, DType::i32, 4, 0}};
  CHECK_THROWS_WITH_AS(tiled->gemm(args, nullptr), doctest::Contains("integer alpha and beta"), Error);
  args.alpha = 1.0f;
  args.c = {f.data, DType::f32, 4, 0};
  CHECK_THROWS_WITH_AS(tiled->gemm(args, nullptr), doctest::Contains("i32 output"), Error);
}

TEST_CASE("cuda: int8 GEMM through the default engine on IMMA shapes is exact") {
  // "TN", m and k multiples of 4: cuBLASLt's IMMA path on a GPU, the tiled
  // kernel under the emulator; either way the int32 sums must be exact.
  std::unique_ptr<cuda::Gemm> engine = cuda::make_gemm(cuda::default_gemm_kind(), device_allocator);
  check_int8_gemm(*engine, 128, 64, 256, true, false, 1.0f, 0.0f, -128, 127);
  check_int8_gemm(*engine, 96, 37, 128, true, false, 1.0f, 1.0f, -128, 127);
  check_int8_gemm(*engine, 32, 3, 4096, true, false, 1.0f, 0.0f, 120, 127);  // sums past 2^24
}

namespace {

enum class Outliers { planted, disabled, none };

// x [N, K] in [-2, 2]; with planted outliers: columns {1, K/2, K-1} get one
// value each of 6.0 (exactly the threshold, so an outlier), -6.5 and 20 in
// different rows, and column K/3 a 5.9 (not one).
Tensor make_x(int64_t N, int64_t K, DType dtype, Outliers outliers, unsigned seed) {
  Tensor x = host_random({N, K}, dtype, seed, -2.0f, 2.0f);
  if (outliers == Outliers::none) return x;
  const int64_t cols[] = {1 % K, K / 2, K - 1, K / 3};
  const float planted[] = {6.0f, -6.5f, 20.0f, 5.9f};
  for (int i = 0; i < 4; ++i) store_from_f32(x.data, dtype, (i * 7 % N) * K + cols[i], planted[i]);
  return x;
}

float threshold_for(Outliers outliers) { return outliers == Outliers::disabled ? 0.0f : 6.0f; }

}  // namespace

TEST_CASE("cuda: int8_linear_forward matches the CPU, with and without outlier columns") {
  struct Size {
    int64_t N, K, O;
  };
  const Size sizes[] = {{1, 7, 3}, {5, 64, 67}, {37, 301, 130}, {5, 301, 3}, {37, 7, 67}, {1, 64, 130}};
  const std::pair<DType, DType> dtypes[] = {
      {DType::f32, DType::f32}, {DType::bf16, DType::bf16}, {DType::bf16, DType::f32}, {DType::f32, DType::bf16}};
  double worst_f32 = 0.0, worst_bf16 = 0.0;
  unsigned seed = 50;
  for (const Size& s : sizes)
    for (const auto& x_out_dtypes : dtypes)
      for (Outliers outliers : {Outliers::planted, Outliers::disabled, Outliers::none}) {
        // Not structured bindings: CAPTURE's lambda cannot take one (clang, OpenMP).
        const DType x_dtype = x_out_dtypes.first, out_dtype = x_out_dtypes.second;
        CAPTURE(s.N);
        CAPTURE(s.K);
        CAPTURE(s.O);
        CAPTURE(dtype_name(x_dtype));
        CAPTURE(dtype_name(out_dtype));
        CAPTURE(int(outliers));
        Tensor x = make_x(s.N, s.K, x_dtype, outliers, seed++);
        Int8Weight w = host_weight(s.O, s.K, seed++);
        const float threshold = threshold_for(outliers);
        Tensor want = cpu.empty({s.N, s.O}, out_dtype, MemCategory::activations);
        cpu.int8_linear_forward(want, x, w.q, w.scales, threshold);
        std::vector<float> got = emu_test::same_under_schedules([&] {
          Tensor out = device_empty({s.N, s.O}, out_dtype);
          gpu.int8_linear_forward(out, to_device(x), to_device(w.q), to_device(w.scales), threshold);
          return values(out);
        });
        const bool bf16 = out_dtype == DType::bf16;
        check_close(got, values(want), bf16 ? kBf16 : Tolerance{1e-6, 1e-6});
        double& worst = bf16 ? worst_bf16 : worst_f32;
        worst = std::max(worst, worst_relative(got, values(want)));
      }
  MESSAGE("int8_linear_forward worst relative error: f32 out ", worst_f32, ", bf16 out ", worst_bf16);
}

TEST_CASE("cuda: int8_linear_forward over several row chunks, gathering some or all outlier weights") {
  // Three outlier columns: gathered none, one (the other two read in place) or all.
  struct Case {
    int64_t N, chunk, gather;
  };
  for (const Case& c : {Case{5, 2, 0}, Case{37, 16, 1}, Case{37, 1, 64}, Case{37, 36, 2}}) {
    const int64_t N = c.N, chunk = c.chunk, gather = c.gather;  // no structured binding: see above
    CAPTURE(N);
    CAPTURE(chunk);
    CAPTURE(gather);
    const int64_t K = 64, O = 67;
    Tensor x = make_x(N, K, DType::bf16, Outliers::planted, 60);
    Int8Weight w = host_weight(O, K, 61);
    Tensor want = cpu.empty({N, O}, DType::f32, MemCategory::activations);
    cpu.int8_linear_forward(want, x, w.q, w.scales, 6.0f);
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor out = device_empty({N, O}, DType::f32);
      cuda::int8_linear_forward(out, to_device(x), to_device(w.q), to_device(w.scales), 6.0f, {}, chunk, gather,
                                kInt8FusedOutlierColumns, context());
      return values(out);
    });
    CHECK(got == values(want));  // bit-identical: the gathered codes are the same bytes
  }
}

TEST_CASE("cuda: int8_linear_forward finds outlier columns in every block of rows") {
  // Outlier flagging splits rows into blocks of 64: outliers that only rows
  // past the first block hold, one column flagged by two blocks at once, and
  // one in the last, partial block must all leave the int8 product.
  const int64_t N = 700, K = 40, O = 19;
  Tensor x = make_x(N, K, DType::bf16, Outliers::none, 62);
  const std::pair<int64_t, int64_t> planted[] = {{300, 3}, {260, 17}, {600, 17}, {699, 39}};
  for (const auto& [row, column] : planted) store_from_f32(x.data, DType::bf16, row * K + column, -9.0f);
  Int8Weight w = host_weight(O, K, 63);
  Tensor want = cpu.empty({N, O}, DType::f32, MemCategory::activations);
  cpu.int8_linear_forward(want, x, w.q, w.scales, 6.0f);
  std::vector<float> got = emu_test::same_under_schedules([&] {
    Tensor out = device_empty({N, O}, DType::f32);
    gpu.int8_linear_forward(out, to_device(x), to_device(w.q), to_device(w.scales), 6.0f);
    return values(out);
  });
  CHECK(got == values(want));
  // The same rows with the outliers missed would differ: the check can fail.
  Tensor missed = cpu.empty({N, O}, DType::f32, MemCategory::activations);
  cpu.int8_linear_forward(missed, x, w.q, w.scales, 10.0f);
  CHECK(values(missed) != values(want));
}

TEST_CASE("cuda: int8_linear_forward with more outlier columns and LoRA ranks than one shared-memory stage") {
  // The epilogue stages 32 outlier columns and 32 LoRA ranks at a time: 45
  // outlier columns (some past the gather buffer's 40) and r = 70 take
  // several stages each, over a partial block of rows and columns.
  const int64_t N = 37, K = 96, O = 67, r = 70;
  Tensor x = make_x(N, K, DType::bf16, Outliers::none, 64);
  for (int64_t c = 0; c < 45; ++c) store_from_f32(x.data, DType::bf16, (c * 5 % N) * K + (c * 2 + 1), 7.0f + c);
  Int8Weight w = host_weight(O, K, 65);
  Tensor bias = host_random({O}, DType::bf16, 66), h = host_random({N, r}, DType::bf16, 67, -2.0f, 2.0f);
  Tensor B = host_random({O, r}, DType::bf16, 68, -0.3f, 0.3f);
  Tensor want = cpu.empty({N, O}, DType::f32, MemCategory::activations);
  cpu.int8_linear_forward(want, x, w.q, w.scales, 6.0f, {&bias, &h, &B, 0.25f});
  std::vector<float> got = emu_test::same_under_schedules([&] {
    Tensor out = device_empty({N, O}, DType::f32), dbias = to_device(bias), dh = to_device(h), dB = to_device(B);
    cuda::int8_linear_forward(out, to_device(x), to_device(w.q), to_device(w.scales), 6.0f, {&dbias, &dh, &dB, 0.25f},
                              16, 40, kInt8FusedOutlierColumns, context());
    return values(out);
  });
  CHECK(got == values(want));
}

TEST_CASE("cuda: int8_linear_forward at the kernels' vector widths is bit-identical to the CPU") {
  // bf16 x with rows of 2,112 and 8,256 elements (2 and 8 warps per row in
  // the quantisation, the last block of rows partial), O = 1,028 (a partial
  // block of the epilogue's 256 columns), 40 outlier columns on both
  // sides of the bit mask's word and 8-element run boundaries and at K - 1
  // (two shared-memory stages, some past the gather buffer), a bias and a
  // LoRA update of rank 40 (two stages), out in bf16 and f32.
  struct Size {
    int64_t N, K;
  };
  const int64_t O = 1028, r = 40;
  unsigned seed = 400;
  for (const Size& s : {Size{19, 2112}, Size{9, 8256}})
    for (DType out_dtype : {DType::bf16, DType::f32}) {
      CAPTURE(s.K);
      CAPTURE(dtype_name(out_dtype));
      Tensor x = make_x(s.N, s.K, DType::bf16, Outliers::none, seed++);
      const int64_t edges[] = {7, 8, 31, 32, 63, 64, 1000, s.K - 1};
      for (int64_t c = 0; c < 40; ++c) {
        const int64_t column = c < 8 ? edges[c] : 97 + 41 * c;
        store_from_f32(x.data, DType::bf16, (c * 5 % s.N) * s.K + column, c % 2 ? -7.0f - c : 7.0f + c);
      }
      Int8Weight w = host_weight(O, s.K, seed++);
      Tensor bias = host_random({O}, DType::bf16, seed++);
      Tensor h = host_random({s.N, r}, DType::bf16, seed++, -2.0f, 2.0f);
      Tensor B = host_random({O, r}, DType::bf16, seed++, -0.3f, 0.3f);
      Tensor want = cpu.empty({s.N, O}, out_dtype, MemCategory::activations);
      cpu.int8_linear_forward(want, x, w.q, w.scales, 6.0f, {&bias, &h, &B, 0.5f});
      for (int64_t chunk : {s.N, int64_t(8)}) {
        CAPTURE(chunk);
        Tensor out = device_empty({s.N, O}, out_dtype), dbias = to_device(bias), dh = to_device(h);
        Tensor dB = to_device(B);
        cuda::int8_linear_forward(out, to_device(x), to_device(w.q), to_device(w.scales), 6.0f,
                                  {&dbias, &dh, &dB, 0.5f}, chunk, 30, kInt8FusedOutlierColumns, context());
        CHECK(values(out) == values(want));
      }
    }
}

TEST_CASE("cuda: int8_row_absmax is the CPU's, bit for bit") {
  // Rows not a multiple of a quantisation block's rows, K = 7 and 301 (the
  // scalar path, a partial run of 8) and 2,112 (bf16 16-byte runs, 2 warps
  // per row), outliers at both edges of the row and of the bit mask (columns
  // 0 and K - 1) and at K / 2.
  struct Size {
    int64_t N, K;
  };
  unsigned seed = 600;
  for (const Size& s : {Size{1, 7}, Size{37, 301}, Size{19, 2112}})
    for (DType dtype : {DType::f32, DType::bf16})
      for (float threshold : {0.0f, 6.0f}) {
        CAPTURE(s.N);
        CAPTURE(s.K);
        CAPTURE(dtype_name(dtype));
        CAPTURE(threshold);
        Tensor x = host_random({s.N, s.K}, dtype, seed++, -2.0f, 2.0f);
        store_from_f32(x.data, dtype, 0, 7.0f);
        store_from_f32(x.data, dtype, (s.N - 1) * s.K + s.K - 1, -9.0f);
        store_from_f32(x.data, dtype, (s.N / 2) * s.K + s.K / 2, 6.0f);
        Tensor want = cpu.empty({s.N}, DType::f32, MemCategory::activations);
        cpu.int8_row_absmax(want, x, threshold);
        std::vector<float> got = emu_test::same_under_schedules([&] {
          Tensor absmax = device_empty({s.N}, DType::f32);
          gpu.int8_row_absmax(absmax, to_device(x), threshold);
          return values(absmax);
        });
        CHECK(got == values(want));
        CHECK((threshold > 0.0f ? values(want)[0] < 6.0f : values(want)[0] >= 7.0f));  // the outlier left out or not
      }
}

namespace {

// x [N, K] with the planted outliers and a weight [O, K], at the scalar
// width (K = 301) and the bf16 vector one (2,112), in f32 and bf16.
struct PlantedCase {
  int64_t N, K, O;
  DType dtype;
  Tensor x;
  Int8Weight w;
};
std::vector<PlantedCase> planted_cases(unsigned& seed) {
  constexpr int64_t kSizes[][3] = {{37, 301, 67}, {19, 2112, 130}};  // N, K, O
  std::vector<PlantedCase> cases;
  for (const auto& s : kSizes)
    for (DType dtype : {DType::f32, DType::bf16}) {
      Tensor x = make_x(s[0], s[1], dtype, Outliers::planted, seed++);
      cases.push_back({s[0], s[1], s[2], dtype, x, host_weight(s[2], s[1], seed++)});
    }
  return cases;
}

}  // namespace

TEST_CASE("cuda: int8_linear_forward with given row scales is the CPU's, bit for bit") {
  // Scales above x's own (a row-parallel shard's whole-row absmax: x in
  // [-2, 2] plus a 5.9 that is no outlier, the scales in [6, 12]), with the
  // planted outlier columns, a bias, over one and several row chunks.
  unsigned seed = 700;
  for (const PlantedCase& s : planted_cases(seed)) {
    CAPTURE(s.K);
    CAPTURE(dtype_name(s.dtype));
    const Tensor& x = s.x;
    const Int8Weight& w = s.w;
    Tensor bias = host_random({s.O}, s.dtype, seed++);
    Tensor given = host_random({s.N}, DType::f32, seed++, 6.0f, 12.0f);
    Int8Epilogue epilogue;
    epilogue.bias = &bias;
    epilogue.row_absmax = &given;
    Tensor want = cpu.empty({s.N, s.O}, DType::f32, MemCategory::activations);
    cpu.int8_linear_forward(want, x, w.q, w.scales, 6.0f, epilogue);
    Tensor own = cpu.empty({s.N, s.O}, DType::f32, MemCategory::activations);
    cpu.int8_linear_forward(own, x, w.q, w.scales, 6.0f, {&bias});
    CHECK(values(own) != values(want));  // the given scales are used
    for (int64_t chunk : {s.N, int64_t(8)}) {
      CAPTURE(chunk);
      std::vector<float> got = emu_test::same_under_schedules([&] {
        Tensor out = device_empty({s.N, s.O}, DType::f32), dbias = to_device(bias), dgiven = to_device(given);
        Int8Epilogue device_epilogue;
        device_epilogue.bias = &dbias;
        device_epilogue.row_absmax = &dgiven;
        cuda::int8_linear_forward(out, to_device(x), to_device(w.q), to_device(w.scales), 6.0f, device_epilogue,
                                  chunk, 2, kInt8FusedOutlierColumns, context());
        return values(out);
      });
      CHECK(got == values(want));
    }
  }
}

namespace {

// An Int8Input for x [N, K] on the given backend's device.
Int8Input empty_input(Backend& backend, int64_t N, int64_t K) {
  return {backend.empty({N, K}, DType::i8, MemCategory::activations),
          backend.empty({N}, DType::f32, MemCategory::activations),
          backend.empty({int8_outlier_list_elements(K)}, DType::i32, MemCategory::activations)};
}

}  // namespace

TEST_CASE("cuda: int8_quantize_input is the CPU's, and the forward given it is the CPU's forward, bit for bit") {
  // The planted outlier columns at the scalar and bf16 vector widths, with
  // and without the batch's flags (a flag set in no row of this x); the
  // codes, the row scales, the count, the list and the bit mask (entries
  // between the list and the mask are unspecified); then two weights'
  // forwards given the one quantised input, with a bias and LoRA, over one
  // and several row chunks, against the CPU's forward without it.
  unsigned seed = 800;
  for (const PlantedCase& s : planted_cases(seed))
    for (bool with_flags : {false, true}) {
      CAPTURE(s.K);
      CAPTURE(dtype_name(s.dtype));
      CAPTURE(with_flags);
      Tensor flags = host_ints(std::vector<int32_t>(size_t(s.K), 0));
      cpu.int8_outlier_columns(flags, s.x, 6.0f);
      flags.ptr<int32_t>()[s.K / 3] = 1;
      Int8Input want = empty_input(cpu, s.N, s.K);
      cpu.int8_quantize_input(want, s.x, 6.0f, with_flags ? &flags : nullptr);
      Int8Input got = empty_input(gpu, s.N, s.K);
      const Tensor dx = to_device(s.x), dflags = to_device(flags);
      gpu.int8_quantize_input(got, dx, 6.0f, with_flags ? &dflags : nullptr);
      CHECK(got.threshold == 6.0f);
      CHECK(values(got.row_absmax) == values(want.row_absmax));
      Tensor codes = host_copy(got.codes);
      CHECK(std::memcmp(codes.data, want.codes.data, size_t(s.N * s.K)) == 0);
      const std::vector<int32_t> list = int32_values(got.outlier_columns);
      const int32_t* want_list = want.outlier_columns.ptr<const int32_t>();
      REQUIRE(list[0] == want_list[0]);
      CHECK(list[0] == (with_flags ? 4 : 3));
      CHECK(std::equal(list.begin(), list.begin() + 1 + list[0], want_list));
      CHECK(std::equal(list.begin() + 1 + s.K, list.end(), want_list + 1 + s.K));  // the bit mask
      for (unsigned w_seed : {seed++, seed++}) {
        const Int8Weight w = host_weight(s.O, s.K, w_seed);
        Tensor bias = host_random({s.O}, s.dtype, seed++);
        Tensor h = host_random({s.N, 5}, s.dtype, seed++), B = host_random({s.O, 5}, s.dtype, seed++, -0.3f, 0.3f);
        Int8Epilogue epilogue{&bias, &h, &B, 0.5f};
        epilogue.outlier_flags = with_flags ? &flags : nullptr;
        Tensor out_want = cpu.empty({s.N, s.O}, DType::f32, MemCategory::activations);
        cpu.int8_linear_forward(out_want, s.x, w.q, w.scales, 6.0f, epilogue);
        for (int64_t chunk : {s.N, int64_t(8)}) {
          CAPTURE(chunk);
          Tensor out = device_empty({s.N, s.O}, DType::f32), dbias = to_device(bias), dh = to_device(h);
          Tensor dB = to_device(B);
          Int8Epilogue given{&dbias, &dh, &dB, 0.5f};
          given.input = &got;
          cuda::int8_linear_forward(out, dx, to_device(w.q), to_device(w.scales), 6.0f, given, chunk, 2,
                                    kInt8FusedOutlierColumns, context());
          CHECK(values(out) == values(out_want));
        }
        // The op reads the given codes: with them zeroed only the outlier part is left.
        Int8Input zeroed = got;
        zeroed.codes = to_device(host_codes({s.N, s.K}, 0, 0, 0));
        Tensor out = device_empty({s.N, s.O}, DType::f32);
        Int8Epilogue given;
        given.input = &zeroed;
        gpu.int8_linear_forward(out, dx, to_device(w.q), to_device(w.scales), 6.0f, given);
        CHECK(values(out) != values(out_want));
      }
    }
}

namespace {

// value's neighbour one unit in the last place of dtype away from zero (up)
// or towards it; value is exact in dtype and normal.
float dtype_neighbour(float value, DType dtype, bool up) {
  const int shift = dtype == DType::bf16 ? 16 : 0;
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  bits = up ? bits + (1u << shift) : bits - (1u << shift);
  std::memcpy(&value, &bits, sizeof bits);
  return value;
}

}  // namespace

TEST_CASE("cuda: int8_quantize_input rounds exact ties and near-ties as the exact quotient, without dividing") {
  // The codes come from v * f32(127 / absmax), taking the division only
  // within 2^-16 of a half-integer. Rows whose entries sit on and next to
  // the ties: v = +-absmax / 2 is the tie 63.5 for any absmax (round-half-
  // even: 64), and its neighbours in x's dtype; rows with absmax = 127 * 2^k
  // have ties at every half-integer multiple of 2^k; bf16 rows with a
  // subnormal absmax make 127 / absmax overflow. At the bf16 vector width
  // (K = 24) and the scalar one (K = 20, and f32), against the CPU's
  // double-precision quotients.
  for (DType dtype : {DType::bf16, DType::f32})
    for (int64_t K : {int64_t(24), int64_t(20)}) {
      if (dtype != DType::bf16 && K == 24) continue;
      CAPTURE(std::string(dtype_name(dtype)));
      CAPTURE(K);
      const int64_t N = 40;
      std::mt19937 rng(unsigned(K) * 7 + unsigned(dtype));
      std::uniform_real_distribution<float> exponent(-6.0f, 6.0f), unit(-1.0f, 1.0f);
      std::vector<float> row_values(size_t(N * K));
      int64_t inexact_tie_rows = 0;  // rows where v * f32(127 / absmax) misses the tie 63.5
      for (int64_t n = 0; n < N; ++n) {
        Tensor one = cpu.empty({1}, dtype, MemCategory::activations);
        auto in_dtype = [&](float v) {
          store_from_f32(one.data, dtype, 0, v);
          return load_as_f32(one.data, dtype, 0);
        };
        float absmax = in_dtype(std::exp2(exponent(rng)));
        if (n % 8 == 1) absmax = 127.0f * std::exp2(float(int(exponent(rng))));
        if (n == 2 && dtype == DType::bf16) absmax = in_dtype(1e-39f);  // subnormal: 127 / absmax overflows
        float* row = &row_values[size_t(n * K)];
        const float half = absmax / 2;
        const bool normal_half = std::fpclassify(half) == FP_NORMAL;
        const float fixed[] = {absmax, -absmax, half, -half,
                               normal_half ? dtype_neighbour(half, dtype, true) : half,
                               normal_half ? dtype_neighbour(half, dtype, false) : -half,
                               normal_half ? -dtype_neighbour(half, dtype, false) : half};
        for (int64_t k = 0; k < K; ++k) {
          float v = k < 7 ? fixed[k] : in_dtype(absmax * unit(rng));
          if (n % 8 == 1 && k >= 7 && k % 2) v = absmax * (float(int(126 * unit(rng))) + 0.5f) / 127.0f;  // a tie
          row[k] = v;
        }
        inexact_tie_rows += half * (127.0f / absmax) != 63.5f;
      }
      CHECK(inexact_tie_rows > 0);  // the window is exercised, not only exact products
      Tensor x = cpu.empty({N, K}, dtype, MemCategory::activations);
      for (int64_t i = 0; i < N * K; ++i) store_from_f32(x.data, dtype, i, row_values[size_t(i)]);
      Int8Input want = empty_input(cpu, N, K);
      cpu.int8_quantize_input(want, x, 0.0f, nullptr);
      Int8Input got = empty_input(gpu, N, K);
      gpu.int8_quantize_input(got, to_device(x), 0.0f, nullptr);
      CHECK(values(got.row_absmax) == values(want.row_absmax));
      Tensor codes = host_copy(got.codes);
      const int8_t *c = codes.ptr<const int8_t>(), *w = want.codes.ptr<const int8_t>();
      int64_t differing = 0;
      for (int64_t i = 0; i < N * K; ++i) differing += c[i] != w[i];
      CHECK(differing == 0);
      for (int64_t n = 0; n < N; ++n) {
        if (dtype == DType::bf16 && n == 2) continue;  // its half is subnormal: 63.5 is no longer exact
        CHECK(int(c[n * K + 2]) == 64);  // 63.5 rounds to even
        CHECK(int(c[n * K + 3]) == -64);
      }
    }
}

TEST_CASE("cuda: int8_outlier_columns over row blocks, and the blocks' forward and row scales with them, are the CPU's") {
  // A batch in blocks of 8 rows (the MLP in chunks of tokens): the planted
  // outliers sit in the first two blocks only, so the later blocks' own
  // columns would differ; one flag is set before the scan (the op leaves it).
  unsigned seed = 750;
  for (const PlantedCase& s : planted_cases(seed)) {
    CAPTURE(s.K);
    CAPTURE(dtype_name(s.dtype));
    const int64_t block_rows = 8;
    const Tensor& x = s.x;
    const Int8Weight& w = s.w;
    std::vector<int32_t> initial(size_t(s.K), 0);
    initial[2] = 1;
    Tensor want_flags = host_ints(initial);
    for (int64_t first = 0; first < s.N; first += block_rows)
      cpu.int8_outlier_columns(want_flags, x.slice_rows(first, std::min(block_rows, s.N - first)), 6.0f);
    const std::vector<int32_t> flagged = int32_values(want_flags);
    CHECK(std::count(flagged.begin(), flagged.end(), 1) == 4);  // column 2 and the three planted outliers
    Int8Epilogue epilogue;
    epilogue.outlier_flags = &want_flags;
    Tensor want = cpu.empty({s.N, s.O}, DType::f32, MemCategory::activations);
    Tensor want_absmax = cpu.empty({s.N}, DType::f32, MemCategory::activations);
    for (int64_t first = 0; first < s.N; first += block_rows) {
      const int64_t rows = std::min(block_rows, s.N - first);
      Tensor out = want.slice_rows(first, rows), absmax = want_absmax.slice_rows(first, rows);
      cpu.int8_linear_forward(out, x.slice_rows(first, rows), w.q, w.scales, 6.0f, epilogue);
      cpu.int8_row_absmax(absmax, x.slice_rows(first, rows), 6.0f, &want_flags);
    }
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor dx = to_device(x), flags = to_device(host_ints(initial));
      Tensor out = device_empty({s.N, s.O}, DType::f32), absmax = device_empty({s.N}, DType::f32);
      for (int64_t first = 0; first < s.N; first += block_rows)
        gpu.int8_outlier_columns(flags, dx.slice_rows(first, std::min(block_rows, s.N - first)), 6.0f);
      CHECK(int32_values(flags) == int32_values(want_flags));
      Int8Epilogue device_epilogue;
      device_epilogue.outlier_flags = &flags;
      for (int64_t first = 0; first < s.N; first += block_rows) {
        const int64_t rows = std::min(block_rows, s.N - first);
        Tensor out_rows = out.slice_rows(first, rows), absmax_rows = absmax.slice_rows(first, rows);
        gpu.int8_linear_forward(out_rows, dx.slice_rows(first, rows), to_device(w.q), to_device(w.scales), 6.0f,
                                device_epilogue);
        gpu.int8_row_absmax(absmax_rows, dx.slice_rows(first, rows), 6.0f, &flags);
      }
      std::vector<float> result = values(out), scales = values(absmax);
      result.insert(result.end(), scales.begin(), scales.end());
      return result;
    });
    std::vector<float> expected = values(want), expected_scales = values(want_absmax);
    expected.insert(expected.end(), expected_scales.begin(), expected_scales.end());
    CHECK(got == expected);
  }
}

TEST_CASE("cuda: the forward's int32 product blocks are balanced, within budget, in whole GEMM tiles") {
  // GPT-NeoX-20B's query_key_value and dense_h_to_4h products at 2048 tokens:
  // two blocks of 1024 rows each.
  CHECK(int8_forward_chunk_rows(2048, 18432) == 1024);
  CHECK(int8_forward_chunk_rows(2048, 24576) == 1024);
  CHECK(int8_forward_chunk_rows(8192, 2048) == 8192);  // one block
  CHECK(int8_forward_chunk_rows(37, 67) == 37);
  for (int64_t rows : {1, 5, 129, 1000, 2048, 4097, 8192, 65537})
    for (int64_t out_features : {1, 67, 2048, 18432, 24576, 50000, 1 << 22}) {
      CAPTURE(rows);
      CAPTURE(out_features);
      const int64_t chunk = int8_forward_chunk_rows(rows, out_features);
      const int64_t most = std::max<int64_t>(1, kInt8ProductChunkElements / out_features);
      CHECK(chunk >= 1);
      CHECK(chunk <= rows);
      CHECK(chunk <= most);
      CHECK((rows + chunk - 1) / chunk == (rows + most - 1) / most);  // no more blocks than the budget needs
      if (chunk < rows && chunk % kInt8ProductRowGranule != 0)  // not whole tiles only where they would not fit
        CHECK((chunk + kInt8ProductRowGranule - 1) / kInt8ProductRowGranule * kInt8ProductRowGranule > most);
    }
}

TEST_CASE("cuda: int8 chunks and tiles are balanced") {
  CHECK(balanced_chunk_rows(37, 36) == 19);  // 19 + 18, not 36 + 1
  CHECK(balanced_chunk_rows(8192, 1365) == 1171);  // 7 chunks of <= 1171
  CHECK(balanced_chunk_rows(10, 5) == 5);
  CHECK(balanced_chunk_rows(3, 8) == 3);
  for (int64_t rows : {1, 7, 37, 8192})
    for (int64_t most : {1, 3, 36, 1365}) {
      const int64_t chunk = balanced_chunk_rows(rows, most);
      CHECK(chunk <= most);
      CHECK((rows + chunk - 1) / chunk == (rows + most - 1) / most);  // no more chunks than needed
      CHECK(balanced_chunk_rows(rows, chunk) == chunk);                // the planner's value is the op's
    }
  // GPT-NeoX-20B's four weights [O, K] take 1 to 3 even, 64-aligned blocks on the GPU.
  CHECK(int8_backward_tile_columns(24576, 6144, kInt8DequantTileElementsGpu) == 2048);
  CHECK(int8_backward_tile_columns(6144, 24576, kInt8DequantTileElementsGpu) == 8192);
  CHECK(int8_backward_tile_columns(18432, 6144, kInt8DequantTileElementsGpu) == 3072);
  CHECK(int8_backward_tile_columns(6144, 6144, kInt8DequantTileElementsGpu) == 6144);
  CHECK(int8_backward_tile_columns(67, 301) == 301);
  CHECK(int8_backward_tile_columns(int64_t(1) << 23, 301) == 1);  // a budget below one column still takes one
}

TEST_CASE("cuda: int8_linear_forward on IMMA shapes is bit-identical to the CPU") {
  // O and K multiples of 4: through the backend's GEMM engine these take
  // cuBLASLt's IMMA path on a GPU (the tiled kernel under the emulator), whose
  // int32 sums are exact, so every output must equal the CPU's bit for bit.
  // Row 0 holds exact .5 ties of the quotient: absmax 127/32, so x * 127 /
  // absmax = 32 x, and x = (2m + 1) / 64 gives m + 0.5 (exact in bf16).
  struct Size {
    int64_t N, K, O;
  };
  unsigned seed = 150;
  for (const Size& s : {Size{64, 256, 128}, Size{37, 128, 96}, Size{1, 64, 32}})
    for (DType dtype : {DType::bf16, DType::f32})
      for (Outliers outliers : {Outliers::planted, Outliers::none}) {
        CAPTURE(s.N);
        CAPTURE(s.K);
        CAPTURE(s.O);
        CAPTURE(dtype_name(dtype));
        CAPTURE(int(outliers));
        Tensor x = make_x(s.N, s.K, dtype, outliers, seed++);
        store_from_f32(x.data, dtype, 3, 127.0f / 32.0f);
        for (int64_t j = 0; j < 24; ++j) store_from_f32(x.data, dtype, 4 + j, float(10 * j + 1) / 64.0f);
        Int8Weight w = host_weight(s.O, s.K, seed++);
        Tensor want = cpu.empty({s.N, s.O}, DType::f32, MemCategory::activations);
        cpu.int8_linear_forward(want, x, w.q, w.scales, 6.0f);
        Tensor out = device_empty({s.N, s.O}, DType::f32);
        gpu.int8_linear_forward(out, to_device(x), to_device(w.q), to_device(w.scales), 6.0f);
        CHECK(values(out) == values(want));
      }
}

namespace {

// The epilogue's operands picked by parts: bit 0 the bias, bit 1 the LoRA update.
Int8Epilogue pick_epilogue(int parts, const Tensor& bias, const Tensor& h, const Tensor& B, float scaling) {
  Int8Epilogue e;
  if (parts & 1) e.bias = &bias;
  if (parts & 2) e = {e.bias, &h, &B, scaling};
  return e;
}

}  // namespace

TEST_CASE("cuda: int8_linear_forward's epilogue (bias, LoRA update) matches the CPU") {
  // With and without outlier columns (without, the bias add follows the
  // dequantisation directly: neither side may contract the two into an FMA);
  // x, bias, h and B in one dtype, out in either; through the backend (one
  // chunk) and in chunks of 16 rows (16, 16, 5).
  const int64_t N = 37, K = 64, O = 67, r = 5;
  const float scaling = 16.0f / float(r);
  const Int8Weight w = host_weight(O, K, 90);
  double worst_f32 = 0.0, worst_bf16 = 0.0;
  size_t differing = 0, compared = 0;
  unsigned seed = 91;
  for (DType dtype : {DType::f32, DType::bf16})
    for (DType out_dtype : {DType::f32, DType::bf16})
      for (int parts = 1; parts < 4; ++parts)
        for (Outliers outliers : {Outliers::planted, Outliers::disabled})
          for (int64_t chunk : {int64_t(0), int64_t(16)}) {
            CAPTURE(int(outliers));
            CAPTURE(dtype_name(dtype));
            CAPTURE(dtype_name(out_dtype));
            CAPTURE(parts);
            CAPTURE(chunk);
            Tensor x = make_x(N, K, dtype, outliers, seed++), bias = host_random({O}, dtype, seed++);
            Tensor h = host_random({N, r}, dtype, seed++, -2.0f, 2.0f);
            Tensor B = host_random({O, r}, dtype, seed++, -0.3f, 0.3f);
            Tensor want = cpu.empty({N, O}, out_dtype, MemCategory::activations);
            const float threshold = threshold_for(outliers);
            cpu.int8_linear_forward(want, x, w.q, w.scales, threshold, pick_epilogue(parts, bias, h, B, scaling));
            std::vector<float> got = emu_test::same_under_schedules([&] {
              Tensor out = device_empty({N, O}, out_dtype), dbias = to_device(bias);
              Tensor dh = to_device(h), dB = to_device(B);
              const Int8Epilogue e = pick_epilogue(parts, dbias, dh, dB, scaling);
              if (chunk == 0)
                gpu.int8_linear_forward(out, to_device(x), to_device(w.q), to_device(w.scales), threshold, e);
              else
                cuda::int8_linear_forward(out, to_device(x), to_device(w.q), to_device(w.scales), threshold, e, chunk,
                                          2, kInt8FusedOutlierColumns, context());
              return values(out);
            });
            const std::vector<float> want_v = values(want);
            const bool bf16 = out_dtype == DType::bf16;
            check_close(got, want_v, bf16 ? kBf16 : Tolerance{1e-6, 1e-6});
            double& worst = bf16 ? worst_bf16 : worst_f32;
            worst = std::max(worst, worst_relative(got, want_v));
            for (size_t i = 0; i < got.size(); ++i) differing += std::memcmp(&got[i], &want_v[i], sizeof(float)) != 0;
            compared += got.size();
          }
  MESSAGE("int8_linear_forward with epilogue, worst relative error: f32 out ", worst_f32, ", bf16 out ", worst_bf16,
          "; ", differing, " of ", compared, " elements not bit-identical");
}

namespace {

struct BackwardCase {
  int64_t N, O, K, tile_columns;  // tile_columns 0: the backend's own (kernels/int8_tiles.h)
};

// sum_o |dout[n, o] * w[o, k]| (+ |dx0[n, k]| when accumulating): the scale
// of each dx element's rounding error.
std::vector<float> magnitudes(const Tensor& dout, const Int8Weight& w, const Tensor& dx0, bool accumulate) {
  const int64_t N = dout.rows(), O = dout.cols(), K = w.q.cols();
  std::vector<float> d = values(dout), x0 = values(dx0), out(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      double sum = accumulate ? std::abs(x0[size_t(n * K + k)]) : 0.0;
      for (int64_t o = 0; o < O; ++o)
        sum += std::abs(d[size_t(n * O + o)] * float(w.q.ptr<int8_t>()[o * K + k]) * w.scales.ptr<float>()[o] / 127.0f);
      out[size_t(n * K + k)] = float(sum);
    }
  return out;
}

}  // namespace

// The backward's tile kernel as an op of its own: every row, a column range;
// bf16 tiles at K, col0 and C multiples of 16 take its vector path.
TEST_CASE("cuda: int8_dequantize is bit-identical to the CPU's") {
  for (DType dtype : {DType::f32, DType::bf16})
    for (const auto& at : {std::array<int64_t, 4>{37, 301, 0, 301}, {37, 301, 45, 100}, {9, 64, 16, 32}}) {
      const int64_t O = at[0], K = at[1], col0 = at[2], C = at[3];
      CAPTURE(dtype_name(dtype));
      CAPTURE(K);
      CAPTURE(col0);
      const Int8Weight w = host_weight(O, K, unsigned(80 + K + col0));
      Tensor want = cpu.empty({O, C}, dtype, MemCategory::activations);
      cpu.int8_dequantize(want, w.q, w.scales, col0);
      std::vector<float> got = emu_test::same_under_schedules([&] {
        Tensor tile = device_empty({O, C}, dtype);
        gpu.int8_dequantize(tile, to_device(w.q), to_device(w.scales), col0);
        return values(tile);
      });
      CHECK(emu_test::bit_identical(got, values(want)));
    }
}

TEST_CASE("cuda: int8_linear_backward matches the CPU over ragged weight tiles") {
  // 301 columns in tiles of 64 (four whole, one of 45); 7 in tiles of 3 (3, 3, 1); one tile.
  const BackwardCase cases[] = {{5, 67, 301, 64}, {37, 130, 7, 3}, {3, 5, 64, 0}, {1, 3, 301, 0}};
  const std::pair<DType, DType> dtypes[] = {
      {DType::f32, DType::f32}, {DType::bf16, DType::bf16}, {DType::bf16, DType::f32}, {DType::f32, DType::bf16}};
  double worst[2][2] = {};  // [dout bf16][dx bf16]: max |got - want| / magnitude
  unsigned seed = 70;
  for (const BackwardCase& c : cases)
    for (const auto& dout_dx_dtypes : dtypes)
      for (bool accumulate : {false, true}) {
        const DType dout_dtype = dout_dx_dtypes.first, dx_dtype = dout_dx_dtypes.second;  // see above
        CAPTURE(c.N);
        CAPTURE(c.O);
        CAPTURE(c.K);
        CAPTURE(c.tile_columns);
        CAPTURE(dtype_name(dout_dtype));
        CAPTURE(dtype_name(dx_dtype));
        CAPTURE(accumulate);
        Tensor dout = host_random({c.N, c.O}, dout_dtype, seed++);
        Int8Weight w = host_weight(c.O, c.K, seed++);
        Tensor dx0 = host_random({c.N, c.K}, dx_dtype, seed++);
        Tensor want = host_copy(dx0);
        cpu.int8_linear_backward(want, dout, w.q, w.scales, accumulate);
        std::vector<float> got = emu_test::same_under_schedules([&] {
          Tensor dx = accumulate ? to_device(dx0) : device_empty({c.N, c.K}, dx_dtype);  // NaN when overwritten
          if (c.tile_columns == 0)
            gpu.int8_linear_backward(dx, to_device(dout), to_device(w.q), to_device(w.scales), accumulate);
          else
            cuda::int8_linear_backward(dx, to_device(dout), to_device(w.q), to_device(w.scales), accumulate,
                                       c.tile_columns, context());
          return values(dx);
        });
        const bool dout_bf16 = dout_dtype == DType::bf16, dx_bf16 = dx_dtype == DType::bf16;
        // Both backends dequantise into dout's dtype: only the f32 sums' order differs.
        const double rtol = dx_bf16 ? 1.0 / 128 : 1e-5, arel = 1e-6;
        std::vector<float> want_v = values(want), scale = magnitudes(dout, w, dx0, accumulate);
        size_t bad = 0, nan = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          const double error = std::abs(double(got[i]) - want_v[i]);
          nan += std::isnan(got[i]);
          bad += !(error <= 1e-7 + rtol * std::abs(want_v[i]) + arel * scale[i]);
          worst[dout_bf16][dx_bf16] = std::max(worst[dout_bf16][dx_bf16], error / std::max(1e-6f, scale[i]));
        }
        CHECK(nan == 0);
        CHECK(bad == 0);
      }
  MESSAGE("int8_linear_backward worst |error| / sum|dout w|: f32->f32 ", worst[0][0], ", f32->bf16 ", worst[0][1],
          ", bf16->f32 ", worst[1][0], ", bf16->bf16 ", worst[1][1]);
}

TEST_CASE("cuda: int8 linear argument checks") {
  Tensor x = to_device(host_random({2, 8}, DType::f32, 80));
  Int8Weight hw = host_weight(3, 8, 81);
  Tensor q = to_device(hw.q), scales = to_device(hw.scales), out = device_empty({2, 3}, DType::f32);
  CHECK_THROWS_WITH_AS(gpu.int8_linear_forward(out, x, q, scales, -1.0f), doctest::Contains("threshold"), Error);
  CHECK_THROWS_WITH_AS(gpu.int8_linear_forward(out, x, scales, scales, 6.0f), doctest::Contains("weight must be i8"),
                       Error);
  Tensor wrong = device_empty({2, 4}, DType::f32);
  CHECK_THROWS_WITH_AS(gpu.int8_linear_forward(wrong, x, q, scales, 6.0f), doctest::Contains("out has shape"), Error);
  CHECK_THROWS_WITH_AS(gpu.int8_linear_backward(out, out, q, scales, false), doctest::Contains("dx has shape"), Error);
  CHECK_THROWS_AS(gpu.int8_linear_forward(out, host_random({2, 8}, DType::f32, 82), q, scales, 6.0f), Error);
  Tensor h = device_empty({2, 4}, DType::f32), B = device_empty({3, 4}, DType::f32);
  Tensor host_bias = host_random({3}, DType::f32, 83);
  CHECK_THROWS_WITH_AS(gpu.int8_linear_forward(out, x, q, scales, 6.0f, {nullptr, &h}),
                       doctest::Contains("lora_h and lora_B come together"), Error);
  CHECK_THROWS_WITH_AS(gpu.int8_linear_forward(out, x, q, scales, 6.0f, {nullptr, &B, &B, 1.0f}),
                       doctest::Contains("lora_h has shape"), Error);
  CHECK_THROWS_WITH_AS(gpu.int8_linear_forward(out, x, q, scales, 6.0f, {&host_bias}),
                       doctest::Contains("bias must be a CUDA tensor"), Error);
  Tensor absmax = device_empty({2}, DType::f32), wrong_rows = device_empty({3}, DType::f32);
  Int8Epilogue given;
  given.row_absmax = &wrong_rows;
  CHECK_THROWS_WITH_AS(gpu.int8_linear_forward(out, x, q, scales, 6.0f, given),
                       doctest::Contains("row_absmax has shape"), Error);
  CHECK_THROWS_WITH_AS(gpu.int8_row_absmax(wrong_rows, x, 6.0f), doctest::Contains("absmax has shape"), Error);
  CHECK_THROWS_WITH_AS(gpu.int8_row_absmax(absmax, x, -1.0f), doctest::Contains("threshold"), Error);
  CHECK_NOTHROW(gpu.int8_row_absmax(absmax, x, 6.0f));
}

namespace {

// The fused forward's operands on the host, x [N, K] bf16 with `outliers`
// columns over the threshold of 6 (spread over the row, in different rows).
struct FusedCase {
  int64_t N, K, O, r, outliers;
  bool bias, bias_f32, given_input;
};

// Elements of got outside the fused bound (the header's) around want.
size_t outside_fused_bound(const std::vector<float>& got, const Tensor& want, const Tensor& x, const Int8Weight& w,
                           const Tensor* bias, const Tensor* h, const Tensor* B, float scaling, double* worst) {
  const int64_t N = x.rows(), K = x.cols(), O = w.q.rows();
  std::vector<int64_t> columns;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n)
      if (std::abs(load_as_f32(x.data, x.dtype, n * K + k)) >= 6.0f) {
        columns.push_back(k);
        break;
      }
  const std::vector<float> want_values = values(want);
  size_t outside = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      double scale = std::abs(double(want_values[size_t(n * O + o)]));
      for (int64_t k : columns)
        scale += std::abs(load_as_f32(x.data, x.dtype, n * K + k) * w.q.ptr<int8_t>()[o * K + k] *
                          double(w.scales.ptr<float>()[o]) / 127.0);
      if (bias) scale += std::abs(load_as_f32(bias->data, bias->dtype, o));
      for (int64_t j = 0; h && j < h->cols(); ++j)
        scale += std::abs(double(scaling) * load_as_f32(h->data, h->dtype, n * h->cols() + j) *
                          load_as_f32(B->data, B->dtype, o * h->cols() + j));
      const double error = std::abs(double(got[size_t(n * O + o)]) - want_values[size_t(n * O + o)]);
      *worst = std::max(*worst, error / scale);
      outside += !(error <= 4.0 / 256.0 * scale + 1e-30);
    }
  return outside;
}

}  // namespace

TEST_CASE("cuda: int8_linear_forward fused on an int8 GEMM engine is the CPU's within its roundings") {
  // Ragged N, K a multiple of 16 and O of 8 (the library kernel's rows),
  // outlier columns none, within the small GEMM's 3 columns here and past
  // them (added in place), LoRA ranks 0, 5 and 16, a bf16 or f32 bias, and
  // the input quantised by the forward or given to it. Under the emulator
  // the engine is ours; on an sm_90 GPU with CUTLASS built, CUTLASS's too.
  const FusedCase cases[] = {{37, 64, 40, 0, 0, false, false, false},  {37, 64, 40, 5, 2, true, false, false},
                             {19, 96, 24, 16, 7, true, true, false},   {5, 32, 8, 5, 3, false, false, true},
                             {64, 128, 136, 16, 11, true, false, true}};
  std::vector<cuda::Int8GemmEngine*> engines = {substitute.get()};
  std::unique_ptr<cuda::Int8GemmEngine> library = cuda::make_library_int8_gemm(device_allocator);
  if (library) engines.push_back(library.get());
  MESSAGE((std::string("engines: ours") + (library ? " and CUTLASS's" : "")));
  unsigned seed = 900;
  double worst = 0.0;
  for (cuda::Int8GemmEngine* engine : engines)
    for (const FusedCase& c : cases) {
      CAPTURE(engine == library.get());
      CAPTURE(c.N);
      CAPTURE(c.K);
      CAPTURE(c.outliers);
      CAPTURE(c.r);
      Tensor x = host_random({c.N, c.K}, DType::bf16, seed++, -2.0f, 2.0f);
      for (int64_t i = 0; i < c.outliers; ++i)
        store_from_f32(x.data, DType::bf16, (i * 5 % c.N) * c.K + (i * 13 + 3) % c.K, i % 2 ? -6.5f - i : 7.0f + i);
      Int8Weight w = host_weight(c.O, c.K, seed++);
      Tensor bias = host_random({c.O}, c.bias_f32 ? DType::f32 : DType::bf16, seed++);
      Tensor h = host_random({c.N, c.r}, DType::bf16, seed++, -2.0f, 2.0f);
      Tensor B = host_random({c.O, c.r}, DType::bf16, seed++, -0.3f, 0.3f);
      const float scaling = 0.75f;
      const Int8Epilogue host_epilogue{c.bias ? &bias : nullptr, c.r ? &h : nullptr, c.r ? &B : nullptr, scaling};
      Tensor want = cpu.empty({c.N, c.O}, DType::f32, MemCategory::activations);
      cpu.int8_linear_forward(want, x, w.q, w.scales, 6.0f, host_epilogue);

      Tensor dx = to_device(x), dq = to_device(w.q), dscales = to_device(w.scales);
      Tensor dbias = to_device(bias), dh = to_device(h), dB = to_device(B);
      Int8Epilogue e{c.bias ? &dbias : nullptr, c.r ? &dh : nullptr, c.r ? &dB : nullptr, scaling};
      Int8Input input{device_empty({c.N, c.K}, DType::i8), device_empty({c.N}, DType::f32),
                      device_empty({int8_outlier_list_elements(c.K)}, DType::i32)};
      if (c.given_input) {
        gpu.int8_quantize_input(input, dx, 6.0f);
        e.input = &input;
      }
      cuda::Int8Context fused = context();
      fused.int8_gemm = engine;
      Tensor out = device_empty({c.N, c.O}, DType::bf16);
      REQUIRE(cuda::int8_forward_runs_fused(out, dx, dq, dscales, e, fused));
      cuda::int8_linear_forward(out, dx, dq, dscales, 6.0f, e, c.N, c.K, /*fused_columns=*/3, fused);
      CHECK(outside_fused_bound(values(out), want, x, w, c.bias ? &bias : nullptr, c.r ? &h : nullptr,
                                c.r ? &B : nullptr, scaling, &worst) == 0);
      // The bound is tight enough to see a lost term: without LoRA, or with
      // the columns past the small GEMM's missed, it fails.
      if (c.r > 0 || c.outliers > 3) {
        Tensor missing = cpu.empty({c.N, c.O}, DType::f32, MemCategory::activations);
        const Int8Epilogue no_lora{c.bias ? &bias : nullptr};
        cpu.int8_linear_forward(missing, x, w.q, w.scales, c.r > 0 ? 6.0f : 0.0f, c.r > 0 ? no_lora : host_epilogue);
        double ignored = 0.0;
        CHECK(outside_fused_bound(values(missing), want, x, w, c.bias ? &bias : nullptr, c.r ? &h : nullptr,
                                  c.r ? &B : nullptr, scaling, &ignored) > 0);
      }
    }
  MESSAGE("fused forward: worst |got - want| / (|want| + |terms|) ", worst, " (bound 4 u = 0.0156)");
}

TEST_CASE("cuda: the fused forward runs only on bf16 x, out and h, and allocates what the planner charges") {
  const int64_t N = 21, K = 48, O = 32, r = 4;
  Tensor x = to_device(host_random({N, K}, DType::bf16, 950, -2.0f, 2.0f));
  Tensor q = to_device(host_codes({O, K}, 951)), scales = to_device(host_random({O}, DType::f32, 952, 0.2f, 0.8f));
  Tensor bias = to_device(host_random({O}, DType::bf16, 953)), h = to_device(host_random({N, r}, DType::bf16, 954));
  Tensor B = to_device(host_random({O, r}, DType::bf16, 955)), h32 = to_device(host_random({N, r}, DType::f32, 956));
  Tensor out = device_empty({N, O}, DType::bf16), out32 = device_empty({N, O}, DType::f32);
  cuda::Int8Context fused = context();
  fused.int8_gemm = substitute.get();
  CHECK(cuda::int8_forward_runs_fused(out, x, q, scales, {&bias, &h, &B, 1.0f}, fused));
  CHECK_FALSE(cuda::int8_forward_runs_fused(out32, x, q, scales, {}, fused));
  const Tensor x32 = to_device(host_random({N, K}, DType::f32, 957));
  CHECK_FALSE(cuda::int8_forward_runs_fused(out, x32, q, scales, {}, fused));
  CHECK_FALSE(cuda::int8_forward_runs_fused(out, x, q, scales, {&bias, &h32, &B, 1.0f}, fused));
  CHECK_FALSE(cuda::int8_forward_runs_fused(out, x, q, scales, {}, context()));
  // The library kernel's rows must be 16 bytes: K % 16, O % 8.
  CHECK(cuda::int8_scaled_gemm_takes(48, 32));
  CHECK_FALSE(cuda::int8_scaled_gemm_takes(40, 32));
  CHECK_FALSE(cuda::int8_scaled_gemm_takes(48, 36));

  // The fused forward's device memory at its peak is the meta backend's
  // charge for the call: with and without the input quantised, LoRA and bias.
  for (bool given : {false, true})
    for (bool lora : {false, true}) {
      CAPTURE(given);
      CAPTURE(lora);
      Int8Input input{device_empty({N, K}, DType::i8), device_empty({N}, DType::f32),
                      device_empty({int8_outlier_list_elements(K)}, DType::i32)};
      gpu.int8_quantize_input(input, x, 6.0f);
      Int8Epilogue e{&bias, lora ? &h : nullptr, lora ? &B : nullptr, 1.0f};
      if (given) e.input = &input;
      TrackingAllocator tracker(device_allocator);
      cuda::Int8Context tracked{*tiled, tracker, nullptr, substitute.get()};
      cuda::int8_linear_forward(out, x, q, scales, 6.0f, e, N, K, kInt8FusedOutlierColumns, tracked);

      MetaAllocator meta_allocator;
      TrackingAllocator meta_tracker(meta_allocator);
      MetaBackend meta(meta_tracker, MemoryPolicy::cuda, 0, false, /*library_int8_gemm=*/true);
      auto meta_tensor = [&](const Shape& shape, DType dtype) {
        return meta.empty(shape, dtype, MemCategory::activations);
      };
      Tensor mx = meta_tensor({N, K}, DType::bf16), mq = meta_tensor({O, K}, DType::i8);
      Tensor ms = meta_tensor({O}, DType::f32), mbias = meta_tensor({O}, DType::bf16);
      Tensor mh = meta_tensor({N, r}, DType::bf16), mB = meta_tensor({O, r}, DType::bf16);
      Tensor mout = meta_tensor({N, O}, DType::bf16);
      Int8Input minput{meta_tensor({N, K}, DType::i8), meta_tensor({N}, DType::f32),
                       meta_tensor({int8_outlier_list_elements(K)}, DType::i32), 6.0f};
      Int8Epilogue me{&mbias, lora ? &mh : nullptr, lora ? &mB : nullptr, 1.0f};
      if (given) me.input = &minput;
      meta_tracker.reset_peaks();
      const size_t before = meta_tracker.stats().total_current_bytes;
      meta.int8_linear_forward(mout, mx, mq, ms, 6.0f, me);
      CHECK(tracker.stats().total_peak_bytes > 0);
      CHECK(meta_tracker.stats().total_peak_bytes - before == tracker.stats().total_peak_bytes);
    }
}
