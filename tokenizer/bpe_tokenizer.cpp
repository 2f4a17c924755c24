#include "tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>

#include "kernels/error.h"
#include "kernels/input_file.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/unicode.h"

namespace ft {
namespace {

using namespace json_fields;

const json& member(const json& object, const char* key) {
  static const json null_value;
  return object.is_object() && object.contains(key) ? object.at(key) : null_value;
}

int32_t token_id_value(const json& value, const std::string& source, const std::string& field) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > INT32_MAX)
    unsupported(source, field, value, "expected a non-negative 32-bit integer id");
  return value.get<int32_t>();
}

// One entry of model.merges: "left right" (tokenizers < 0.20) or ["left", "right"].
std::pair<std::string, std::string> merge_pair(const json& entry, const std::string& source,
                                               const std::string& field) {
  if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string())
    return {entry[0].get<std::string>(), entry[1].get<std::string>()};
  if (entry.is_string()) {
    const std::string& s = entry.get_ref<const std::string&>();
    size_t space = s.find(' ');
    if (space != std::string::npos && space > 0 && space + 1 < s.size() && s.find(' ', space + 1) == std::string::npos)
      return {s.substr(0, space), s.substr(space + 1)};
  }
  unsupported(source, field, entry, "expected \"left right\" (one space) or [\"left\", \"right\"]");
}

uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }

// transformers 5 keeps the vocabulary, merges and post-processor of a
// tokenizer.json whose tokenizer_config.json names one of these classes and
// builds the other stages from the class (models/*/tokenization_*.py):
// Llama-2 and Mistral's LlamaTokenizer has no normalizer, Metaspace with
// prepend_scheme "first" ("always" when legacy, "never" without
// add_prefix_space) and SentencePiece's decoder, stripping the first space
// only where one was prepended; GPT2Tokenizer, GPTNeoXTokenizer and
// Qwen2Tokenizer are byte-level with the config's add_prefix_space
// (default false). Null for other classes: the file's own stages.
json class_stages(const json& tokenizer_config, const std::string& config_source) {
  const json& name = member(tokenizer_config, "tokenizer_class");
  const auto is = [&](const char* base) { return name == base || name == std::string(base) + "Fast"; };
  const json nfc = {{"type", "NFC"}}, byte_level_decoder = {{"type", "ByteLevel"}};
  if (names_llama_class(tokenizer_config)) {
    const bool add_prefix_space = flag(tokenizer_config, "add_prefix_space", true, config_source, "add_prefix_space");
    const bool legacy = flag(tokenizer_config, "legacy", false, config_source, "legacy");
    const char* scheme = !add_prefix_space ? "never" : legacy ? "always" : "first";
    json decoders = json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                 {{"type", "ByteFallback"}},
                                 {{"type", "Fuse"}}});
    if (add_prefix_space) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    return {{"normalizer", nullptr},
            {"pre_tokenizer",
             {{"type", "Metaspace"},
              {"replacement", "\u2581"},
              {"prepend_scheme", scheme},
              {"split", false}}},
            {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}}};
  }
  if (!is("GPT2Tokenizer") && !is("GPTNeoXTokenizer") && !is("Qwen2Tokenizer")) return nullptr;
  const bool add_prefix_space = flag(tokenizer_config, "add_prefix_space", false, config_source, "add_prefix_space");
  if (is("Qwen2Tokenizer")) {
    const char* pattern = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
                          R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";  // PRETOKENIZE_REGEX
    const json split = {
        {"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
    const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"use_regex", false}};
    return {{"normalizer", nfc},
            {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}}},
            {"decoder", byte_level_decoder}};
  }
  return {{"normalizer", is("GPTNeoXTokenizer") ? nfc : json()},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"use_regex", true}}},
          {"decoder", byte_level_decoder}};
}

size_t utf8_length(char lead) {
  uint8_t b = uint8_t(lead);
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

}  // namespace

