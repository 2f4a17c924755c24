#include "tokenizer/pipeline.h"

#include <memory>

#include "kernels/error.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace ft {
namespace {

using namespace json_fields;
using RegexPtr = std::shared_ptr<const Regex>;

std::string utf8(char32_t c) {
  std::string out;
  unicode::append_utf8(out, c);
  return out;
}

std::string element(const std::string& field, size_t i) { return field + "[" + std::to_string(i) + "]"; }

// The elements of a Sequence stage's list (`key`), each read by `read`.
template <class Read>
void for_each_element(const json& stage, const char* key, const std::string& source, const std::string& field,
                      Read read) {
  const json& list = required(stage, key, source, field + "." + key);
  if (!list.is_array()) unsupported(source, field + "." + key, list, "expected an array");
  for (size_t i = 0; i < list.size(); ++i) read(list[i], element(field + "." + key, i));
}

// A {"String": s} (a literal) or {"Regex": r} (an Oniguruma pattern) object.
RegexPtr read_pattern(const json& stage, const std::string& source, const std::string& field) {
  const json& pattern = required(stage, "pattern", source, field + ".pattern");
  const std::string what = source + ": " + field + ".pattern";
  if (pattern.is_object() && pattern.size() == 1 && pattern.contains("String") && pattern.at("String").is_string())
    return std::make_shared<Regex>(pattern.at("String").get<std::string>(), Regex::Syntax::literal, what);
  if (pattern.is_object() && pattern.size() == 1 && pattern.contains("Regex") && pattern.at("Regex").is_string())
    return std::make_shared<Regex>(pattern.at("Regex").get<std::string>(), Regex::Syntax::oniguruma, what);
  unsupported(source, field + ".pattern", pattern, "expected {\"String\": ...} or {\"Regex\": ...}");
}

std::string replace_all(const Regex& regex, const std::string& text, const std::string& content) {
  std::string out;
  size_t copied = 0;
  for (auto [begin, end] : regex.find_all(text)) {
    out.append(text, copied, begin - copied).append(content);
    copied = end;
  }
  return out.append(text, copied);
}

std::string map_utf32(const std::string& text, std::u32string (*transform)(std::u32string_view)) {
  return unicode::encode_utf8(transform(unicode::decode_utf8(text, "normalizer input")));
}

// Strip: removes leading / trailing White_Space characters.
std::string strip(const std::string& text, bool left, bool right) {
  std::u32string chars = unicode::decode_utf8(text, "normalizer input");
  size_t begin = 0, end = chars.size();
  while (left && begin < end && unicode::is_whitespace(chars[begin])) ++begin;
  while (right && end > begin && unicode::is_whitespace(chars[end - 1])) --end;
  return unicode::encode_utf8(std::u32string_view(chars).substr(begin, end - begin));
}

void read_normalizer(const json& stage, const std::string& source, const std::string& field,
                     std::vector<std::function<std::string(const std::string&)>>& steps) {
  std::string type = stage_type(stage,
                                {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Replace", "Prepend", "Strip", "Sequence"},
                                source, field);
  if (type == "Sequence") {
    for_each_element(stage, "normalizers", source, field,
                     [&](const json& s, const std::string& f) { read_normalizer(s, source, f, steps); });
  } else if (type == "NFC") {
    steps.push_back([](const std::string& t) { return map_utf32(t, unicode::nfc); });
  } else if (type == "NFD") {
    steps.push_back([](const std::string& t) { return map_utf32(t, unicode::nfd); });
  } else if (type == "NFKC") {
    steps.push_back([](const std::string& t) { return map_utf32(t, unicode::nfkc); });
  } else if (type == "NFKD") {
    steps.push_back([](const std::string& t) { return map_utf32(t, unicode::nfkd); });
  } else if (type == "Lowercase") {
    steps.push_back([](const std::string& t) { return map_utf32(t, unicode::lowercase); });
  } else if (type == "Replace") {
    RegexPtr regex = read_pattern(stage, source, field);
    std::string content = string_field(stage, "content", source, field + ".content");
    steps.push_back([regex, content](const std::string& t) { return replace_all(*regex, t, content); });
  } else if (type == "Prepend") {
    std::string prefix = string_field(stage, "prepend", source, field + ".prepend");
    steps.push_back([prefix](const std::string& t) { return t.empty() ? t : prefix + t; });
  } else {  // Strip
    bool left = flag(stage, "strip_left", false, source, field + ".strip_left");
    bool right = flag(stage, "strip_right", false, source, field + ".strip_right");
    steps.push_back([left, right](const std::string& t) { return strip(t, left, right); });
  }
}

// SplitDelimiterBehavior: what becomes of the delimiters (matches) when a piece is split.
enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

Behavior read_behavior(const json& value, const std::string& source, const std::string& field) {
  const std::pair<const char*, Behavior> names[] = {{"Removed", Behavior::removed},
                                                    {"Isolated", Behavior::isolated},
                                                    {"MergedWithPrevious", Behavior::merged_with_previous},
                                                    {"MergedWithNext", Behavior::merged_with_next},
                                                    {"Contiguous", Behavior::contiguous}};
  for (const auto& [name, behavior] : names)
    if (value == name) return behavior;
  unsupported(source, field, value,
              "expected \"Removed\", \"Isolated\", \"MergedWithPrevious\", \"MergedWithNext\" or \"Contiguous\"");
}

struct Span {
  size_t begin, end;
  bool flag;  // a match (before the behavior is applied); to be removed (after)
};

// tokenizers' Pattern::find_matches: the text cut into alternating non-matches and matches.
std::vector<Span> find_matches(const Regex& regex, const std::string& text, bool invert) {
  std::vector<Span> spans;
  size_t previous = 0;
  for (auto [begin, end] : regex.find_all(text)) {
    if (previous != begin) spans.push_back({previous, begin, invert});
    spans.push_back({begin, end, !invert});
    previous = end;
  }
  if (previous != text.size()) spans.push_back({previous, text.size(), invert});
  return spans;
}

// tokenizers' NormalizedString::split: the spans to keep or remove under `behavior`.
std::vector<Span> apply_behavior(std::vector<Span> spans, Behavior behavior) {
  if (behavior == Behavior::removed) return spans;
  std::vector<Span> out;
  if (behavior == Behavior::isolated) {
    for (Span s : spans) out.push_back({s.begin, s.end, false});
    return out;
  }
  bool previous_match = false;
  if (behavior == Behavior::merged_with_next) {
    for (auto s = spans.rbegin(); s != spans.rend(); ++s) {
      if (s->flag && !previous_match && !out.empty())
        out.back().begin = s->begin;
      else
        out.push_back({s->begin, s->end, false});
      previous_match = s->flag;
    }
    return {out.rbegin(), out.rend()};
  }
  for (Span s : spans) {
    bool merge = behavior == Behavior::contiguous ? s.flag == previous_match : s.flag && !previous_match;
    if (merge && !out.empty())
      out.back().end = s.end;
    else
      out.push_back({s.begin, s.end, false});
    previous_match = s.flag;
  }
  return out;
}

// Splits every piece at the matches of `regex` (non-matches if invert) under `behavior`.
void split_pieces(std::vector<Piece>& pieces, const Regex& regex, Behavior behavior, bool invert) {
  std::vector<Piece> out;
  for (Piece& piece : pieces)
    for (Span s : apply_behavior(find_matches(regex, piece.text, invert), behavior))
      if (!s.flag && s.end > s.begin)
        out.push_back({piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
  pieces = std::move(out);
}

// The GPT-2 pattern of tokenizers' ByteLevel pre-tokenizer (use_regex).
constexpr const char* kByteLevelPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// The classes of Rust's regex crate and char methods that Whitespace, WhitespaceSplit and
// Digits use, in PCRE2 syntax.
constexpr const char* kRustWord = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D})";
const std::string kWhitespacePattern =
    std::string("[") + kRustWord + "]+|[^" + kRustWord + R"(\p{White_Space}]+)";
constexpr const char* kWhitespaceCharPattern = R"(\p{White_Space})";
constexpr const char* kNumericPattern = R"(\p{N})";

std::string byte_level(const std::string& bytes) {
  std::string out;
  for (char b : bytes) unicode::append_utf8(out, unicode::byte_level_chars()[uint8_t(b)]);
  return out;
}

enum class Prepend { first, always, never };

void metaspace(std::vector<Piece>& pieces, const std::string& replacement, Prepend scheme, const Regex* splitter) {
  for (Piece& piece : pieces) {
    std::string text;
    for (char c : piece.text) c == ' ' ? text.append(replacement) : text.append(1, c);
    bool prepend = scheme == Prepend::always || (scheme == Prepend::first && piece.at_start);
    if (prepend && text.compare(0, replacement.size(), replacement) != 0) text.insert(0, replacement);
    piece.text = std::move(text);
  }
  if (splitter) split_pieces(pieces, *splitter, Behavior::merged_with_next, false);
}

Prepend read_prepend_scheme(const json& stage, const std::string& source, const std::string& field) {
  // As tokenizers: "always" by default; add_prefix_space false (older files) means "never".
  Prepend scheme = Prepend::always;
  if (stage.contains("prepend_scheme")) {
    const json& value = stage.at("prepend_scheme");
    if (value == "first")
      scheme = Prepend::first;
    else if (value == "never")
      scheme = Prepend::never;
    else if (value != "always")
      unsupported(source, field + ".prepend_scheme", value, "expected \"first\", \"always\" or \"never\"");
  }
  if (!flag(stage, "add_prefix_space", true, source, field + ".add_prefix_space")) {
    if (scheme != Prepend::never && stage.contains("prepend_scheme"))
      unsupported(source, field + ".add_prefix_space", false, "it contradicts prepend_scheme");
    scheme = Prepend::never;
  }
  return scheme;
}

void read_pre_tokenizer(const json& stage, const std::string& source, const std::string& field,
                        std::vector<std::function<void(std::vector<Piece>&)>>& steps) {
  std::string type = stage_type(stage,
                                {"ByteLevel", "Split", "Digits", "Metaspace", "Whitespace", "WhitespaceSplit",
                                 "Punctuation", "Sequence"},
                                source, field);
  const auto regex = [&](const std::string& pattern, Regex::Syntax syntax = Regex::Syntax::pcre2) {
    return std::make_shared<Regex>(pattern, syntax, source + ": " + field);
  };
  if (type == "Sequence") {
    for_each_element(stage, "pretokenizers", source, field,
                     [&](const json& s, const std::string& f) { read_pre_tokenizer(s, source, f, steps); });
  } else if (type == "ByteLevel") {
    bool add_prefix_space = flag(stage, "add_prefix_space", true, source, field + ".add_prefix_space");
    RegexPtr split = flag(stage, "use_regex", true, source, field + ".use_regex") ? regex(kByteLevelPattern, Regex::Syntax::oniguruma) : nullptr;
    steps.push_back([add_prefix_space, split](std::vector<Piece>& pieces) {
      if (add_prefix_space)
        for (Piece& p : pieces)
          if (p.text[0] != ' ') p.text.insert(0, 1, ' ');
      if (split) split_pieces(pieces, *split, Behavior::isolated, false);
      for (Piece& p : pieces) p.text = byte_level(p.text);
    });
  } else if (type == "Split") {
    RegexPtr pattern = read_pattern(stage, source, field);
    Behavior behavior =
        read_behavior(required(stage, "behavior", source, field + ".behavior"), source, field + ".behavior");
    bool invert = flag(stage, "invert", false, source, field + ".invert");
    steps.push_back([=](std::vector<Piece>& pieces) { split_pieces(pieces, *pattern, behavior, invert); });
  } else if (type == "Digits") {
    bool individual = flag(stage, "individual_digits", false, source, field + ".individual_digits");
    RegexPtr digit = regex(kNumericPattern);
    Behavior behavior = individual ? Behavior::isolated : Behavior::contiguous;
    steps.push_back([=](std::vector<Piece>& pieces) { split_pieces(pieces, *digit, behavior, false); });
  } else if (type == "Metaspace") {
    std::string replacement = utf8(char_field(stage, "replacement", source, field + ".replacement"));
    Prepend scheme = read_prepend_scheme(stage, source, field);
    bool split = flag(stage, "split", true, source, field + ".split");
    RegexPtr splitter = split ? std::make_shared<Regex>(replacement, Regex::Syntax::literal, source) : nullptr;
    steps.push_back([=](std::vector<Piece>& pieces) { metaspace(pieces, replacement, scheme, splitter.get()); });
  } else if (type == "Whitespace") {
    RegexPtr words = regex(kWhitespacePattern);
    steps.push_back([=](std::vector<Piece>& pieces) { split_pieces(pieces, *words, Behavior::removed, true); });
  } else if (type == "WhitespaceSplit") {
    RegexPtr space = regex(kWhitespaceCharPattern);
    steps.push_back([=](std::vector<Piece>& pieces) { split_pieces(pieces, *space, Behavior::removed, false); });
  } else {  // Punctuation
    Behavior behavior = stage.contains("behavior") ? read_behavior(stage.at("behavior"), source, field + ".behavior")
                                                   : Behavior::isolated;
    RegexPtr punctuation = regex(unicode::punctuation_class());
    steps.push_back([=](std::vector<Piece>& pieces) { split_pieces(pieces, *punctuation, behavior, false); });
  }
}

// ByteLevel decoder: all tokens' characters back to bytes (a token with a character outside
// the byte-level alphabet keeps its own UTF-8), one string with invalid UTF-8 as U+FFFD.
void byte_level_decode(std::vector<std::string>& tokens) {
  std::string bytes;
  for (const std::string& token : tokens) {
    std::string token_bytes;
    bool all_mapped = true;
    for (char32_t c : unicode::decode_utf8(token, "token")) {
      int byte = unicode::byte_level_byte(c);
      if (byte < 0) {
        all_mapped = false;
        break;
      }
      token_bytes += char(byte);
    }
    bytes += all_mapped ? token_bytes : token;
  }
  tokens = {unicode::utf8_lossy(bytes)};
}

// ByteFallback decoder: runs of <0xXX> tokens become their bytes' text, or one U+FFFD per byte
// when the run is not valid UTF-8.
void byte_fallback_decode(std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string run;
  size_t run_length = 0;
  const auto flush = [&] {
    if (run_length == 0) return;
    if (unicode::utf8_lossy(run) == run)
      out.push_back(run);
    else
      for (size_t i = 0; i < run_length; ++i) out.push_back("\xEF\xBF\xBD");
    run.clear();
    run_length = 0;
  };
  const auto hex = [](char c) { return std::isxdigit(uint8_t(c)) != 0; };
  for (std::string& token : tokens) {
    if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>' && hex(token[3]) && hex(token[4])) {
      run += char(std::stoi(token.substr(3, 2), nullptr, 16));
      ++run_length;
      continue;
    }
    flush();
    out.push_back(std::move(token));
  }
  flush();
  tokens = std::move(out);
}

// Strip decoder: up to `start` leading and `stop` trailing `content` characters off each token.
void strip_decode(std::vector<std::string>& tokens, char32_t content, size_t start, size_t stop) {
  for (std::string& token : tokens) {
    std::u32string chars = unicode::decode_utf8(token, "token");
    size_t begin = 0, end = chars.size();
    while (begin < std::min(start, end) && chars[begin] == content) ++begin;
    while (chars.size() - end < stop && end > begin && chars[end - 1] == content) --end;
    token = unicode::encode_utf8(std::u32string_view(chars).substr(begin, end - begin));
  }
}

void metaspace_decode(std::vector<std::string>& tokens, char32_t replacement, Prepend scheme) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::u32string out;
    for (char32_t c : unicode::decode_utf8(tokens[i], "token")) {
      // As tokenizers: the first token loses every replacement character unless scheme is never.
      if (c == replacement && i == 0 && scheme != Prepend::never) continue;
      out += c == replacement ? U' ' : c;
    }
    tokens[i] = unicode::encode_utf8(out);
  }
}

