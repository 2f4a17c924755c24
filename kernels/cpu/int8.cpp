// LLM.int8(): row-wise absmax quantisation, the forward product split into an
// int8 part and an f32 part for outlier input columns, and the input gradient
// through the dequantised frozen weight. The outlier rule is the paper's, not
// bitsandbytes': a row's scale is the absmax over its non-outlier columns
// only, where bitsandbytes drops only the entries >= threshold from it (the
// differences and their measured size: kernels/backend.h, int8_linear_forward).
//
// The int8 GEMM runs in oneDNN where the backend has it and the CPU sums int8
// products exactly (onednn_gemm.h); the result is the same int32 product.
// Otherwise: codes are in [-127, 127], so the product of two fits int16, and
// the reference GEMM runs on codes widened to int16: for an int16 dot product summed in
// int32 GCC emits pmaddwd (16 multiply-adds per AVX2 instruction), while for
// int8 operands it falls back to 16-bit multiplies plus widening adds.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/onednn_gemm.h"
#include "kernels/int8_tiles.h"

namespace ft {
namespace {

constexpr int64_t kXRowsPerTask = 128;     // rows of x per dot-tile task
constexpr int64_t kWRowsPerTask = 32;      // weight rows per dot-tile task, packed as int16 (64 KiB at K = 1024)
constexpr int64_t kMR = 3, kNR = 4;        // register tile: 3 x-rows by 4 weight rows = 12 vector accumulators
// The oneDNN path's epilogue tasks: rows x output columns of its int32
// product, each row's run 2 KiB, its f32 scratch in L1.
constexpr int64_t kEpilogueRows = 16, kEpilogueColumns = 512;
constexpr float kInv127Sq = 1.0f / (127.0f * 127.0f);

// max |x| over one row (0 for none); NaN entries are skipped, as std::max
// skips them. Sixteen running maxima, one per vector lane: a reduction into
// one variable does not vectorise without -ffast-math.
inline float row_absmax(const float* x, int64_t count) {
  float lanes[16] = {};
  int64_t k = 0;
  for (; k + 16 <= count; k += 16)
    for (int i = 0; i < 16; ++i) {
      const float a = std::fabs(x[k + i]);
      lanes[i] = a > lanes[i] ? a : lanes[i];
    }
  float absmax = 0.0f;
  for (; k < count; ++k) {
    const float a = std::fabs(x[k]);
    absmax = a > absmax ? a : absmax;
  }
  for (float lane : lanes) absmax = lane > absmax ? lane : absmax;
  return absmax;
}

// q = round-half-even(x * 127 / absmax) for one row, absmax >= every |x|
// (the row's own, or a row-parallel layer's whole row's): the rounding of
// the exact quotient, which is what a float64 reference computes, without a
// division per element. y = x * 127 and c * absmax are exact in double, and
// so is their difference, the remainder (at most 32 significant bits each;
// where c != 0 their exponents are at most 9 apart). A quotient that is not
// a tie lies at least 2^-34 from every half-way point, and the
// product with the reciprocal errs by under 2^-45, so c is its rounding; at
// a tie c may be either neighbour, the remainder is exactly +-absmax / 2,
// and one more round-half-even of c +- 0.5 picks the even one.
inline void quantize_row(int8_t* q, const float* x, int64_t count, float absmax) {
  if (absmax == 0.0f) {
    std::fill_n(q, count, int8_t(0));
    return;
  }
  const double s = absmax, half_s = 0.5 * s, inverse = 1.0 / s;
  for (int64_t k = 0; k < count; ++k) {
    const double y = double(x[k]) * 127.0;
    const double c = std::nearbyint(y * inverse);
    const double remainder = y - c * s;
    const double tie = std::fabs(remainder) == half_s ? std::copysign(0.5, remainder) : 0.0;
    q[k] = int8_t(std::nearbyint(c + tie));
  }
}

// flags[k] |= 1 where |x[n, k]| >= threshold, for one row n (row: scratch).
FT_AVX512_VERSIONS(void, flag_row, (int32_t* flags, const Tensor& x, int64_t n, float threshold, float* row),
                   (flags, x, n, threshold, row)) {
  const int64_t K = x.cols();
  cpu::load_row(row, x, n * K, K);
  for (int64_t k = 0; k < K; ++k) flags[k] |= int32_t(std::fabs(row[k]) >= threshold);
}

// flags[k] |= 1 where any |x[:, k]| >= threshold (threshold > 0).
void flag_outlier_columns(int32_t* flags, const Tensor& x, float threshold) {
  const int64_t N = x.rows(), K = x.cols();
  if (threshold <= 0.0f) return;
#pragma omp parallel
  {
    std::vector<float> row(K);
#pragma omp for schedule(static) reduction(| : flags[:K])
    for (int64_t n = 0; n < N; ++n) flag_row(flags, x, n, threshold, row.data());
  }
}

// The outlier input-feature columns, ascending: the given flags' (a whole
// batch's, x being some of its rows), else x's own, found anew on every
// call as bitsandbytes does: they depend on the batch.
std::vector<int32_t> outlier_columns(const Tensor& x, float threshold, const Tensor* given_flags) {
  const int64_t K = x.cols();
  std::vector<int32_t> own;
  const int32_t* flags = given_flags ? given_flags->ptr<const int32_t>() : nullptr;
  if (!flags) {
    own.assign(size_t(K), 0);
    flag_outlier_columns(own.data(), x, threshold);
    flags = own.data();
  }
  std::vector<int32_t> columns;
  for (int64_t k = 0; k < K; ++k)
    if (flags[k]) columns.push_back(int32_t(k));
  return columns;
}

// Row n's scale and (codes not null) codes, from x's row with its outlier
// columns zeroed, so outliers do not inflate the row scale (row: scratch).
// The scale is given_sx[n] where given, else the row's own absmax.
FT_AVX512_VERSIONS(void, quantize_input_row,
                   (int8_t* codes, float* sx, const Tensor& x, int64_t n, const int32_t* columns, int64_t C,
                    const float* given_sx, float* row),
                   (codes, sx, x, n, columns, C, given_sx, row)) {
  const int64_t K = x.cols();
  cpu::load_row(row, x, n * K, K);
  for (int64_t c = 0; c < C; ++c) row[columns[c]] = 0.0f;
  sx[n] = given_sx ? given_sx[n] : row_absmax(row, K);
  if (codes) quantize_row(codes + n * K, row, K, sx[n]);
}

// quantize_input_row over every row of x, in parallel.
void quantize_input_rows(int8_t* codes, float* sx, const Tensor& x, const std::vector<int32_t>& columns,
                         const float* given_sx) {
  const int64_t N = x.rows(), K = x.cols(), C = int64_t(columns.size());
#pragma omp parallel
  {
    std::vector<float> row(K);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) quantize_input_row(codes, sx, x, n, columns.data(), C, given_sx, row.data());
  }
}

// acc[i][j] = dot(a_i, b_j) over K int16 codes; rows of a and of b are K
// apart. Plain loops: GCC keeps the 12 sums in vector registers and
// vectorises them with pmaddwd (AVX-512: twice as wide; integer sums, exact
// in any grouping, so both versions give the same sums).
FT_AVX512_VERSIONS(void, dot_tile, (const int16_t* a, const int16_t* b, int64_t K, int32_t (*acc)[kNR]),
                   (a, b, K, acc)) {
  int32_t sum[kMR][kNR] = {};
  for (int64_t k = 0; k < K; ++k)
    for (int64_t i = 0; i < kMR; ++i)
      for (int64_t j = 0; j < kNR; ++j) sum[i][j] += int32_t(a[i * K + k]) * b[j * K + k];
  std::memcpy(acc, sum, sizeof(sum));
}

// The operands of one forward call, prepared once.
struct Int8Operands {
  int64_t N, K, O, C;           // C = number of outlier columns
  // x's input side: its own (the vectors) or a given Int8Input's.
  std::vector<int32_t> own_columns;
  std::vector<int8_t> own_codes;
  std::vector<float> own_sx;
  const int32_t* columns;       // [C] outlier columns, ascending
  const int8_t* xq8;            // [N, K] codes of x with outlier columns zeroed
  const float* sx;              // [N] their row scales
  // The oneDNN path: their int32 product with the weight for rows
  // [product_row0, product_row0 + product.size() / O). Otherwise dot_tile on
  // the codes widened to int16, with padding rows that let the last
  // register tile read past row N (results dropped).
  std::vector<int32_t> product;
  int64_t product_row0 = 0;
  std::vector<int16_t> xq;      // [N + kMR - 1, K]
  std::vector<float> x_out;     // [N, C] x's outlier columns
  std::vector<float> w_out;     // [C, O] dequantised weight columns, transposed so the update runs along O
  const int8_t* wq;             // [O, K]
  const float* sw;              // [O]
  // The epilogue's operands in f32 (kernels/backend.h's Int8Epilogue).
  std::vector<float> bias_values;  // [O] when there is a bias
  const float* bias = nullptr;     // bias_values' data, null: no bias
  int64_t r = 0;                // LoRA rank, 0: no LoRA update
  std::vector<float> lora_h;    // [N, r]
  std::vector<float> lora_Bt;   // [r, O]: B transposed so the sum over j runs along O
  float lora_scaling = 0.0f;
};

// x's input side for the call: the given Int8Input's, else made here as
// int8_quantize_input makes it (with the epilogue's given row scales or
// outlier flags, if any), into buffers reused from call to call.
void load_input(Int8Operands& p, const Tensor& x, float threshold, const Int8Epilogue& e) {
  if (e.input) {
    const int32_t* list = e.input->outlier_columns.ptr<const int32_t>();
    p.C = list[0];
    p.columns = list + 1;
    p.xq8 = e.input->codes.ptr<const int8_t>();
    p.sx = e.input->row_absmax.ptr<const float>();
    return;
  }
  p.own_columns = outlier_columns(x, threshold, e.outlier_flags);
  p.own_codes.resize(size_t(p.N * p.K));
  p.own_sx.resize(size_t(p.N));
  quantize_input_rows(p.own_codes.data(), p.own_sx.data(), x, p.own_columns,
                      e.row_absmax ? e.row_absmax->ptr<const float>() : nullptr);
  p.C = int64_t(p.own_columns.size());
  p.columns = p.own_columns.data();
  p.xq8 = p.own_codes.data();
  p.sx = p.own_sx.data();
}

// The outlier part's operands: x's outlier columns [N, C] and the weight's
// dequantised [C, O].
void load_outliers(Int8Operands& p, const Tensor& x) {
  p.x_out.resize(size_t(p.N * p.C));
  p.w_out.resize(size_t(p.C * p.O));
#pragma omp parallel for schedule(static) if (p.C > 0)
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t c = 0; c < p.C; ++c) cpu::load_row(&p.x_out[n * p.C + c], x, n * p.K + p.columns[c], 1);
  for (int64_t c = 0; c < p.C; ++c)
    for (int64_t o = 0; o < p.O; ++o) p.w_out[c * p.O + o] = float(p.wq[o * p.K + p.columns[c]]) * p.sw[o] / 127.0f;
}