bool names_llama_class(const json& tokenizer_config) {
  const json& name = member(tokenizer_config, "tokenizer_class");
  return name == "LlamaTokenizer" || name == "LlamaTokenizerFast";
}

BpeTokenizer::BpeTokenizer(const std::string& path, int64_t expected_vocab_size)
    : BpeTokenizer(read_json_file(path), path, expected_vocab_size,
                   read_tokenizer_config(std::filesystem::path(path).parent_path().string()),
                   (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string()) {}

BpeTokenizer::~BpeTokenizer() = default;

BpeTokenizer::BpeTokenizer(const json& config, const std::string& source, int64_t expected_vocab_size,
                           const json& tokenizer_config, const std::string& config_source)
    : source_(source) {
  FT_CHECK(config.is_object(), source_, ": expected a Hugging Face tokenizer.json (a JSON object)");
  // A config.json or tokenizer_config.json given by mistake: name the file's kind, not a missing field.
  FT_CHECK(config.contains("model"), source_, ": not a Hugging Face tokenizer.json (no \"model\" section",
           config.contains("model_type") ? "; it looks like a model's config.json" : "",
           "): give the checkpoint's tokenizer.json or tokenizer.model");
  // The model first: a WordPiece or Unigram tokenizer.json is refused for that, not for a stage.
  read_model(required(config, "model", source_, "model"));
  const json rebuilt = class_stages(tokenizer_config, config_source);
  const json& stages = rebuilt.is_null() ? config : rebuilt;
  normalizer_ = std::make_unique<Normalizer>(member(stages, "normalizer"), source_, "normalizer");
  pre_tokenizer_ = std::make_unique<PreTokenizer>(member(stages, "pre_tokenizer"), source_, "pre_tokenizer");
  decoder_ = std::make_unique<Decoder>(member(stages, "decoder"), source_, "decoder");
  if (!member(config, "added_tokens").is_null()) read_added_tokens(config.at("added_tokens"));
  check_ids(expected_vocab_size);
  index_tokens();
  read_post_processor(member(config, "post_processor"), "post_processor");
  read_special_ids(config, tokenizer_config, config_source);
}

void BpeTokenizer::read_model(const json& model) {
  if (!model.is_object()) unsupported(source_, "model", model, "expected an object");
  if (model.contains("type") && model.at("type") != "BPE")
    unsupported(source_, "model.type", model.at("type"), "only \"BPE\" is supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& value = member(model, key);
    if (!value.is_null() && value != "")
      unsupported(source_, std::string("model.") + key, value,
                  "only null is supported (affixes of BPE subwords, used by no supported model family)");
  }
  // Ignored within its range: training data is tokenized once, deterministically (BPE-dropout samples merges).
  const json& dropout = member(model, "dropout");
  if (!dropout.is_null() && !(dropout.is_number() && dropout.get<double>() >= 0.0 && dropout.get<double>() <= 1.0))
    unsupported(source_, "model.dropout", dropout,
                "expected null or a number in [0, 1], as the tokenizers library reads it");
  fuse_unk_ = flag(model, "fuse_unk", false, source_, "model.fuse_unk");
  ignore_merges_ = flag(model, "ignore_merges", false, source_, "model.ignore_merges");
  byte_fallback_ = flag(model, "byte_fallback", false, source_, "model.byte_fallback");

  const json& vocab = required(model, "vocab", source_, "model.vocab");
  if (!vocab.is_object()) unsupported(source_, "model.vocab", vocab.type_name(), "expected an object {token: id}");
  vocab_.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items())
    vocab_[token] = token_id_value(id, source_, "model.vocab[" + json(token).dump() + "]");
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto it = vocab_.find(name);
    byte_fallback_ids_[size_t(b)] = it == vocab_.end() ? -1 : it->second;
  }

  const json& merges = required(model, "merges", source_, "model.merges");
  if (!merges.is_array()) unsupported(source_, "model.merges", merges.type_name(), "expected an array");
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    std::string field = "model.merges[" + std::to_string(rank) + "]";
    auto [left, right] = merge_pair(merges[rank], source_, field);
    auto l = vocab_.find(left), r = vocab_.find(right), merged = vocab_.find(left + right);
    if (l == vocab_.end() || r == vocab_.end() || merged == vocab_.end())
      unsupported(source_, field, merges[rank], "expected both tokens and their concatenation in model.vocab");
    // A pair given twice keeps its last rank, as the tokenizers library's merge map does.
    merges_[pair_key(l->second, r->second)] = {int32_t(rank), merged->second};
  }

  const json& unk = member(model, "unk_token");
  if (!unk.is_null()) {
    if (!unk.is_string() || !vocab_.count(unk.get<std::string>()))
      unsupported(source_, "model.unk_token", unk, "expected null or a token of model.vocab");
    unk_id_ = vocab_.at(unk.get<std::string>());
  }
}

