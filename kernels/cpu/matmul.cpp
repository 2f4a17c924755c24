// matmul: out[M,N] = alpha * op(a)[M,K] @ op(b)[K,N] + beta * out.
//
// BLIS-style blocking. For each KC-deep slice of K and NC-wide slice of N, op(b)
// is packed once into f32 panels of NR columns; each task packs an MC-row block
// of op(a) into f32 panels of MR rows and runs an MR x NR register-tile
// micro-kernel over pairs of panels. Packing converts bf16 to f32 and applies
// the transposes, so the micro-kernel only streams contiguous f32.
#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/onednn_gemm.h"

namespace ft {
namespace {

constexpr int64_t kMR = 6;              // tile rows: 6 x 2 accumulator vectors = 12 of 16 ymm registers
constexpr int64_t kNR = 16;             // tile columns: two 8-wide AVX vectors
constexpr int64_t kKC = 256;            // slice depth: one A panel (6 KiB) + one B panel (16 KiB) sit in L1
constexpr int64_t kMC = 72;             // rows per task: the packed A block (72 KiB) sits in L2
constexpr int64_t kNC = 1024;           // packed B slice width (1 MiB), shared by all threads
constexpr int64_t kNG = 256;            // columns per task, so small-M products still spread over threads
constexpr int64_t kOutChunkRows = 256;  // bf16 out: rows accumulated in f32 scratch at a time

typedef float f32x8 __attribute__((vector_size(32)));

// A row-major matrix read as "lanes" x depth: element (l, p) is x[l*ld + p], or
// x[p*ld + l] when transposed. op(a) is lanes = rows of the product; op(b) is
// read as its transpose, lanes = columns of the product.
struct Operand {
  const void* data;
  DType dtype;
  int64_t ld;
  bool transposed;
};

inline float to_f32(float x) { return x; }
inline float to_f32(uint16_t bf16_bits) { return bf16_to_f32(bf16_bits); }

// Packs lanes [lane0, lane0 + lanes) x depth [p0, p0 + depth) into panels of
// `width` lanes, each laid out depth-major (dst[panel][p][w]); short panels are
// zero padded so the micro-kernel never needs edge cases.
template <class T>
void pack_panels(float* dst, const T* x, int64_t ld, bool transposed, int64_t lane0, int64_t lanes, int64_t p0,
                 int64_t depth, int64_t width) {
  for (int64_t panel = 0; panel < lanes; panel += width) {
    int64_t used = std::min(width, lanes - panel);
    float* out = dst + panel * depth;
    for (int64_t p = 0; p < depth; ++p) {
      for (int64_t w = 0; w < used; ++w) {
        int64_t l = lane0 + panel + w, q = p0 + p;
        out[p * width + w] = to_f32(transposed ? x[q * ld + l] : x[l * ld + q]);
      }
      for (int64_t w = used; w < width; ++w) out[p * width + w] = 0.0f;
    }
  }
}

void pack(float* dst, const Operand& x, int64_t lane0, int64_t lanes, int64_t p0, int64_t depth, int64_t width) {
  if (x.dtype == DType::f32)
    pack_panels(dst, static_cast<const float*>(x.data), x.ld, x.transposed, lane0, lanes, p0, depth, width);
  else
    pack_panels(dst, static_cast<const uint16_t*>(x.data), x.ld, x.transposed, lane0, lanes, p0, depth, width);
}

// tile[MR][NR] = sum over k of the outer product of A panel column k and B panel row k.
void micro_kernel(int64_t depth, const float* ap, const float* bp, float* tile) {
  f32x8 acc[kMR][2] = {};
  for (int64_t k = 0; k < depth; ++k) {
    f32x8 b0, b1;
    std::memcpy(&b0, bp, sizeof(b0));
    std::memcpy(&b1, bp + 8, sizeof(b1));
    for (int r = 0; r < kMR; ++r) {
      acc[r][0] += ap[r] * b0;
      acc[r][1] += ap[r] * b1;
    }
    ap += kMR;
    bp += kNR;
  }
  std::memcpy(tile, acc, sizeof(acc));
}

// c = alpha * tile + beta * c over the rows x cols corner; beta == 0 never reads c (it may hold NaN).
void store_tile(float* c, int64_t ldc, const float* tile, int64_t rows, int64_t cols, float alpha, float beta) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      float value = alpha * tile[i * kNR + j];
      c[i * ldc + j] = beta == 0.0f ? value : value + beta * c[i * ldc + j];
    }
}

