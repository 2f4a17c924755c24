#include "tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>

#include "kernels/error.h"
#include "tokenizer/unicode.h"

namespace ft {
namespace {

using nlohmann::json;

// GPT-2's reversible byte -> character map: printable Latin-1 bytes stand for themselves, the
// others (control characters, space, 0x7F-0xA0, 0xAD) for U+0100 onwards, in byte order. BPE
// runs on these characters, so a token never contains a raw space or control byte.
const std::array<char32_t, 256>& byte_to_char() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[size_t(b)] = printable ? char32_t(b) : next++;
    }
    return t;
  }();
  return table;
}

// The inverse of byte_to_char: -1 for characters that stand for no byte.
int char_to_byte(char32_t c) {
  static const std::vector<int> table = [] {
    std::vector<int> t(324, -1);  // byte_to_char's largest character is U+0143
    for (int b = 0; b < 256; ++b) t[byte_to_char()[size_t(b)]] = b;
    return t;
  }();
  return c < table.size() ? table[c] : -1;
}

std::string byte_level(std::string_view bytes) {
  std::string out;
  for (char b : bytes) unicode::append_utf8(out, byte_to_char()[uint8_t(b)]);
  return out;
}

// The end of the piece that starts at `i` under the GPT-2 split pattern, which HF's ByteLevel
// pre-tokenizer applies with Oniguruma:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Matched by hand (std::regex has no \p{..} classes): the first alternative that matches wins,
// each greedy, so the only backtracking is \s+(?!\S) giving back one whitespace character.
size_t gpt2_piece_end(std::u32string_view t, size_t i) {
  enum class Kind { letter, number, space, other };
  const auto kind = [](char32_t c) {
    if (unicode::is_whitespace(c)) return Kind::space;
    if (unicode::is_letter(c)) return Kind::letter;
    if (unicode::is_number(c)) return Kind::number;
    return Kind::other;
  };
  const size_t n = t.size();
  if (t[i] == '\'') {
    for (std::u32string_view suffix : {U"s", U"t", U"re", U"ve", U"m", U"ll", U"d"})
      if (t.substr(i + 1, suffix.size()) == suffix) return i + 1 + suffix.size();
  }
  // ` ?X+`: an optional plain space, then a run of one non-space kind.
  size_t start = (t[i] == ' ' && i + 1 < n && kind(t[i + 1]) != Kind::space) ? i + 1 : i;
  Kind k = kind(t[start]);
  if (k != Kind::space) {
    size_t end = start + 1;
    while (end < n && kind(t[end]) == k) ++end;
    return end;
  }
  size_t end = i + 1;
  while (end < n && kind(t[end]) == Kind::space) ++end;
  // \s+(?!\S): a run that ends the text, or the run minus its last character, which then
  // starts the next piece (" world"); a single whitespace before a non-space is \s+.
  if (end == n || end - i == 1) return end;
  return end - 1;
}

// Error helpers: every message names the file, the field and what is supported.
[[noreturn]] void unsupported(const std::string& source, const std::string& field, const json& value,
                              const std::string& expected) {
  fail(source, ": ", field, " is ", value.dump(), "; ", expected);
}

const json& required(const json& object, const char* key, const std::string& source, const std::string& field) {
  FT_CHECK(object.is_object() && object.contains(key), source, ": ", field, " is missing");
  return object.at(key);
}

bool flag(const json& object, const char* key, bool fallback, const std::string& source, const std::string& field) {
  if (!object.contains(key) || object.at(key).is_null()) return fallback;
  const json& value = object.at(key);
  if (!value.is_boolean()) unsupported(source, field, value, "expected true or false");
  return value.get<bool>();
}