void BpeTokenizer::read_added_tokens(const json& tokens) {
  if (!tokens.is_array()) unsupported(source_, "added_tokens", tokens.type_name(), "expected an array");
  for (size_t i = 0; i < tokens.size(); ++i) {
    const json& entry = tokens[i];
    std::string field = "added_tokens[" + std::to_string(i) + "]";
    const json& content = required(entry, "content", source_, field + ".content");
    if (!content.is_string() || content == "")
      unsupported(source_, field + ".content", content, "expected a non-empty string");
    AddedToken token;
    token.id = token_id_value(required(entry, "id", source_, field + ".id"), source_, field + ".id");
    token.special = flag(entry, "special", false, source_, field + ".special");
    token.normalized_match = flag(entry, "normalized", !token.special, source_, field + ".normalized");
    token.content = content.get<std::string>();
    unicode::decode_utf8(token.content, source_ + ": " + field + ".content");
    token.normalized = token.normalized_match ? normalizer_->apply(token.content) : token.content;
    for (const char* key : {"single_word", "lstrip", "rstrip"})
      if (flag(entry, key, false, source_, field + "." + key))
        unsupported(source_, field + "." + key, true, "only false is supported");
    if (!token.normalized.empty()) added_.push_back(std::move(token));
  }
}

void BpeTokenizer::check_ids(int64_t expected_vocab_size) const {
  // The largest id and its token, found before id_to_token_ is sized by it.
  int64_t largest = -1;
  std::string largest_field;
  const auto consider = [&](int32_t id, const std::string& field) {
    if (id > largest) largest = id, largest_field = field;
  };
  for (const auto& [token, id] : vocab_) consider(id, "model.vocab[" + json(token).dump() + "]");
  for (const AddedToken& token : added_) consider(token.id, "added_tokens entry " + json(token.content).dump());
  FT_CHECK(largest >= 0, source_, ": model.vocab is empty");
  FT_CHECK(expected_vocab_size <= 0 || largest < expected_vocab_size, source_, ": tokenizer ids go up to ", largest,
           " (", largest_field, ") but the model's vocab_size is ", expected_vocab_size);
  const int64_t tokens = int64_t(vocab_.size() + added_.size());
  FT_CHECK(largest < 2 * tokens + 1024, source_, ": ", largest_field, " has id ", largest, " but the file has only ",
           tokens, " tokens; ids this sparse are refused (the largest must be below 2 x tokens + 1024)");
}

void BpeTokenizer::index_tokens() {
  int32_t largest = 0;
  for (const auto& [token, id] : vocab_) largest = std::max(largest, id);
  for (const AddedToken& token : added_) largest = std::max(largest, token.id);
  id_to_token_.assign(size_t(largest) + 1, "");
  special_.assign(id_to_token_.size(), false);
  for (const auto& [token, id] : vocab_) id_to_token_[size_t(id)] = token;
  for (size_t i = 0; i < added_.size(); ++i) {
    const AddedToken& token = added_[i];
    // Decoding gives a normalized token its normalized form, as tokenizers 0.23 does.
    id_to_token_[size_t(token.id)] = token.normalized;
    special_[size_t(token.id)] = token.special;
    (token.normalized_match ? normalized_added_ : raw_added_)[uint8_t(token.normalized[0])].push_back(i);
  }
  for (AddedIndex* index : {&raw_added_, &normalized_added_})
    for (auto& candidates : *index)
      std::stable_sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
        return added_[a].normalized.size() > added_[b].normalized.size();
      });
}

