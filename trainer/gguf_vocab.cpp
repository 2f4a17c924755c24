#include "trainer/gguf_vocab.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "kernels/error.h"
#include "model/gguf_names.h"
#include "model/json_input.h"
#include "trainer/gguf_special_ids.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/load_tokenizer.h"
#include "tokenizer/sentencepiece_tokenizer.h"

namespace ft {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// llama.cpp's token types (llama_token_type / gguf-py's TokenType).
enum TokenType : int32_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<float> scores;  // SentencePiece only
};

// Ids without a token, as convert_hf_to_gguf.py fills them.
Vocab padded_vocab(int64_t vocab_size, float score) {
  Vocab vocab;
  for (int64_t id = 0; id < vocab_size; ++id) vocab.tokens.push_back("[PAD" + std::to_string(id) + "]");
  vocab.types.assign(size_t(vocab_size), unused);
  vocab.scores.assign(size_t(vocab_size), score);
  return vocab;
}

// convert_hf_to_gguf.py's does_token_look_special: control tokens some
// tokenizers forget to mark special.
bool looks_special(const std::string& token) {
  const auto wrapped = [&](const std::string& open, const std::string& close) {
    return token.size() >= open.size() + close.size() && token.compare(0, open.size(), open) == 0 &&
           token.compare(token.size() - close.size(), close.size(), close) == 0;
  };
  return token == "<pad>" || token == "<mask>" || token == "<2mass>" || token == "[@BOS@]" || wrapped("<|", "|>") ||
         wrapped("<\xef\xbd\x9c", "\xef\xbd\x9c>") || wrapped("<unused", ">");
}

json sibling_json(const std::string& tokenizer_path, const char* name) {
  const fs::path path = fs::path(tokenizer_path).parent_path() / name;
  return fs::exists(path) ? read_json_object(path.string(), name) : json();
}

Vocab sentencepiece_vocab(const SentencePieceTokenizer& tokenizer, const std::string& path, int64_t vocab_size) {
  Vocab vocab = padded_vocab(vocab_size, -10000.0f);
  for (int32_t id = 0; id < int32_t(tokenizer.vocab_size()); ++id) {
    using Piece = SentencePieceTokenizer::PieceType;
    const Piece type = tokenizer.piece_type(id);
    vocab.tokens[size_t(id)] = tokenizer.token_text(id);
    vocab.scores[size_t(id)] = tokenizer.piece_score(id);
    vocab.types[size_t(id)] = type == Piece::unknown ? unknown
                              : type == Piece::control ? control
                              : type == Piece::unused  ? unused
                              : type == Piece::byte    ? byte
                                                       : normal;
  }
  // transformers' added tokens override the pieces they name.
  const json config = sibling_json(path, "tokenizer_config.json");
  if (!config.is_object() || !config.contains("added_tokens_decoder")) return vocab;
  for (const auto& [key, token] : config["added_tokens_decoder"].items()) {
    const std::string where = (fs::path(path).parent_path() / "tokenizer_config.json").string() +
                              ": added_tokens_decoder[\"" + key + "\"]";
    FT_CHECK(token.is_object() && token.contains("content") && token["content"].is_string(), where,
             ": expected an object with a string \"content\"");
    int64_t id = -1;
    try {
      id = std::stoll(key);
    } catch (const std::exception&) {
    }
    if (id < 0 || id >= vocab_size) continue;  // convert_hf_to_gguf.py skips ids out of range too
    std::string content = token["content"].get<std::string>();
    const bool special = token.value("special", false) || looks_special(content);
    if (!special)  // SentencePiece's "▁" stands for a space in user-defined tokens
      for (size_t at; (at = content.find("\xe2\x96\x81")) != std::string::npos;) content.replace(at, 3, " ");
    vocab.tokens[size_t(id)] = content;
    vocab.types[size_t(id)] = special ? control : user_defined;
    vocab.scores[size_t(id)] = -1000.0f;
  }
  return vocab;
}

// tokenizer.ggml.pre of a byte-level BPE's pre_tokenizer.
std::string pre_tokenizer_name(const json& pre, const std::string& path) {
  FT_CHECK(pre.dump().find("\"add_prefix_space\":true") == std::string::npos, path,
           ": pre_tokenizer's ByteLevel has add_prefix_space: true (a space put before the text), which no llama.cpp "
           "pre-tokenizer adds: llama.cpp would tokenize every prompt without it");
  const std::string type = pre.is_object() ? pre.value("type", "") : "";
  if (type == "ByteLevel" && pre.value("use_regex", true)) return "gpt-2";
  if (type == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].size() == 2) {
    const json& split = pre["pretokenizers"][0];
    const json& bytes = pre["pretokenizers"][1];
    const json pattern = split.is_object() && split.contains("pattern") ? split["pattern"] : json();
    if (split.value("type", "") == "Split" && pattern.is_object() && pattern.contains("Regex") &&
        bytes.value("type", "") == "ByteLevel" && !bytes.value("use_regex", true))
      for (const GgufPreTokenizer& known : kGgufSplitPreTokenizers)
        if (pattern["Regex"] == known.split_regex) return known.name;
  }
  fail(path, ": pre_tokenizer ", pre.dump().substr(0, 200),
       " has no llama.cpp pre-tokenizer this export knows (GPT-2's ByteLevel, Llama-3's or Qwen2's Split "
       "pattern before a ByteLevel); llama.cpp would split text differently from the model's tokenizer");
}