// The "type" of a pipeline stage ("" for null), refused unless it is one of `allowed`.
std::string stage_type(const json& config, const char* key, std::initializer_list<std::string_view> allowed,
                       bool null_allowed, const std::string& source) {
  std::string expected = "supported: ";
  for (std::string_view a : allowed) expected.append("\"").append(a).append("\", ");
  expected += null_allowed ? "or null" : "nothing else";
  const json& stage = config.contains(key) ? config.at(key) : json();
  if (stage.is_null()) {
    if (!null_allowed) unsupported(source, key, stage, expected);
    return "";
  }
  if (!stage.is_object() || !stage.contains("type") || !stage.at("type").is_string())
    unsupported(source, key, stage, "expected an object with a \"type\"; " + expected);
  std::string type = stage.at("type").get<std::string>();
  if (std::find(allowed.begin(), allowed.end(), type) == allowed.end())
    unsupported(source, std::string(key) + ".type", stage.at("type"), expected);
  return type;
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

json read_json_file(const std::string& path) {
  std::ifstream file(path);
  FT_CHECK(file, path, ": cannot open tokenizer file");
  try {
    return json::parse(file);
  } catch (const json::exception& e) {
    fail(path, ": not valid JSON (", e.what(), ")");
  }
}

}  // namespace

std::vector<std::string> gpt2_split(std::string_view text) {
  std::u32string chars = unicode::decode_utf8(text, "text to split");
  std::u32string_view view(chars);
  std::vector<std::string> pieces;
  for (size_t begin = 0; begin < view.size();) {
    size_t end = gpt2_piece_end(view, begin);
    pieces.push_back(unicode::encode_utf8(view.substr(begin, end - begin)));
    begin = end;
  }
  return pieces;
}

BpeTokenizer::BpeTokenizer(const std::string& path, int64_t expected_vocab_size)
    : BpeTokenizer(read_json_file(path), path, expected_vocab_size) {}

BpeTokenizer::BpeTokenizer(const json& config, const std::string& source, int64_t expected_vocab_size)
    : source_(source) {
  FT_CHECK(config.is_object(), source_, ": expected a Hugging Face tokenizer.json (a JSON object)");
  read_pipeline(config);
  read_model(required(config, "model", source_, "model"));
  if (config.contains("added_tokens") && !config.at("added_tokens").is_null())
    read_added_tokens(config.at("added_tokens"));
  index_added_tokens();
  choose_special_ids(config);
  check_fits(expected_vocab_size);
}

void BpeTokenizer::read_pipeline(const json& config) {
  nfc_ = stage_type(config, "normalizer", {"NFC"}, true, source_) == "NFC";
  stage_type(config, "pre_tokenizer", {"ByteLevel"}, false, source_);
  const json& pre = config.at("pre_tokenizer");
  // Defaults as in tokenizers' ByteLevel::default(), for files that omit the fields.
  add_prefix_space_ = flag(pre, "add_prefix_space", true, source_, "pre_tokenizer.add_prefix_space");
  use_regex_ = flag(pre, "use_regex", true, source_, "pre_tokenizer.use_regex");
  stage_type(config, "post_processor", {"ByteLevel"}, true, source_);
  stage_type(config, "decoder", {"ByteLevel"}, false, source_);
}