int32_t BpeTokenizer::known_id(const json& value, const std::string& field) const {
  int32_t id = token_id_value(value, source_, field);
  FT_CHECK(size_t(id) < id_to_token_.size() && !id_to_token_[size_t(id)].empty(), source_, ": ", field, " is ", id,
           ", an id no token has");
  return id;
}

void BpeTokenizer::read_template(const json& stage, const std::string& field, std::vector<int32_t>& prefix,
                                 std::vector<int32_t>& suffix) const {
  const json& single = required(stage, "single", source_, field + ".single");
  const json& specials = required(stage, "special_tokens", source_, field + ".special_tokens");
  if (!single.is_array()) unsupported(source_, field + ".single", single, "expected an array of template pieces");
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& piece = single[i];
    if (piece.contains("Sequence") && member(piece.at("Sequence"), "id") == "A" && !seen_sequence) {
      seen_sequence = true;
      continue;
    }
    const json& name = member(member(piece, "SpecialToken"), "id");
    if (!name.is_string())
      unsupported(source_, field + ".single[" + std::to_string(i) + "]", piece,
                  "expected {\"SpecialToken\": {\"id\": ...}} or one {\"Sequence\": {\"id\": \"A\"}}");
    const std::string ids_field = field + ".special_tokens[" + name.dump() + "].ids";
    const json& ids = required(member(specials, name.get<std::string>().c_str()), "ids", source_, ids_field);
    if (!ids.is_array()) unsupported(source_, ids_field, ids, "expected an array");
    for (const json& id : ids) (seen_sequence ? suffix : prefix).push_back(known_id(id, ids_field));
  }
  if (!seen_sequence) unsupported(source_, field + ".single", single, "expected a {\"Sequence\": {\"id\": \"A\"}} piece");
}

void BpeTokenizer::read_post_processor(const json& stage, const std::string& field) {
  if (stage.is_null()) return;
  std::string type = stage_type(
      stage, {"TemplateProcessing", "RobertaProcessing", "BertProcessing", "ByteLevel", "Sequence"}, source_, field);
  if (type == "Sequence") {
    const json& list = required(stage, "processors", source_, field + ".processors");
    if (!list.is_array()) unsupported(source_, field + ".processors", list, "expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      read_post_processor(list[i], field + ".processors[" + std::to_string(i) + "]");
    return;
  }
  if (type == "ByteLevel") return;  // trims offsets only
  std::vector<int32_t> prefix, suffix;
  if (type == "TemplateProcessing") {
    read_template(stage, field, prefix, suffix);
  } else {  // RobertaProcessing, BertProcessing: cls $A sep
    for (const char* key : {"cls", "sep"}) {
      const json& pair = required(stage, key, source_, field + "." + key);
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string())
        unsupported(source_, field + "." + key, pair, "expected [token, id]");
      (std::string_view(key) == "cls" ? prefix : suffix).push_back(known_id(pair[1], field + "." + key + "[1]"));
    }
  }
  // Processors of a Sequence apply in turn, each around the result of the previous ones.
  prefix_ids_.insert(prefix_ids_.begin(), prefix.begin(), prefix.end());
  suffix_ids_.insert(suffix_ids_.end(), suffix.begin(), suffix.end());
}

