// DoRA (PEFT's use_dora): y = x W^T + bias + (g - 1) xd W^T + g s h B^T
// (xd the dropped input, h = xd A^T) with g = magnitude / ||W + s B A|| per
// output row, the norm a constant in backward (DoRA paper section 4.3; PEFT
// detaches it). row_sum_squares gives the squared norms one column tile of
// W + s B A at a time; dora_scale_* add g's part to a linear's output and
// take its gradients.
//
// The magnitude gradient is reduced in the CUDA backend's order
// (kernels/cuda/dora.cu): row group k sums rows k, k + G, ... (G =
// cuda::partial_rows) into its own partials, one fma a term, then the
// partials are added in group order. So both backends give the same bits,
// whatever the thread count.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cuda/scratch.h"

namespace ft {
namespace {

// Per output column j: norm[j] = sqrt(weight_sum_squares[j]), scale[j] =
// magnitude[j] / norm[j] (g), bias[j] (0 without a bias).
struct DoraColumns {
  std::vector<float> norm, scale, bias;
};

DoraColumns dora_columns(const Tensor& magnitude, const Tensor& weight_sum_squares, const Tensor* bias) {
  const int64_t columns = magnitude.numel();
  DoraColumns c{std::vector<float>(columns), std::vector<float>(columns), std::vector<float>(columns, 0.0f)};
  cpu::load_row(c.norm.data(), weight_sum_squares, 0, columns);
  cpu::load_row(c.scale.data(), magnitude, 0, columns);
  if (bias) cpu::load_row(c.bias.data(), *bias, 0, columns);
  for (int64_t j = 0; j < columns; ++j) {
    c.norm[j] = std::sqrt(c.norm[j]);
    c.scale[j] /= c.norm[j];
  }
  return c;
}

}  // namespace

// One row per iteration, its columns summed in order.
void CpuBackend::row_sum_squares_impl(Tensor& sums, const Tensor& x, bool accumulate) {
  const int64_t rows = x.rows(), columns = x.cols();
  float* out = sums.ptr<float>();
#pragma omp parallel
  {
    std::vector<float> row(columns);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      cpu::load_row(row.data(), x, i * columns, columns);
      float sum = 0.0f;
      for (int64_t j = 0; j < columns; ++j) sum = std::fma(row[j], row[j], sum);
      out[i] = accumulate ? out[i] + sum : sum;
    }
  }
}

// z's row is loaded before out's is stored, so z may be out.
void CpuBackend::dora_scale_forward_impl(Tensor& out, const Tensor& z, const Tensor& magnitude,
                                         const Tensor& weight_sum_squares, const Tensor* bias) {
  const DoraColumns c = dora_columns(magnitude, weight_sum_squares, bias);
  const int64_t rows = out.rows(), columns = out.cols();
#pragma omp parallel
  {
    std::vector<float> row(columns), dropped(columns);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
      cpu::load_row(dropped.data(), z, n * columns, columns);
      cpu::load_row(row.data(), out, n * columns, columns);
      for (int64_t j = 0; j < columns; ++j) row[j] = std::fma(dropped[j] - c.bias[j], c.scale[j] - 1.0f, row[j]);
      cpu::store_row(out, n * columns, row.data(), columns);
    }
  }
}

// dout's row is loaded before dz's is stored, so dz may alias dout.
void CpuBackend::dora_scale_backward_impl(Tensor& dz, Tensor* dbase, Tensor* dmagnitude, const Tensor& dout,
                                          const Tensor& z, const Tensor& magnitude,
                                          const Tensor& weight_sum_squares, const Tensor* bias) {
  const int64_t rows = dout.rows(), columns = dout.cols();
  if (rows == 0) return;
  const DoraColumns c = dora_columns(magnitude, weight_sum_squares, bias);
  const int64_t groups = cuda::partial_rows(rows);
  std::vector<float> partials(dmagnitude ? groups * columns : 0, 0.0f);
#pragma omp parallel
  {
    std::vector<float> grad(columns), pre_scale(columns), base_grad(dbase ? columns : 0);
#pragma omp for schedule(static)
    for (int64_t k = 0; k < groups; ++k) {
      for (int64_t n = k; n < rows; n += groups) {
        cpu::load_row(grad.data(), dout, n * columns, columns);
        if (dmagnitude) {
          float* sum = partials.data() + k * columns;
          cpu::load_row(pre_scale.data(), z, n * columns, columns);
          for (int64_t j = 0; j < columns; ++j) sum[j] = std::fma(grad[j], pre_scale[j] - c.bias[j], sum[j]);
        }
        if (dbase) {
          for (int64_t j = 0; j < columns; ++j) base_grad[j] = grad[j] * (c.scale[j] - 1.0f);
          cpu::store_row(*dbase, n * columns, base_grad.data(), columns);
        }
        for (int64_t j = 0; j < columns; ++j) grad[j] *= c.scale[j];
        cpu::store_row(dz, n * columns, grad.data(), columns);
      }
    }
  }
  if (!dmagnitude) return;
  float* dm = dmagnitude->ptr<float>();
  for (int64_t j = 0; j < columns; ++j) {
    float total = 0.0f;
    for (int64_t k = 0; k < groups; ++k) total += partials[k * columns + j];
    dm[j] += total / c.norm[j];
  }
}

}  // namespace ft