// out[n, o0 : o0 + ob) from v, the row's dequantised int8 product (computed
// here from oneDNN's int32 product row when one is given), plus the outlier
// columns in f32 (explicit FMAs: the CUDA epilogue computes the same), plus
// the epilogue, in kernels/backend.h's
// order; one loop per term, so no product is contracted into the next
// term's sum. Stored in out's dtype.
FT_AVX512_VERSIONS(void, finish_row,
                   (Tensor& out, const Int8Operands& op, int64_t n, int64_t o0, int64_t ob, float* v,
                    const int32_t* product),
                   (out, op, n, o0, ob, v, product)) {
  if (product) {
    const float sx = op.sx[n];
    for (int64_t j = 0; j < ob; ++j) v[j] = float(product[j]) * (sx * op.sw[o0 + j] * kInv127Sq);
  }
  for (int64_t c = 0; c < op.C; ++c) {
    const float xv = op.x_out[n * op.C + c];
    const float* w = op.w_out.data() + c * op.O + o0;
    for (int64_t j = 0; j < ob; ++j) v[j] = std::fma(xv, w[j], v[j]);
  }
  if (op.bias)
    for (int64_t j = 0; j < ob; ++j) v[j] += op.bias[o0 + j];
  if (op.r > 0) {
    float sum[kEpilogueColumns] = {};
    for (int64_t i = 0; i < op.r; ++i) {
      const float hv = op.lora_h[n * op.r + i];
      const float* b = op.lora_Bt.data() + i * op.O + o0;
      for (int64_t j = 0; j < ob; ++j) sum[j] = std::fma(hv, b[j], sum[j]);
    }
    for (int64_t j = 0; j < ob; ++j) v[j] = std::fma(op.lora_scaling, sum[j], v[j]);
  }
  cpu::store_row(out, n * op.O + o0, v, ob);
}

