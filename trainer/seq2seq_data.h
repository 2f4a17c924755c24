// Seq2seq (T5) rows through the same loader as the causal models: a row is
// the encoder's tokens followed by the labels, the labels flagged for loss,
// so DataLoader shuffles, batches, pads and resumes it as any row (never
// packed: every row is one example). seq2seq_batch splits such a Batch back
// at each row's first target into the encoder input (right-padded, with its
// lengths for the padding mask) and the labels (-100 padding).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "trainer/data.h"

namespace ft {

// encode(prompt) + [eos] for the encoder, then encode(completion) + [eos] as
// labels (transformers' tokenizer(prompt), tokenizer(text_target=completion)).
// The row fits seq_len + 1 tokens: labels keep at most seq_len / 2 tokens,
// the prompt's beginning fills the rest (each part keeps its eos). truncated
// says whether anything was cut. (Text rows get their prompt from
// split_text_row first.)
TokenSequence tokenize_seq2seq_example(const Example& example, const Tokenizer& tokenizer, int64_t seq_len,
                                       int32_t eos_id, bool& truncated);

// A text row as an encoder input and labels: cut after the last occurrence
// of marker (which stays with the input), or, without marker or where it
// does not occur, at the word boundary nearest the middle (a prefix-LM
// objective).
std::pair<std::string, std::string> split_text_row(const std::string& text, const std::string& marker);

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
