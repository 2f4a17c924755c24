// The tokenizer.* metadata of a GGUF file, as llama.cpp's
// convert_hf_to_gguf.py writes it, from the tokenizer this trainer uses:
//
//   SentencePiece (tokenizer.model): tokenizer.ggml.model llama, pre
//     "default", every piece with its score and SentencePiece type;
//   a byte-level BPE tokenizer.json: model "gpt2", pre named after the
//     pre-tokenizer (GPT-2's ByteLevel regex "gpt-2", Llama-3's split
//     "llama-bpe", Qwen2's qwen2), the merges in rank order;
//
// ids up to the model's vocab_size ("[PADi]", unused, where the tokenizer has
// none), token types (added special tokens, and those spelled <|...|>, are
// control; other added tokens user-defined; tokenizer_config.json's
// added_tokens_decoder for SentencePiece), the special-token ids as the
// converter picks them (trainer/gguf_special_ids.h), whether the tokenizer
// adds bos and eos (as transformers' tokenizer does, where the converter
// leaves some to llama.cpp's defaults), and the chat template
// (tokenizer_config.json's chat_template or chat_template.jinja beside the
// tokenizer).
#pragma once
#include <cstdint>
#include <string>

#include "model/gguf_file.h"

namespace ft {

// Appends the entries to metadata. A tokenizer llama.cpp would tokenize
// differently (a SentencePiece-style BPE tokenizer.json, an unknown
// pre-tokenizer) is an Error naming the file and the field. model_config_path
// (config.json) supplies the special ids the tokenizer files do not.
void add_gguf_vocab(const std::string& tokenizer_path, const std::string& model_config_path, int64_t vocab_size,
                    GgufMetadata& metadata);

}  // namespace ft