// out rows [n0, n0 + nb) x columns [o0, o0 + ob) from oneDNN's int32 product.
void finish_block(Tensor& out, const Int8Operands& op, int64_t n0, int64_t nb, int64_t o0, int64_t ob) {
  float v[kEpilogueColumns];
  for (int64_t n = n0; n < n0 + nb; ++n)
    finish_row(out, op, n, o0, ob, v, op.product.data() + (n - op.product_row0) * op.O + o0);
}

// The same block summed by dot_tile on int16 codes, dequantised with
// s_x[n] * s_w[o] / 127^2, then finished.
void dot_block(Tensor& out, const Int8Operands& op, int64_t n0, int64_t nb, int64_t o0, int64_t ob) {
  const int64_t K = op.K;
  float tile[kXRowsPerTask][kWRowsPerTask];
  // Weight rows widened to int16, padded with zero rows to a multiple of kNR.
  std::vector<int16_t> wp(size_t(kWRowsPerTask * K), 0);
  for (int64_t j = 0; j < ob; ++j)
    for (int64_t k = 0; k < K; ++k) wp[j * K + k] = op.wq[(o0 + j) * K + k];
  for (int64_t i = 0; i < nb; i += kMR) {
    for (int64_t j = 0; j < ob; j += kNR) {
      int32_t acc[kMR][kNR];
      dot_tile(op.xq.data() + (n0 + i) * K, wp.data() + j * K, K, acc);
      for (int64_t r = 0; r < std::min(kMR, nb - i); ++r)
        for (int64_t c = 0; c < std::min(kNR, ob - j); ++c)
          tile[i + r][j + c] = float(acc[r][c]) * (op.sx[n0 + i + r] * op.sw[o0 + j + c] * kInv127Sq);
    }
  }
  for (int64_t i = 0; i < nb; ++i) finish_row(out, op, n0 + i, o0, ob, tile[i], nullptr);
}

