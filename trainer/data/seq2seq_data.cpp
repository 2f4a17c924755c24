#include "trainer/data/seq2seq_data.h"

#include <algorithm>

#include "kernels/error.h"
#include "model/t5.h"

namespace ft {

Seq2SeqBatch seq2seq_batch(const Batch& batch, int64_t decoder_start_token_id, int32_t pad_id, HostAllocator& host) {
  const int64_t B = batch.input_ids.dim(0), T = batch.input_ids.dim(1);
  const int32_t* inputs = batch.input_ids.ptr<int32_t>();
  const int32_t* targets = batch.targets.ptr<int32_t>();
  std::vector<int64_t> first(size_t(B), T), label_count(size_t(B), 0);  // first counted target, labels
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      if (targets[b * T + t] != kIgnoreIndex) {
        first[size_t(b)] = std::min(first[size_t(b)], t);
        label_count[size_t(b)] += 1;
      }
  Seq2SeqBatch out;
  int64_t S = 1, L = 1;
  for (int64_t b = 0; b < B; ++b) {
    out.encoder_lengths.push_back(int32_t(label_count[size_t(b)] ? first[size_t(b)] + 1 : 1));
    S = std::max<int64_t>(S, out.encoder_lengths.back());
    L = std::max(L, label_count[size_t(b)]);
  }
  out.encoder_ids = Tensor::empty({B, S}, DType::i32, host, MemCategory::activations);
  out.labels = Tensor::empty({B, L}, DType::i32, host, MemCategory::activations);
  std::fill_n(out.encoder_ids.ptr<int32_t>(), B * S, pad_id);
  std::fill_n(out.labels.ptr<int32_t>(), B * L, kIgnoreIndex);
  for (int64_t b = 0; b < B; ++b) {
    if (label_count[size_t(b)] == 0) continue;  // an empty row: one pad token, no labels
    std::copy_n(inputs + b * T, out.encoder_lengths[size_t(b)], out.encoder_ids.ptr<int32_t>() + b * S);
    std::copy_n(targets + b * T + first[size_t(b)], label_count[size_t(b)], out.labels.ptr<int32_t>() + b * L);
  }
  out.decoder_ids = t5_decoder_inputs(out.labels, decoder_start_token_id, pad_id, host);
  return out;
}

}  // namespace ft
