// Which tokenizer a path holds, and where a model folder keeps its own.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace ft {

// Loads a tokenizer.json (with the tokenizer_config.json beside it) or a SentencePiece model: by the
// extension (.json / .model), otherwise by the content (a JSON object or not). When
// model_vocab_size > 0 the tokenizer must fit the model's embedding: SentencePiece must have
// exactly that many pieces; BPE ids must all be below it (GPT-NeoX pads its embedding:
// 50,277 tokenizer ids, vocab_size 50,432). A mismatch is an Error naming both sizes.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, int64_t model_vocab_size);
// Whether load_tokenizer reads path as a tokenizer.json (BpeTokenizer) rather
// than a SentencePiece model.
bool is_tokenizer_json(const std::string& path);

// The tokenizer file of a Hugging Face model folder: tokenizer.model if present, else
// tokenizer.json, else T5's spiece.model, else the tokenizer.model path (so the error names it).
// A tokenizer.json that adds tokens past its model's vocabulary (ids the SentencePiece
// model lacks), or one of a LlamaTokenizer folder (tokenizer_config.json's tokenizer_class),
// comes before tokenizer.model: transformers 5 tokenizes with it. T5's Unigram tokenizer.json
// (which load_tokenizer does not read) gives way to the spiece.model beside it.
std::string default_tokenizer_path(const std::string& model_dir);

// A command's tokenizer: given when set (its --tokenizer), else the model
// folder's own; a folder without one is an Error naming the folder and the option.
std::string command_tokenizer_path(const std::string& given, const std::string& model_dir);

}  // namespace ft