void BpeTokenizer::read_special_ids(const json& config, const json& tokenizer_config, const std::string& config_source) {
  const auto special_named = [&](std::initializer_list<std::string_view> names) {
    for (std::string_view name : names)
      for (const AddedToken& token : added_)
        if (token.special && token.content == name) return token.id;
    return -1;
  };
  // tokenizer_config.json names tokens as strings or as {"content": ...} objects.
  const auto config_token = [&](const char* key) {
    const json& value = member(tokenizer_config, key);
    if (value.is_null()) return -1;
    const json& content = value.is_object() ? member(value, "content") : value;
    int32_t id = content.is_string() ? token_id(content.get<std::string>()) : -1;
    if (id < 0) unsupported(config_source, key, value, "expected a token of " + source_);
    return id;
  };
  const auto config_flag = [&](const char* key) {
    return member(tokenizer_config, key).is_null() ? -1 : int(flag(tokenizer_config, key, false, config_source, key));
  };
  // As transformers' update_post_processor: add_bos_token / add_eos_token rebuild the template.
  if (int add_bos = config_flag("add_bos_token"); add_bos >= 0)
    prefix_ids_ = add_bos ? std::vector<int32_t>{config_token("bos_token")} : std::vector<int32_t>{};
  if (int add_eos = config_flag("add_eos_token"); add_eos >= 0)
    suffix_ids_ = add_eos ? std::vector<int32_t>{config_token("eos_token")} : std::vector<int32_t>{};
  FT_CHECK(prefix_ids_.size() <= 1 && suffix_ids_.size() <= 1, source_, ": post_processor puts ", prefix_ids_.size(),
           " tokens before and ", suffix_ids_.size(), " after a text; at most one each (BOS, EOS) is supported");

  eos_id_ = config_token("eos_token");
  if (eos_id_ < 0) eos_id_ = suffix_ids_.empty() ? special_named({"<|endoftext|>", "</s>", "<eos>"}) : suffix_ids_[0];
  FT_CHECK(suffix_ids_.empty() || suffix_ids_[0] == eos_id_, source_, ": post_processor puts id ", suffix_ids_[0],
           " after a text but the eos token is id ", eos_id_);
  pad_id_ = config_token("pad_token");
  const json& padding = member(config, "padding");
  if (pad_id_ < 0 && !padding.is_null())
    pad_id_ = token_id_value(required(padding, "pad_id", source_, "padding.pad_id"), source_, "padding.pad_id");
  if (pad_id_ < 0) pad_id_ = special_named({"<|padding|>", "<pad>", "[PAD]"});
}

bool BpeTokenizer::is_added(int32_t id) const {
  return std::any_of(added_.begin(), added_.end(), [id](const AddedToken& token) { return token.id == id; });
}

std::vector<std::pair<std::string, std::string>> BpeTokenizer::merges() const {
  std::vector<std::pair<int32_t, uint64_t>> ranked;  // (rank, pair key)
  for (const auto& [key, merge] : merges_) ranked.emplace_back(merge.first, key);
  std::sort(ranked.begin(), ranked.end());
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const auto& [rank, key] : ranked)
    pairs.emplace_back(token_text(int32_t(key >> 32)), token_text(int32_t(key & 0xffffffffu)));
  return pairs;
}

int32_t BpeTokenizer::token_id(const std::string& token) const {
  for (const AddedToken& added : added_)
    if (added.content == token) return added.id;
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

std::vector<BpeTokenizer::Segment> BpeTokenizer::split_on_added(std::string_view text, bool at_start,
                                                                const AddedIndex& index) const {
  std::vector<Segment> segments;
  size_t text_start = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* match = nullptr;
    for (size_t candidate : index[uint8_t(text[i])])
      if (text.substr(i, added_[candidate].normalized.size()) == added_[candidate].normalized) {
        match = &added_[candidate];
        break;
      }
    if (!match) {
      i += utf8_length(text[i]);
      continue;
    }
    if (i > text_start) segments.push_back({text.substr(text_start, i - text_start), -1, at_start && text_start == 0});
    segments.push_back({{}, match->id, false});
    i += match->normalized.size();
    text_start = i;
  }
  if (text_start < text.size()) segments.push_back({text.substr(text_start), -1, at_start && text_start == 0});
  return segments;
}