// c[M,N] (row stride ldc, f32) = alpha * op(a)[row0 : row0 + M, :] @ op(b) + beta * c.
void gemm_f32(float* c, int64_t ldc, const Operand& a, const Operand& b, int64_t row0, int64_t M, int64_t N,
              int64_t K, float alpha, float beta) {
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  std::vector<float> b_packed(size_t(kKC * ((std::min(kNC, N) + kNR - 1) / kNR) * kNR));
  for (int64_t p0 = 0; p0 < K; p0 += kKC) {
    int64_t kc = std::min(kKC, K - p0);
    float slice_beta = p0 == 0 ? beta : 1.0f;  // later K slices accumulate onto the first
    for (int64_t j0 = 0; j0 < N; j0 += kNC) {
      int64_t nc = std::min(kNC, N - j0);
      int64_t b_panels = (nc + kNR - 1) / kNR;
#pragma omp parallel for schedule(static)
      for (int64_t q = 0; q < b_panels; ++q)
        pack(b_packed.data() + q * kc * kNR, b, j0 + q * kNR, std::min(kNR, nc - q * kNR), p0, kc, kNR);
      int64_t m_blocks = (M + kMC - 1) / kMC, n_groups = (nc + kNG - 1) / kNG;
#pragma omp parallel
      {
        std::vector<float> a_packed(size_t(kMC * kKC));
        float tile[kMR * kNR];
#pragma omp for collapse(2) schedule(dynamic)
        for (int64_t ib = 0; ib < m_blocks; ++ib)
          for (int64_t jg = 0; jg < n_groups; ++jg) {
            int64_t i0 = ib * kMC, mc = std::min(kMC, M - i0);
            int64_t g0 = jg * kNG, g_end = std::min(g0 + kNG, nc);
            pack(a_packed.data(), a, row0 + i0, mc, p0, kc, kMR);
            for (int64_t j = g0; j < g_end; j += kNR)
              for (int64_t i = 0; i < mc; i += kMR) {
                micro_kernel(kc, a_packed.data() + i * kc, b_packed.data() + j * kc, tile);
                store_tile(c + (i0 + i) * ldc + j0 + j, ldc, tile, std::min(kMR, mc - i), std::min(kNR, nc - j),
                           alpha, slice_beta);
              }
          }
      }
    }
  }
}

// x as f32: x itself, or x widened (exactly: every bf16 is an f32) into
// buffer, host scratch that only grows, so steps after the first allocate
// nothing here (untracked, as the CPU kernels' other scratch).
Tensor widened(std::vector<float>& buffer, const Tensor& x) {
  if (x.dtype == DType::f32) return x;
  const int64_t count = x.numel();
  if (int64_t(buffer.size()) < count) buffer.resize(size_t(count));
  constexpr int64_t kBlock = 65536;
#pragma omp parallel for schedule(static) if (count >= 4 * kBlock)
  for (int64_t i0 = 0; i0 < count; i0 += kBlock)
    cpu::load_row(buffer.data() + i0, x, i0, std::min(kBlock, count - i0));
  return Tensor::view_of(buffer.data(), x.shape, DType::f32);
}

// oneDNN's f32 GEMM on bf16 operands widened to f32, where its bf16 kernels
// are slower (no native bf16 dot products, OnednnGemm::bf16_native) or absent
// (mixed f32 x bf16 inputs). The f32 products and sums are those of a bf16
// GEMM with f32 accumulation; only the summation order can differ. A bf16 out
// is computed in f32 and rounded once.
bool matmul_widened(OnednnGemm& onednn, Tensor& out, const Tensor& a, const Tensor& b, bool transpose_a,
                    bool transpose_b, float alpha, float beta) {
  const bool any_bf16 = a.dtype == DType::bf16 || b.dtype == DType::bf16;
  const bool native = a.dtype == b.dtype && onednn.bf16_native();
  auto widenable = [](DType t) { return t == DType::f32 || t == DType::bf16; };
  if (!any_bf16 || native || !widenable(a.dtype) || !widenable(b.dtype) || !widenable(out.dtype)) return false;
  static thread_local std::vector<float> a_buffer, b_buffer, out_buffer;
  const Tensor a32 = widened(a_buffer, a), b32 = widened(b_buffer, b);
  if (out.dtype == DType::f32) return onednn.matmul(out, a32, b32, transpose_a, transpose_b, alpha, beta);
  Tensor out32 = widened(out_buffer, out);  // read only when beta != 0
  if (!onednn.matmul(out32, a32, b32, transpose_a, transpose_b, alpha, beta)) return false;
  cpu::store_row(out, 0, out32.ptr<const float>(), out.numel());
  return true;
}

}  // namespace

void CpuBackend::matmul_impl(Tensor& out, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
                             float alpha, float beta) {
  const int64_t M = out.rows(), N = out.cols(), K = transpose_a ? a.rows() : a.cols();
  if (M == 0 || N == 0) return;
  OnednnGemm* onednn = onednn_ && onednn_->rows_independent() ? onednn_.get() : nullptr;
  if (onednn && matmul_widened(*onednn, out, a, b, transpose_a, transpose_b, alpha, beta)) {
    note_path("oneDNN f32 on widened bf16 ", onednn->last_kernel());
    return;
  }
  if (onednn && onednn->matmul(out, a, b, transpose_a, transpose_b, alpha, beta)) {
    note_path("oneDNN ", dtype_name(a.dtype), " ", onednn->last_kernel());
    return;
  }
  note_path("reference f32 tiles ", build_isa());
  Operand op_a{a.data, a.dtype, a.cols(), transpose_a};
  Operand op_b{b.data, b.dtype, b.cols(), !transpose_b};
  if (out.dtype == DType::f32) {
    gemm_f32(out.ptr<float>(), N, op_a, op_b, 0, M, N, K, alpha, beta);
    return;
  }
  // bf16 out: accumulate a band of rows in f32 and round once at the end.
  std::vector<float> band(size_t(std::min(M, kOutChunkRows) * N));
  for (int64_t r0 = 0; r0 < M; r0 += kOutChunkRows) {
    int64_t rows = std::min(kOutChunkRows, M - r0);
    if (beta != 0.0f) cpu::load_row(band.data(), out, r0 * N, rows * N);
    gemm_f32(band.data(), N, op_a, op_b, r0, rows, N, K, alpha, beta);
    cpu::store_row(out, r0 * N, band.data(), rows * N);
  }
}

}  // namespace ft
