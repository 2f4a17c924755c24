// `finetune export MODEL [--adapter DIR] --gguf OUT.gguf`: a Hugging Face
// checkpoint, with a PEFT LoRA adapter folded in when given (as `finetune
// merge` folds it), written as one GGUF v3 file that llama.cpp (and Ollama,
// LM Studio, llama-cpp-python) loads: llama.cpp's architecture name and
// hyper-parameter keys for the family (model/families.cpp points at its
// model/gguf_names.h entry), its tensor names and row layouts
// (convert_hf_to_gguf.py's q/k permutation for Llama, GPT-NeoX's fused qkv
// regrouped), Llama-3's rope_freqs, and the tokenizer (trainer/gguf_vocab.h).
//
// Tensor types as convert_hf_to_gguf.py --outtype picks them: 1-D tensors,
// norms and biases stay F32; the others take --outtype (f32, f16, bf16 or
// q8_0), a Q8_0 tensor whose rows are not a multiple of 32 falling back to
// F16. Every check runs before the file is written, and the write is atomic:
// a refused export leaves no file behind.
#pragma once
#include <ostream>
#include <string>

#include "model/gguf_file.h"

namespace ft {

struct GgufExportCommand {
  std::string model;      // a Hugging Face checkpoint folder
  std::string adapter;    // a PEFT LoRA adapter folder; "" for none
  std::string tokenizer;  // "": the model folder's own (default_tokenizer_path)
  std::string out;        // the .gguf file
  GgmlType type = GgmlType::f16;
  bool overwrite = false;  // replace an existing GGUF file at out
};

void export_gguf(const GgufExportCommand& command, std::ostream& log);

}  // namespace ft