void read_decoder(const json& stage, const std::string& source, const std::string& field,
                  std::vector<std::function<void(std::vector<std::string>&)>>& steps) {
  std::string type = stage_type(
      stage, {"ByteLevel", "Metaspace", "ByteFallback", "Fuse", "Strip", "Replace", "Sequence"}, source, field);
  if (type == "Sequence") {
    for_each_element(stage, "decoders", source, field,
                     [&](const json& s, const std::string& f) { read_decoder(s, source, f, steps); });
  } else if (type == "ByteLevel") {
    steps.push_back(byte_level_decode);
  } else if (type == "ByteFallback") {
    steps.push_back(byte_fallback_decode);
  } else if (type == "Fuse") {
    steps.push_back([](std::vector<std::string>& tokens) {
      std::string all;
      for (const std::string& t : tokens) all += t;
      tokens = {all};
    });
  } else if (type == "Metaspace") {
    char32_t replacement = char_field(stage, "replacement", source, field + ".replacement");
    Prepend scheme = read_prepend_scheme(stage, source, field);
    steps.push_back([=](std::vector<std::string>& tokens) { metaspace_decode(tokens, replacement, scheme); });
  } else if (type == "Strip") {
    char32_t content = char_field(stage, "content", source, field + ".content");
    size_t start = size_t(count_field(stage, "start", 0, INT32_MAX, source, field + ".start"));
    size_t stop = size_t(count_field(stage, "stop", 0, INT32_MAX, source, field + ".stop"));
    steps.push_back([=](std::vector<std::string>& tokens) { strip_decode(tokens, content, start, stop); });
  } else {  // Replace
    RegexPtr regex = read_pattern(stage, source, field);
    std::string content = string_field(stage, "content", source, field + ".content");
    steps.push_back([=](std::vector<std::string>& tokens) {
      for (std::string& t : tokens) t = replace_all(*regex, t, content);
    });
  }
}

}  // namespace

Normalizer::Normalizer(const json& config, const std::string& source, const std::string& field) {
  if (!config.is_null()) read_normalizer(config, source, field, steps_);
}

std::string Normalizer::apply(const std::string& text) const {
  std::string out = text;
  for (const auto& step : steps_) out = step(out);
  return out;
}

PreTokenizer::PreTokenizer(const json& config, const std::string& source, const std::string& field) {
  if (!config.is_null()) read_pre_tokenizer(config, source, field, steps_);
}

void PreTokenizer::apply(std::vector<Piece>& pieces) const {
  std::erase_if(pieces, [](const Piece& p) { return p.text.empty(); });
  for (const auto& step : steps_) step(pieces);
}

Decoder::Decoder(const json& config, const std::string& source, const std::string& field) : null_(config.is_null()) {
  if (!null_) read_decoder(config, source, field, steps_);
}

std::string Decoder::apply(std::vector<std::string> tokens) const {
  for (const auto& step : steps_) step(tokens);
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) out.append(null_ && i > 0 ? " " : "").append(tokens[i]);
  return out;
}

}  // namespace ft
