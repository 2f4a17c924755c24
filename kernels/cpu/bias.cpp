// Bias of a linear layer: added to every row of its output, and its gradient
// is the column sum of the output gradient.
#include <omp.h>

#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {

void CpuBackend::add_bias_impl(Tensor& out, const Tensor& bias) {
  int64_t rows = out.rows(), channels = out.cols();
#pragma omp parallel
  {
    std::vector<float> row(channels), b(channels);
    cpu::load_row(b.data(), bias, 0, channels);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
      cpu::load_row(row.data(), out, n * channels, channels);
      for (int64_t c = 0; c < channels; ++c) row[c] += b[c];
      cpu::store_row(out, n * channels, row.data(), channels);
    }
  }
}

// Each thread sums its rows into a private buffer; the buffers are added up
// after the parallel loop.
void CpuBackend::bias_backward_impl(Tensor& dbias, const Tensor& dout) {
  int64_t rows = dout.rows(), channels = dout.cols();
  int threads = omp_get_max_threads();
  std::vector<float> partial(threads * channels, 0.0f);
#pragma omp parallel
  {
    std::vector<float> row(channels);
    float* sum = partial.data() + omp_get_thread_num() * channels;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
      cpu::load_row(row.data(), dout, n * channels, channels);
      for (int64_t c = 0; c < channels; ++c) sum[c] += row[c];
    }
  }
  std::vector<float> acc(channels);
  cpu::load_row(acc.data(), dbias, 0, channels);
  for (int t = 0; t < threads; ++t)
    for (int64_t c = 0; c < channels; ++c) acc[c] += partial[t * channels + c];
  cpu::store_row(dbias, 0, acc.data(), channels);
}

}  // namespace ft
