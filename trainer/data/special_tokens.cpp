#include "trainer/data/special_tokens.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "kernels/error.h"
#include "model/json_input.h"
#include "tokenizer/tokenizer.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

int32_t token_id(const json& value, const char* key, const std::string& path, int64_t vocab_size) {
  FT_CHECK(value.is_number_integer(), path, ": \"", key, "\" must be a token id (an integer) or a list of them, got ",
           value.dump());
  // Unsigned first: get<int64_t> of a number above INT64_MAX would wrap.
  bool in_range = value.is_number_unsigned() ? value.get<uint64_t>() < uint64_t(vocab_size) : false;
  FT_CHECK(in_range, path, ": \"", key, "\" holds id ", value.dump(), ", outside the vocabulary [0, ", vocab_size, ")");
  return value.get<int32_t>();
}

void add_unique(std::vector<int32_t>& ids, int32_t id) {
  if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
}

bool is_special(const Tokenizer& tokenizer, int32_t id) { return tokenizer.decode({id}).empty(); }

// A token named in the config, by id or by its text (which must encode to
// exactly one token).
int32_t config_token(const TokenRef& token, const char* key, const TrainConfig& config, const Tokenizer& tokenizer,
                     int64_t vocab_size) {
  if (token.id >= 0) {
    FT_CHECK(token.id < vocab_size, config.source, ": ", key, ": token id ", token.id, " is outside the vocabulary [0, ",
             vocab_size, ") of ", config.model);
    return int32_t(token.id);
  }
  std::vector<int32_t> ids = tokenizer.encode(token.text);
  FT_CHECK(ids.size() == 1, config.source, ": ", key, ": \"", token.text, "\" is not one token of ", config.tokenizer,
           " (it encodes to ", ids.size(), " tokens)");
  return ids[0];
}

// The generation EOS ids, as transformers' generate() takes them.
std::vector<int32_t> checkpoint_eos_ids(const TrainConfig& config, const Tokenizer& tokenizer, int64_t vocab_size) {
  std::string config_path = (fs::path(config.model) / "config.json").string();
  std::string generation_path = (fs::path(config.model) / "generation_config.json").string();
  json model_file = read_json_object(config_path, "a Hugging Face config.json");
  token_ids_field(model_file, "bos_token_id", config_path, vocab_size);
  std::vector<int32_t> ids = token_ids_field(model_file, "eos_token_id", config_path, vocab_size);
  if (fs::exists(generation_path)) {
    json generation_file = read_json_object(generation_path, "a Hugging Face generation_config.json");
    token_ids_field(generation_file, "bos_token_id", generation_path, vocab_size);
    std::vector<int32_t> generation_ids = token_ids_field(generation_file, "eos_token_id", generation_path, vocab_size);
    if (!generation_ids.empty()) ids = generation_ids;
  }
  if (ids.empty() && tokenizer.eos_id() >= 0) ids.push_back(tokenizer.eos_id());
  return ids;
}

int32_t example_eos_id(const TrainConfig& config, const Tokenizer& tokenizer, int64_t vocab_size,
                       const std::vector<int32_t>& eos_ids) {
  const AddEos& add_eos = config.data.add_eos;
  if (!add_eos.enabled) return -1;
  if (!add_eos.from_checkpoint) return config_token(add_eos.token, "data.add_eos", config, tokenizer, vocab_size);
  bool tokenizer_eos_stops = std::find(eos_ids.begin(), eos_ids.end(), tokenizer.eos_id()) != eos_ids.end();
  if (tokenizer_eos_stops || eos_ids.empty()) return tokenizer.eos_id();
  return eos_ids[0];
}

}  // namespace

std::vector<int32_t> token_ids_field(const json& file, const char* key, const std::string& path, int64_t vocab_size) {
  std::vector<int32_t> ids;
  if (!file.contains(key) || file[key].is_null()) return ids;
  const json& value = file[key];
  if (!value.is_array()) return {token_id(value, key, path, vocab_size)};
  for (const json& item : value) add_unique(ids, token_id(item, key, path, vocab_size));
  return ids;
}

SpecialTokens resolve_special_tokens(const TrainConfig& config, const Tokenizer& tokenizer, int64_t vocab_size) {
  SpecialTokens tokens;
  tokens.stop_ids = checkpoint_eos_ids(config, tokenizer, vocab_size);
  tokens.example_eos_id = example_eos_id(config, tokenizer, vocab_size, tokens.stop_ids);
  add_unique(tokens.stop_ids, tokens.example_eos_id);
  for (const TokenRef& stop : config.generate.stop) {
    bool one_special_token = stop.id < 0 && tokenizer.encode(stop.text).size() == 1 &&
                             is_special(tokenizer, tokenizer.encode(stop.text)[0]);
    if (stop.id >= 0 || one_special_token)
      add_unique(tokens.stop_ids, config_token(stop, "generate.stop", config, tokenizer, vocab_size));
    else
      tokens.stop_strings.push_back(stop.text);
  }
  return tokens;
}

std::string describe(const SpecialTokens& tokens, const Tokenizer& tokenizer) {
  std::ostringstream text;
  auto token = [&](int32_t id) { return std::to_string(id) + " \"" + tokenizer.token_text(id) + "\""; };
  if (tokens.example_eos_id >= 0) text << "examples end with " << token(tokens.example_eos_id);
  else text << "examples end with no EOS";
  text << "; generation stops at [";
  for (size_t i = 0; i < tokens.stop_ids.size(); ++i) text << (i ? ", " : "") << token(tokens.stop_ids[i]);
  text << "]";
  for (const std::string& stop : tokens.stop_strings) text << " and text \"" << stop << "\"";
  return text.str();
}

}  // namespace ft