// The epilogue's operands converted to f32 (checked by the caller).
void load_epilogue(Int8Operands& p, const Int8Epilogue& e) {
  p.bias = nullptr;  // p is reused from the previous call: every field is set here
  p.r = 0;
  if (e.bias) {
    p.bias_values.resize(size_t(p.O));
    cpu::load_row(p.bias_values.data(), *e.bias, 0, p.O);
    p.bias = p.bias_values.data();
  }
  if (!e.lora_h) return;
  p.r = e.lora_B->cols();
  p.lora_scaling = e.lora_scaling;
  p.lora_h.resize(size_t(p.N * p.r));
  cpu::load_row(p.lora_h.data(), *e.lora_h, 0, p.N * p.r);
  std::vector<float> B(size_t(p.O * p.r));
  cpu::load_row(B.data(), *e.lora_B, 0, p.O * p.r);
  p.lora_Bt.resize(B.size());
  for (int64_t o = 0; o < p.O; ++o)
    for (int64_t j = 0; j < p.r; ++j) p.lora_Bt[j * p.O + o] = B[o * p.r + j];
}

// One row of quantize_rows_int8 (row: scratch).
FT_AVX512_VERSIONS(void, quantize_weight_row, (Tensor& q, Tensor& scales, const Tensor& x, int64_t r, float* row),
                   (q, scales, x, r, row)) {
  const int64_t K = x.cols();
  cpu::load_row(row, x, r * K, K);
  const float absmax = row_absmax(row, K);
  scales.ptr<float>()[r] = absmax;
  quantize_row(q.ptr<int8_t>() + r * K, row, K, absmax);
}

// Row o of the backward's weight tile: codes [k0, k0 + kb) of weight row o
// dequantised, code * scale / 127 in f32, stored in the tile's dtype.
FT_AVX512_VERSIONS(void, dequantise_row,
                   (Tensor& tile, int64_t o, const int8_t* codes, float scale, int64_t kb, float* row),
                   (tile, o, codes, scale, kb, row)) {
  for (int64_t k = 0; k < kb; ++k) row[k] = float(codes[k]) * scale / 127.0f;
  cpu::store_row(tile, o * kb, row, kb);
}

}  // namespace

