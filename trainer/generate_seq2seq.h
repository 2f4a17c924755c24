// Generation with an encoder-decoder model (T5): each input is encoded once
// (T5Model::encode keeps the encoder's output), then the decoder runs from
// decoder_start_token_id, and each next token is picked from the last
// position's logits as generate() picks it (greedy, or temperature + top-p,
// trainer/generate.h). With options.kv_cache (the default) the decoder runs
// one token per step against its key/value cache (T5Model::decode_cached:
// self-attention keys and values cached per layer, cross-attention's
// computed once from the encoder output); without, it reruns over its tokens
// so far. Inputs run one at a time (the decoder cache holds one row). The
// repetition penalty applies to the decoder's tokens (decoder_start_token_id
// and what was generated), as transformers' does for an encoder-decoder model.
#pragma once
#include <cstdint>
#include <vector>

#include "model/t5.h"
#include "trainer/generate.h"

namespace ft {

// The new tokens of every input, each ending before the first of stop.ids
// (returned with options.keep_stop_id), once its text holds one of
// stop.strings, or after options.max_new_tokens; on_token streams them, as
// generate()'s does.
std::vector<std::vector<int32_t>> generate_seq2seq(T5Model& model, const std::vector<std::vector<int32_t>>& inputs,
                                                   const SamplingOptions& options, const StopCondition& stop,
                                                   const TokenCallback& on_token = {});

}  // namespace ft
