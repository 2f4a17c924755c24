// Seq2seq (T5) rows go through the same loader as the causal models: a row
// is the encoder's tokens followed by the labels, the labels flagged for
// loss (tokenize_seq2seq_example, data.h), so DataLoader shuffles, batches,
// pads and resumes it as any row (never packed: every row is one example).
// seq2seq_batch splits such a Batch back at each row's first target into the
// encoder input (right-padded, with its lengths for the padding mask) and
// the labels (-100 padding).
#pragma once
#include <cstdint>
#include <vector>

#include "trainer/data/data.h"

namespace ft {

// One micro-batch as T5Model takes it: host i32 tensors.
struct Seq2SeqBatch {
  Tensor encoder_ids;                    // [B, S], right-padded with pad_id
  std::vector<int32_t> encoder_lengths;  // per row, >= 1 (an empty row: one pad token)
  Tensor labels;                         // [B, T], -100 past each row's labels
  Tensor decoder_ids;                    // t5_decoder_inputs(labels)
};

// The encoder tokens of row b are input_ids[b, 0..p] where targets[b, p] is
// the row's first counted target; its labels are the counted targets from p.
Seq2SeqBatch seq2seq_batch(const Batch& batch, int64_t decoder_start_token_id, int32_t pad_id, HostAllocator& host);

}  // namespace ft