void CpuBackend::quantize_rows_int8_impl(Tensor& q, Tensor& scales, const Tensor& x) {
  const int64_t R = x.rows(), K = x.cols();
#pragma omp parallel
  {
    std::vector<float> row(K);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) quantize_weight_row(q, scales, x, r, row.data());
  }
  note_path(cpu::avx512_versions_isa());
}

void CpuBackend::int8_outlier_columns_impl(Tensor& flags, const Tensor& x, float threshold) {
  flag_outlier_columns(flags.ptr<int32_t>(), x, threshold);
  note_path(cpu::avx512_versions_isa());
}

void CpuBackend::int8_quantize_input_impl(Int8Input& input, const Tensor& x, float threshold,
                                          const Tensor* outlier_flags) {
  const int64_t K = x.cols();
  const std::vector<int32_t> columns = outlier_columns(x, threshold, outlier_flags);
  int32_t* list = input.outlier_columns.ptr<int32_t>();
  std::fill_n(list, int8_outlier_list_elements(K), 0);
  list[0] = int32_t(columns.size());
  std::copy(columns.begin(), columns.end(), list + 1);
  uint32_t* mask = reinterpret_cast<uint32_t*>(list + 1 + K);
  for (int32_t k : columns) mask[k / 32] |= 1u << (k % 32);
  quantize_input_rows(input.codes.ptr<int8_t>(), input.row_absmax.ptr<float>(), x, columns, nullptr);
  note_path(cpu::avx512_versions_isa());
}

void CpuBackend::int8_row_absmax_impl(Tensor& absmax, const Tensor& x, float threshold, const Tensor* outlier_flags) {
  quantize_input_rows(nullptr, absmax.ptr<float>(), x, outlier_columns(x, threshold, outlier_flags), nullptr);
  note_path(cpu::avx512_versions_isa());
}

void CpuBackend::int8_linear_forward_impl(Tensor& out, const Tensor& x, const Tensor& weight,
                                          const Tensor& weight_scales, float threshold, const Int8Epilogue& epilogue) {
  // The operands' buffers are reused from call to call (per calling thread:
  // the tensor-parallel tests run ranks as threads), grown and never shrunk,
  // so after a step's first calls none allocates or zeroes megabytes: fresh
  // buffers' page faults and zeroing took 7% of a 1 x 1,024 bf16 step.
  thread_local Int8Operands reused;
  Int8Operands& p = reused;
  p.N = x.rows(), p.K = x.cols(), p.O = weight.dim(0);
  load_epilogue(p, epilogue);
  p.wq = weight.ptr<const int8_t>();
  p.sw = weight_scales.ptr<const float>();
  load_input(p, x, threshold, epilogue);
  load_outliers(p, x);
  // oneDNN's exact s8 x s8 -> s32 product where this CPU has one, else dot_tile on int16 codes.
  const bool onednn_product = onednn_ && onednn_->int8_exact() && p.N > 0 && p.K > 0 && p.O > 0;
  if (!onednn_product) {
    p.xq.resize(size_t((p.N + kMR - 1) * p.K));
    std::copy(p.xq8, p.xq8 + p.N * p.K, p.xq.begin());
    std::fill(p.xq.begin() + p.N * p.K, p.xq.end(), int16_t(0));  // the padding rows
    const int64_t n_blocks = (p.N + kXRowsPerTask - 1) / kXRowsPerTask;
    const int64_t o_blocks = (p.O + kWRowsPerTask - 1) / kWRowsPerTask;
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int64_t ib = 0; ib < n_blocks; ++ib)
      for (int64_t jb = 0; jb < o_blocks; ++jb) {
        const int64_t n0 = ib * kXRowsPerTask, o0 = jb * kWRowsPerTask;
        dot_block(out, p, n0, std::min(kXRowsPerTask, p.N - n0), o0, std::min(kWRowsPerTask, p.O - o0));
      }
    note_path("int16 tiles (pmaddwd) and epilogue ", cpu::avx512_versions_isa());
    return;
  }
  // oneDNN's int32 product is held for a block of rows at a time.
  const int64_t chunk_rows = balanced_chunk_rows(p.N, kInt8CpuProductChunkElements / std::max<int64_t>(1, p.O));
  for (int64_t r0 = 0; r0 < p.N; r0 += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, p.N - r0);
    p.product.resize(size_t(rows * p.O));
    p.product_row0 = r0;
    onednn_->int8_product(p.product.data(), p.xq8 + r0 * p.K, p.wq, rows, p.K, p.O);
    const int64_t n_blocks = (rows + kEpilogueRows - 1) / kEpilogueRows;
    const int64_t o_blocks = (p.O + kEpilogueColumns - 1) / kEpilogueColumns;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t ib = 0; ib < n_blocks; ++ib)
      for (int64_t jb = 0; jb < o_blocks; ++jb) {
        const int64_t n0 = r0 + ib * kEpilogueRows, o0 = jb * kEpilogueColumns;
        finish_block(out, p, n0, std::min(kEpilogueRows, r0 + rows - n0), o0, std::min(kEpilogueColumns, p.O - o0));
      }
  }
  note_path("oneDNN s8 ", onednn_->last_kernel(), ", epilogue ", cpu::avx512_versions_isa());
}