std::vector<int32_t> BpeTokenizer::encode(const std::string& text) const {
  unicode::decode_utf8(text, "text to tokenize");  // refuses invalid UTF-8 before any work
  std::vector<int32_t> ids;
  // As tokenizers' AddedVocabulary: tokens with normalized=false are found in the raw text,
  // the others in each normalized stretch between them.
  for (const Segment& raw : split_on_added(text, true, raw_added_)) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    std::string normalized = normalizer_->apply(std::string(raw.text));
    std::vector<Piece> pieces;
    const auto flush = [&] {
      pre_tokenizer_->apply(pieces);
      for (const Piece& piece : pieces) encode_word(piece.text, ids);
      pieces.clear();
    };
    for (const Segment& segment : split_on_added(normalized, raw.at_start, normalized_added_)) {
      if (segment.id >= 0) {
        flush();
        ids.push_back(segment.id);
      } else {
        pieces.push_back({std::string(segment.text), segment.at_start});
      }
    }
    flush();
  }
  return ids;
}

std::vector<int32_t> BpeTokenizer::encode_with_special_tokens(const std::string& text) const {
  std::vector<int32_t> ids = prefix_ids_;
  std::vector<int32_t> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

void BpeTokenizer::encode_word(const std::string& word, std::vector<int32_t>& ids) const {
  if (ignore_merges_) {
    auto whole = vocab_.find(word);
    if (whole != vocab_.end()) {
      ids.push_back(whole->second);
      return;
    }
  }
  // A doubly linked list of symbols, merged lowest rank first (leftmost on ties) through a
  // queue of candidate pairs, as tokenizers' Word::merge_all does; stale entries are skipped.
  struct Symbol {
    int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  const auto add = [&](int32_t id) { symbols.push_back({id, int(symbols.size()) - 1, int(symbols.size()) + 1, true}); };
  // As tokenizers' BPE::merge_word: a character missing from the vocabulary becomes its
  // <0xXX> byte tokens (byte_fallback), else unk (consecutive ones fused if fuse_unk), else
  // nothing. A pending unk is emitted before the next known character (not before byte tokens).
  bool unk_pending = false;
  for (size_t i = 0; i < word.size();) {
    size_t length = utf8_length(word[i]);
    auto it = vocab_.find(word.substr(i, length));
    if (it != vocab_.end()) {
      if (unk_pending) add(unk_id_);
      unk_pending = false;
      add(it->second);
    } else if (byte_fallback_ && std::all_of(word.begin() + long(i), word.begin() + long(i + length),
                                             [&](char b) { return byte_fallback_ids_[uint8_t(b)] >= 0; })) {
      for (size_t k = i; k < i + length; ++k) add(byte_fallback_ids_[uint8_t(word[k])]);
    } else if (unk_id_ >= 0) {
      if (unk_pending && !fuse_unk_) add(unk_id_);
      unk_pending = true;
    }
    i += length;
  }
  if (unk_pending) add(unk_id_);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    int32_t rank;
    int pos;
    int32_t merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto push_pair = [&](int left) {
    if (left < 0 || symbols[size_t(left)].next < 0) return;
    auto it = merges_.find(pair_key(symbols[size_t(left)].id, symbols[size_t(symbols[size_t(left)].next)].id));
    if (it != merges_.end()) queue.push({it->second.first, left, it->second.second});
  };
  for (int i = 0; i + 1 < int(symbols.size()); ++i) push_pair(i);
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[size_t(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[size_t(left.next)];
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.second != top.merged) continue;  // the pair changed since
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) symbols[size_t(left.next)].prev = top.pos;
    push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : symbols)
    if (s.alive) ids.push_back(s.id);
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<std::string> tokens;
  for (int32_t id : ids) {
    FT_CHECK(id >= 0, source_, ": cannot decode negative id ", id);
    if (size_t(id) >= id_to_token_.size() || id_to_token_[size_t(id)].empty() || special_[size_t(id)]) continue;
    tokens.push_back(id_to_token_[size_t(id)]);
  }
  return decoder_->apply(std::move(tokens));
}

}  // namespace ft