void BpeTokenizer::read_model(const json& model) {
  if (!model.is_object()) unsupported(source_, "model", model, "expected an object");
  if (model.contains("type") && model.at("type") != "BPE")
    unsupported(source_, "model.type", model.at("type"), "only \"BPE\" (byte-level) is supported");
  // Options that change how words split into tokens, which byte-level BPE models leave unset.
  for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!model.contains(key)) continue;
    const json& value = model.at(key);
    bool unset = value.is_null() || value == "" || (std::string_view(key) == "dropout" && value == 0);
    if (!unset) unsupported(source_, std::string("model.") + key, value, "only null is supported");
  }
  if (flag(model, "byte_fallback", false, source_, "model.byte_fallback"))
    unsupported(source_, "model.byte_fallback", true, "only false is supported (byte-level BPE needs no fallback)");
  fuse_unk_ = flag(model, "fuse_unk", false, source_, "model.fuse_unk");
  ignore_merges_ = flag(model, "ignore_merges", false, source_, "model.ignore_merges");

  const json& vocab = required(model, "vocab", source_, "model.vocab");
  if (!vocab.is_object()) unsupported(source_, "model.vocab", vocab.type_name(), "expected an object {token: id}");
  for (const auto& [token, id] : vocab.items()) {
    int32_t value = token_id_value(id, source_, "model.vocab[\"" + token + "\"]");
    vocab_[token] = value;
    if (size_t(value) >= id_to_token_.size()) id_to_token_.resize(size_t(value) + 1);
    id_to_token_[size_t(value)] = token;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(byte_level(std::string(1, char(b))));
    byte_ids_[size_t(b)] = it == vocab_.end() ? -1 : it->second;
  }

  const json& merges = required(model, "merges", source_, "model.merges");
  if (!merges.is_array()) unsupported(source_, "model.merges", merges.type_name(), "expected an array");
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    std::string field = "model.merges[" + std::to_string(rank) + "]";
    auto [left, right] = merge_pair(merges[rank], source_, field);
    auto l = vocab_.find(left), r = vocab_.find(right), merged = vocab_.find(left + right);
    if (l == vocab_.end() || r == vocab_.end() || merged == vocab_.end())
      unsupported(source_, field, merges[rank], "expected both tokens and their concatenation in model.vocab");
    merges_[pair_key(l->second, r->second)] = {int32_t(rank), merged->second};
  }

  const json unk = model.contains("unk_token") ? model.at("unk_token") : json();
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
    token.normalized = flag(entry, "normalized", !token.special, source_, field + ".normalized");
    token.content = content.get<std::string>();
    if (token.normalized && nfc_)
      token.content = unicode::encode_utf8(unicode::nfc(unicode::decode_utf8(token.content, source_)));
    for (const char* key : {"single_word", "lstrip", "rstrip"})
      if (flag(entry, key, false, source_, field + "." + key))
        unsupported(source_, field + "." + key, true, "only false is supported");
    if (size_t(token.id) >= id_to_token_.size()) id_to_token_.resize(size_t(token.id) + 1);
    id_to_token_[size_t(token.id)] = content.get<std::string>();
    added_.push_back(std::move(token));
  }
}

void BpeTokenizer::index_added_tokens() {
  special_.assign(id_to_token_.size(), false);
  for (size_t i = 0; i < added_.size(); ++i) {
    const AddedToken& token = added_[i];
    special_[size_t(token.id)] = token.special;
    (token.normalized ? normalized_added_ : raw_added_)[uint8_t(token.content[0])].push_back(i);
  }
  for (AddedIndex* index : {&raw_added_, &normalized_added_})
    for (auto& candidates : *index)
      std::stable_sort(candidates.begin(), candidates.end(),
                       [&](size_t a, size_t b) { return added_[a].content.size() > added_[b].content.size(); });
}

void BpeTokenizer::choose_special_ids(const json& config) {
  const auto special_named = [&](std::initializer_list<std::string_view> names) {
    for (std::string_view name : names)
      for (const AddedToken& token : added_)
        if (token.special && token.content == name) return token.id;
    return -1;
  };
  eos_id_ = special_named({"<|endoftext|>", "</s>", "<eos>"});
  const json padding = config.contains("padding") ? config.at("padding") : json();
  if (!padding.is_null())
    pad_id_ = token_id_value(required(padding, "pad_id", source_, "padding.pad_id"), source_, "padding.pad_id");
  else
    pad_id_ = special_named({"<|padding|>", "<pad>", "[PAD]"});
}

void BpeTokenizer::check_fits(int64_t expected_vocab_size) const {
  FT_CHECK(expected_vocab_size <= 0 || vocab_size() <= expected_vocab_size, source_, ": tokenizer ids go up to ",
           vocab_size() - 1, " but the model's vocab_size is ", expected_vocab_size);
}

