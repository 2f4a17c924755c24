// Token embedding lookup and its gradient.
#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {

// Ids are validated before any parallel region: an exception must not escape one.
static void check_ids(const Tensor& ids, int64_t vocab, const char* op) {
  const int32_t* id = ids.ptr<const int32_t>();
  for (int64_t n = 0; n < ids.numel(); ++n)
    FT_CHECK(id[n] >= 0 && id[n] < vocab, op, ": id ", id[n], " at position ", n, " is outside the table [0, ",
             vocab, ")");
}

void CpuBackend::embedding_forward_impl(Tensor& out, const Tensor& ids, const Tensor& table) {
  const char* op = "embedding_forward";
  check_ids(ids, table.dim(0), op);
  int64_t tokens = ids.numel(), channels = table.dim(1);
  const int32_t* id = ids.ptr<const int32_t>();
#pragma omp parallel
  {
    std::vector<float> row(channels);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < tokens; ++n) {
      cpu::load_row(row.data(), table, int64_t(id[n]) * channels, channels);
      cpu::store_row(out, n * channels, row.data(), channels);
    }
  }
}

// Tokens with the same id add into the same table row, so threads split the
// channels instead of the tokens: no two threads ever touch the same element.
void CpuBackend::embedding_backward_impl(Tensor& dtable, const Tensor& ids, const Tensor& dout) {
  const char* op = "embedding_backward";
  check_ids(ids, dtable.dim(0), op);
  int64_t tokens = ids.numel(), channels = dtable.dim(1);
  const int32_t* id = ids.ptr<const int32_t>();
  constexpr int64_t kChannelBlock = 64;  // 256 bytes of f32: whole cache lines per thread
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < channels; c0 += kChannelBlock) {
    int64_t count = std::min(kChannelBlock, channels - c0);
    float grad[kChannelBlock], acc[kChannelBlock];
    for (int64_t n = 0; n < tokens; ++n) {
      int64_t at = int64_t(id[n]) * channels + c0;
      cpu::load_row(grad, dout, n * channels + c0, count);
      cpu::load_row(acc, dtable, at, count);
      for (int64_t c = 0; c < count; ++c) acc[c] += grad[c];
      cpu::store_row(dtable, at, acc, count);
    }
  }
}

}  // namespace ft