void CpuBackend::int8_dequantize_impl(Tensor& tile, const Tensor& weight, const Tensor& weight_scales, int64_t col0) {
  const int64_t O = tile.rows(), C = tile.cols(), K = weight.dim(1);
  const int8_t* wq = weight.ptr<const int8_t>();
  const float* sw = weight_scales.ptr<const float>();
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t o = 0; o < O; ++o) dequantise_row(tile, o, wq + o * K + col0, sw[o], C, row.data());
  }
  note_path(cpu::avx512_versions_isa());
}

// dx is computed one block of input-feature columns at a time (tiles from
// kernels/int8_tiles.h): dx[:, k0:k1] = dout @ dequant(W[:, k0:k1]), the tile
// dequantised into f32, or into bf16 for bf16 dout (the GPU's tile, value for
// value: so the product runs on native bf16 dot products where the CPU has
// them, and is widened exactly to f32 elsewhere), and the block summed in an
// f32 [N, kb] buffer, so the scratch stays a few MiB however large the layer
// (no full copy of W or of dx), and each element of dx is one f32 sum
// rounded once. Where one tile holds every column, the GEMM writes dx itself
// (f32 sums, each rounded once into dx's dtype).
void CpuBackend::int8_linear_backward_impl(Tensor& dx, const Tensor& dout, const Tensor& weight,
                                           const Tensor& weight_scales, bool accumulate) {
  int64_t N = dout.rows(), O = dout.cols(), K = weight.dim(1);
  if (N == 0 || K == 0) return;
  int64_t columns = int8_backward_tile_columns(O, K);
  const DType tile_dtype = int8_backward_cpu_tile_dtype(dout.dtype);
  Tensor w_tile = empty({O, columns}, tile_dtype, MemCategory::workspace);
  const bool whole = columns == K;
  Tensor dx_block = whole ? Tensor{} : empty({N, columns}, DType::f32, MemCategory::workspace);
  const int8_t* wq = weight.ptr<const int8_t>();
  const float* sw = weight_scales.ptr<const float>();
  Tensor dx2 = dx.reshaped({N, K});
  for (int64_t k0 = 0; k0 < K; k0 += columns) {
    int64_t kb = std::min(columns, K - k0);
    Tensor w = Tensor::view_of(w_tile.data, {O, kb}, tile_dtype);
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(kb));
#pragma omp for schedule(static)
      for (int64_t o = 0; o < O; ++o) dequantise_row(w, o, wq + o * K + k0, sw[o], kb, row.data());
    }
    if (whole) {
      matmul(dx2, dout, w, false, false, 1.0f, accumulate ? 1.0f : 0.0f);
      break;
    }
    Tensor block = Tensor::view_of(dx_block.data, {N, kb}, DType::f32);
    if (accumulate) copy_columns(block, 0, dx2, k0, kb);
    matmul(block, dout, w, false, false, 1.0f, accumulate ? 1.0f : 0.0f);
    copy_columns(dx2, k0, block, 0, kb);
  }
}

}  // namespace ft
