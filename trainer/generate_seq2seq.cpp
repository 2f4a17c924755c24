#include "trainer/generate_seq2seq.h"

#include <algorithm>

#include "kernels/error.h"
#include "tokenizer/tokenizer.h"

namespace ft {
namespace {

// A host i32 [1, n] tensor holding ids.
Tensor row_tensor(const std::vector<int32_t>& ids, HostAllocator& host) {
  Tensor row = Tensor::empty({1, int64_t(ids.size())}, DType::i32, host, MemCategory::activations);
  std::copy(ids.begin(), ids.end(), row.ptr<int32_t>());
  return row;
}

}  // namespace

std::vector<std::vector<int32_t>> generate_seq2seq(T5Model& model, const std::vector<std::vector<int32_t>>& inputs,
                                                   const SamplingOptions& options, const StopCondition& stop,
                                                   const TokenCallback& on_token) {
  FT_CHECK(stop.strings.empty() || stop.tokenizer, "generate_seq2seq: stop strings need a tokenizer");
  const int64_t V = model.config().vocab_size;
  SamplerRng rng{options.seed};
  HostAllocator host;
  std::vector<std::vector<int32_t>> generated(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    FT_CHECK(!inputs[i].empty(), "generate_seq2seq: empty input ", i);
    model.encode(row_tensor(inputs[i], host));
    std::vector<int32_t> decoder_ids = {int32_t(model.config().decoder_start_token_id)};
    T5DecoderCache cache;
    if (options.kv_cache) cache = model.make_decoder_cache(std::max<int64_t>(options.max_new_tokens, 1));
    Tensor logits = Tensor::empty({V}, DType::f32, host, MemCategory::activations);
    while (int64_t(generated[i].size()) < options.max_new_tokens) {
      if (options.kv_cache) {
        model.decode_cached(cache, decoder_ids.back());
      } else {  // the whole decoder input again
        const std::vector<int32_t> ignored(decoder_ids.size(), -100);
        model.decode(row_tensor(decoder_ids, host), row_tensor(ignored, host));
      }
      const Tensor last = model.last_logits().slice_rows(model.last_logits().dim(0) - 1, 1);
      model.backend().copy(logits, last);
      const int32_t token = sample_token(logits.ptr<float>(), V, options, rng, decoder_ids);
      if (std::find(stop.ids.begin(), stop.ids.end(), token) != stop.ids.end()) {
        if (options.keep_stop_id) generated[i].push_back(token);
        break;
      }
      generated[i].push_back(token);
      decoder_ids.push_back(token);
      if (on_token) on_token(i, token);
      if (!stop.strings.empty() &&
          find_stop_string(stop.tokenizer->decode(generated[i]), stop.strings) != std::string::npos)
        break;
    }
  }
  return generated;
}

}  // namespace ft