// A merge as llama.cpp reads it: "left right", a space inside a token written as U+0120.
std::string merge_text(const std::pair<std::string, std::string>& merge) {
  const auto encode = [](std::string text) {
    for (size_t at; (at = text.find(' ')) != std::string::npos;) text.replace(at, 1, "\xc4\xa0");
    return text;
  };
  return encode(merge.first) + " " + encode(merge.second);
}

void add_tokenizer_flags(const Tokenizer& tokenizer, GgufMetadata& metadata) {
  metadata.emplace_back("tokenizer.ggml.add_bos_token", GgufValue::boolean(tokenizer.bos_id() >= 0));
  metadata.emplace_back("tokenizer.ggml.add_eos_token", GgufValue::boolean(tokenizer.appends_eos()));
}

void add_chat_template(const std::string& tokenizer_path, GgufMetadata& metadata) {
  const json config = sibling_json(tokenizer_path, "tokenizer_config.json");
  std::string text;
  if (config.is_object() && config.contains("chat_template") && config["chat_template"].is_string()) {
    text = config["chat_template"].get<std::string>();
  } else {
    std::ifstream jinja(fs::path(tokenizer_path).parent_path() / "chat_template.jinja");
    std::stringstream bytes;
    bytes << jinja.rdbuf();
    text = bytes.str();
  }
  if (!text.empty()) metadata.emplace_back("tokenizer.chat_template", GgufValue::string(text));
}

}  // namespace

void add_gguf_vocab(const std::string& tokenizer_path, const std::string& model_config_path, int64_t vocab_size,
                    GgufMetadata& metadata) {
  Vocab vocab;
  if (!is_tokenizer_json(tokenizer_path)) {
    const SentencePieceTokenizer tokenizer(tokenizer_path, vocab_size);
    vocab = sentencepiece_vocab(tokenizer, tokenizer_path, vocab_size);
    metadata.emplace_back("tokenizer.ggml.model", GgufValue::string(kGgufSentencePieceModel));
    metadata.emplace_back("tokenizer.ggml.pre", GgufValue::string("default"));
    metadata.emplace_back("tokenizer.ggml.tokens", GgufValue::strings_array(vocab.tokens));
    metadata.emplace_back("tokenizer.ggml.scores", GgufValue::f32_array(vocab.scores));
    metadata.emplace_back("tokenizer.ggml.token_type", GgufValue::i32_array(vocab.types));
    add_tokenizer_flags(tokenizer, metadata);
  } else {
    const json file = read_json_object(tokenizer_path, "a tokenizer.json");
    const json pre = file.contains("pre_tokenizer") ? file["pre_tokenizer"] : json();
    // SentencePiece's "\u2581" for a space, in the pre-tokenizer (Metaspace) or the normalizer.
    const bool sentencepiece_style = (pre.dump() + (file.contains("normalizer") ? file["normalizer"].dump() : ""))
                                         .find("\xe2\x96\x81") != std::string::npos;
    FT_CHECK(!sentencepiece_style || pre.dump().find("\"ByteLevel\"") != std::string::npos, tokenizer_path,
             ": a SentencePiece-style BPE (no ByteLevel pre-tokenizer); llama.cpp scores its pieces from the "
             "SentencePiece model: give --tokenizer .../tokenizer.model");
    const std::string pre_name = pre_tokenizer_name(pre, tokenizer_path);
    const BpeTokenizer tokenizer(tokenizer_path, vocab_size);
    vocab = padded_vocab(vocab_size, 0.0f);
    for (int32_t id = 0; id < int32_t(tokenizer.vocab_size()); ++id) {
      const std::string text = tokenizer.token_text(id);
      if (text.empty()) continue;
      vocab.tokens[size_t(id)] = text;
      vocab.types[size_t(id)] = !tokenizer.is_added(id)                            ? normal
                                : tokenizer.is_special(id) || looks_special(text) ? control
                                                                                   : user_defined;
    }
    std::vector<std::string> merges;
    for (const auto& merge : tokenizer.merges()) merges.push_back(merge_text(merge));
    metadata.emplace_back("tokenizer.ggml.model", GgufValue::string("gpt2"));
    metadata.emplace_back("tokenizer.ggml.pre", GgufValue::string(pre_name));
    metadata.emplace_back("tokenizer.ggml.tokens", GgufValue::strings_array(vocab.tokens));
    metadata.emplace_back("tokenizer.ggml.token_type", GgufValue::i32_array(vocab.types));
    metadata.emplace_back("tokenizer.ggml.merges", GgufValue::strings_array(merges));
    add_tokenizer_flags(tokenizer, metadata);
  }
  for (const auto& [key, id] : gguf_special_ids(tokenizer_path, model_config_path, vocab_size))
    metadata.emplace_back(key, GgufValue::u32(uint32_t(id)));
  add_chat_template(tokenizer_path, metadata);
}

}  // namespace ft
