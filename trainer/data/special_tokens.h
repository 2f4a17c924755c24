// Which token ends every training example and which tokens stop generation,
// read from the checkpoint as transformers reads it and overridden by the
// config (data.add_eos, generate.stop):
//
//   generation EOS ids  generation_config.json's eos_token_id (an id or a list),
//                       else config.json's, else the tokenizer's eos token;
//                       as transformers' generate(), which stops on any of them.
//   example EOS         the tokenizer's eos token (tokenizer_config.json's
//                       eos_token, which trl's SFTTrainer appends) when it is
//                       one of the generation EOS ids, else the first of those:
//                       a model trained to end with a token generation does not
//                       stop on would never stop. data.add_eos: false appends
//                       none; an id or a token's text picks one.
//   stop                the generation EOS ids, the example EOS, and
//                       generate.stop's ids and special tokens; its other texts
//                       stop a row once its decoded text contains them.
//
// The BOS stays the tokenizer's (add_bos_token or its post-processor), as in
// transformers, where bos_token_id of config.json is only used to start
// generation from nothing; it is read and checked all the same.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainer/train_config.h"

namespace ft {

class Tokenizer;

struct SpecialTokens {
  int32_t example_eos_id = -1;  // after every training example; -1 = none
  std::vector<int32_t> stop_ids;
  std::vector<std::string> stop_strings;
};

// file[key] as token ids: an integer or a list of integers, each in
// [0, vocab_size); absent or null gives none. Anything else is an Error
// naming path and key.
std::vector<int32_t> token_ids_field(const nlohmann::json& file, const char* key, const std::string& path,
                                     int64_t vocab_size);

// For the checkpoint folder config.model (config.json, and
// generation_config.json when present) and the run's tokenizer; vocab_size is
// the model's embedding size.
SpecialTokens resolve_special_tokens(const TrainConfig& config, const Tokenizer& tokenizer, int64_t vocab_size);

// One line for the log, each token by id and text: "examples end with 2 \"</s>\"; generation stops at [2 \"</s>\", 7 ...]".
std::string describe(const SpecialTokens& tokens, const Tokenizer& tokenizer);

}  // namespace ft
