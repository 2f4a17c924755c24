// The special-token ids of a GGUF file (tokenizer.ggml.bos_token_id, ...),
// chosen as llama.cpp's convert_hf_to_gguf.py chooses them (gguf-py's
// SpecialVocab), not as the tokenizer uses them: a GPT-NeoX tokenizer adds no
// bos yet names one, and llama.cpp puts its own default (token 11 for a
// "gpt2" vocabulary) where the file names none.
//
// For bos, eos, unk, sep, pad, cls and mask, in that order: the
// tokenizer_config.json <type>_token (a string or {"content": ...}) when it
// is the content of one of tokenizer.json's added_tokens, else config.json's
// <type>_token_id (or its text_config's), the first found kept. A missing
// bos_token falls back to cls_token and a missing eos_token to sep_token.
// tokenizer.json's post-processor can fill them too: RobertaProcessing's cls
// and sep, and a TemplateProcessing whose single sequence ends in a special
// token other than eos_token (that token becomes eos, the old eos eot), or
// whose pair puts eos between A and B (eos becomes sep). cls is never
// written: GGUF has no key for it.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ft {

// (GGUF key, id) in the converter's order. Ids that are negative or not below
// vocab_size are left out (the converter stops at a negative one; llama.cpp
// ignores an id past its vocabulary).
std::vector<std::pair<std::string, int64_t>> gguf_special_ids(const std::string& tokenizer_path,
                                                              const std::string& model_config_path,
                                                              int64_t vocab_size);

}  // namespace ft