int32_t BpeTokenizer::token_id(const std::string& token) const {
  for (const AddedToken& added : added_)
    if (added.content == token) return added.id;
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

std::vector<BpeTokenizer::Segment> BpeTokenizer::split_on_added(std::string_view text, const AddedIndex& index) const {
  std::vector<Segment> segments;
  size_t text_start = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* match = nullptr;
    for (size_t candidate : index[uint8_t(text[i])])
      if (text.substr(i, added_[candidate].content.size()) == added_[candidate].content) {
        match = &added_[candidate];
        break;
      }
    if (!match) {
      ++i;
      continue;
    }
    if (i > text_start) segments.push_back({text.substr(text_start, i - text_start), -1});
    segments.push_back({{}, match->id});
    i += match->content.size();
    text_start = i;
  }
  if (text_start < text.size()) segments.push_back({text.substr(text_start), -1});
  return segments;
}

std::string BpeTokenizer::normalize(std::string_view text) const {
  if (!nfc_) return std::string(text);
  return unicode::encode_utf8(unicode::nfc(unicode::decode_utf8(text, source_)));
}

std::vector<int32_t> BpeTokenizer::encode(const std::string& text) const {
  unicode::decode_utf8(text, "text to tokenize");  // refuses invalid UTF-8 before any work
  std::vector<int32_t> ids;
  // As tokenizers' AddedVocabulary: tokens with normalized=false are found in the raw text,
  // the others in each normalized stretch between them.
  for (const Segment& raw : split_on_added(text, raw_added_)) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    std::string normalized = normalize(raw.text);
    for (const Segment& piece : split_on_added(normalized, normalized_added_)) {
      if (piece.id >= 0)
        ids.push_back(piece.id);
      else
        pre_tokenize_and_encode(piece.text, ids);
    }
  }
  return ids;
}

void BpeTokenizer::pre_tokenize_and_encode(std::string_view text, std::vector<int32_t>& ids) const {
  // ByteLevel's add_prefix_space applies to every stretch between added tokens.
  std::string word(add_prefix_space_ && text.front() != ' ' ? 1 : 0, ' ');
  word += text;
  if (!use_regex_) {
    encode_word(word, ids);
    return;
  }
  for (const std::string& piece : gpt2_split(word)) encode_word(piece, ids);
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& ids) const {
  if (ignore_merges_) {
    auto whole = vocab_.find(byte_level(word));
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
  for (char byte : word) {
    int32_t id = byte_ids_[uint8_t(byte)];
    if (id < 0) {  // a byte the vocabulary lacks: unk if there is one (fused if asked), else dropped
      if (unk_id_ < 0 || (fuse_unk_ && !symbols.empty() && symbols.back().id == unk_id_)) continue;
      id = unk_id_;
    }
    symbols.push_back({id, int(symbols.size()) - 1, int(symbols.size()) + 1, true});
  }
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
  std::string bytes;
  for (int32_t id : ids) {
    FT_CHECK(id >= 0, source_, ": cannot decode negative id ", id);
    if (size_t(id) >= id_to_token_.size() || id_to_token_[size_t(id)].empty() || special_[size_t(id)]) continue;
    const std::string& token = id_to_token_[size_t(id)];
    // ByteLevel decoder: map each character back to its byte; a token with a character that
    // stands for no byte (an added token such as "  ") contributes its own UTF-8 instead.
    std::string token_bytes;
    bool all_mapped = true;
    for (char32_t c : unicode::decode_utf8(token, source_)) {
      int byte = char_to_byte(c);
      if (byte < 0) {
        all_mapped = false;
        break;
      }
      token_bytes += char(byte);
    }
    bytes += all_mapped ? token_bytes : token;
  }
  return unicode::utf8_lossy(bytes);
}

}  // namespace ft
