// Softmax cross-entropy with ignore_index -100, the loss of causal LM fine-tuning.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/vec_exp.h"

namespace ft {

constexpr int32_t kIgnoreIndex = -100;

// Each row is loaded into f32 scratch before anything is written, so dlogits
// may alias logits.
void CpuBackend::cross_entropy_impl(Tensor& losses, Tensor* dlogits, const Tensor& logits, const Tensor& targets,
                                    float dloss, const Tensor* row_scales) {
  const char* op = "cross_entropy";
  int64_t rows = logits.rows(), vocab = logits.cols();
  const int32_t* target = targets.ptr<const int32_t>();
  for (int64_t n = 0; n < rows; ++n)  // before the parallel region: exceptions must not escape it
    FT_CHECK(target[n] == kIgnoreIndex || (target[n] >= 0 && target[n] < vocab), op, ": target ", target[n],
             " at row ", n, " is neither -100 nor in [0, ", vocab, ")");
  float* loss_out = losses.ptr<float>();
  const float* scales = row_scales ? row_scales->ptr<const float>() : nullptr;
#pragma omp parallel
  {
    std::vector<float> row(vocab);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
      if (target[n] == kIgnoreIndex) {
        loss_out[n] = 0.0f;
        if (dlogits) {
          std::fill(row.begin(), row.end(), 0.0f);
          cpu::store_row(*dlogits, n * vocab, row.data(), vocab);
        }
        continue;
      }
      cpu::load_row(row.data(), logits, n * vocab, vocab);
      float max_logit = *std::max_element(row.begin(), row.end());
      float target_logit = row[target[n]];
      // The exponentials are summed in f64: added one by one to an f32 sum,
      // the tens of thousands of small terms of a wide vocabulary lose their
      // low bits against the growing total and the loss comes out low. In
      // index order, never reassociated, so a row's loss does not depend on
      // its buffer's alignment (chunked and whole-batch losses agree bit for bit).
      for (int64_t i = 0; i < vocab; ++i) row[i] -= max_logit;
      cpu::exp_inplace(row.data(), vocab);
      double sum = 0.0;
      for (int64_t i = 0; i < vocab; ++i) sum += row[i];
      loss_out[n] = float(double(max_logit) - double(target_logit) + std::log(sum));
      if (!dlogits) continue;
      const double row_dloss = scales ? double(dloss) * double(scales[n]) : double(dloss);
      // The target's (p - 1) * dloss from the sum of the other terms: p * dloss
      // - dloss in f32 would cancel when p is near 1.
      float target_grad = float((double(row[target[n]]) - sum) / sum * row_dloss);
      float scale = float(row_dloss / sum);
      for (int64_t i = 0; i < vocab; ++i) row[i] *= scale;
      row[target[n]] = target_grad;
      cpu::store_row(*dlogits, n * vocab, row.data(), vocab);
    }
  }
}

}  // namespace ft
