// The text stages of a tokenizer.json around its model, as the `tokenizers` library runs them:
// normalizer (text -> text), pre-tokenizer (text -> pieces the model encodes one by one) and
// decoder (tokens -> text). Each is read from its JSON object; a null stage does nothing (a
// null decoder joins tokens with spaces, as tokenizers does). Only ids and text matter here,
// so offsets are not tracked.
//
//   normalizer     NFC, NFD, NFKC, NFKD (Unicode 9.0 data, as tokenizers), Lowercase,
//                  Replace (String or Regex pattern), Prepend, Strip, Sequence
//   pre_tokenizer  ByteLevel (add_prefix_space, use_regex), Split (String or Regex pattern,
//                  behavior, invert), Digits, Metaspace (replacement, prepend_scheme, split),
//                  Whitespace, WhitespaceSplit, Punctuation, Sequence
//   decoder        ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence
#pragma once
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace ft {

class Normalizer {
 public:
  Normalizer(const nlohmann::json& config, const std::string& source, const std::string& field);
  std::string apply(const std::string& text) const;

 private:
  std::vector<std::function<std::string(const std::string&)>> steps_;
};

// A stretch of text the model will encode. at_start: it begins where the input text begins
// (Metaspace's prepend_scheme "first" prepends only there).
struct Piece {
  std::string text;
  bool at_start;
};

class PreTokenizer {
 public:
  PreTokenizer(const nlohmann::json& config, const std::string& source, const std::string& field);
  // Splits (and rewrites) the pieces in place; empty pieces are dropped, as tokenizers does.
  void apply(std::vector<Piece>& pieces) const;

 private:
  std::vector<std::function<void(std::vector<Piece>&)>> steps_;
};

class Decoder {
 public:
  Decoder(const nlohmann::json& config, const std::string& source, const std::string& field);
  std::string apply(std::vector<std::string> tokens) const;

 private:
  bool null_ = false;
  std::vector<std::function<void(std::vector<std::string>&)>> steps_;
};

}  // namespace ft
