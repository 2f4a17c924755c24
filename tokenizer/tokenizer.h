// What the trainer needs from a tokenizer, whichever file format it comes from:
// SentencePiece (tokenizer.model, Llama) or a Hugging Face tokenizer.json with a BPE model
// (GPT-NeoX, Llama-3, Qwen2, Mistral, ...).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ft {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Text to ids, without bos/eos: the caller adds bos_id() / eos_id() where it wants them.
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // Ids to text; special tokens (bos, eos, pad, ...) produce no text.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The vocabulary's own text of one id (a special token's string, e.g.
  // "</s>", which decode() leaves out); "" for an id outside the vocabulary.
  virtual std::string token_text(int32_t id) const = 0;
  // Number of ids the tokenizer can produce (largest id + 1).
  virtual int64_t vocab_size() const = 0;
  // -1 where the tokenizer defines none. bos_id is the token the model's own tokenizer puts
  // before every text (none for GPT-NeoX, <|begin_of_text|> for Llama-3), eos_id the
  // end-of-text token (tokenizer_config.json's eos_token where the tokenizer has one).
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual int32_t pad_id() const = 0;
  // Whether the model's own tokenizer puts eos_id() after every text it encodes
  // (tokenizer_config.json's add_eos_token, or a post-processor template ending in it).
  virtual bool appends_eos() const { return false; }
  // The name a model folder stores this kind of tokenizer under ("tokenizer.model" or
  // "tokenizer.json"): where saved models put their copy, so they load back by default.
  virtual std::string file_name() const = 0;
};

}  // namespace ft
