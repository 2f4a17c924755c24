#include "trainer/cli/export.h"

#include <CLI/CLI.hpp>

#include "trainer/cli/options.h"

namespace ft {
namespace {

// --outtype's spellings: convert_hf_to_gguf.py's.
const EnumName<GgmlType> kOutTypes[] = {
    {"f32", GgmlType::f32}, {"fp32", GgmlType::f32}, {"f16", GgmlType::f16}, {"fp16", GgmlType::f16},
    {"bf16", GgmlType::bf16}, {"q8_0", GgmlType::q8_0}};

}  // namespace

CLI::App* add_export_command(CLI::App& app, GgufExportCommand& c) {
  CLI::App* command = app.add_subcommand(
      "export", "Writes MODEL (with a LoRA adapter merged in, when given) as a GGUF file llama.cpp and Ollama load");
  command->footer(
      "llama.cpp's architecture, tensor names and tokenizer metadata, as its convert_hf_to_gguf.py writes them;\n"
      "norms and biases stay F32, the other tensors take --outtype (Q8_0: blocks of 32, as llama.cpp quantises).");
  command->add_option("MODEL", c.model, "a Hugging Face checkpoint folder (llama, mistral, qwen2, gpt_neox)")
      ->required();
  command->add_option("--gguf", c.out, "the GGUF file to write")->type_name("OUT.gguf")->required();
  command->add_flag("--overwrite", c.overwrite, "replace OUT.gguf when it exists (only a GGUF file is replaced)");
  command->add_option("--adapter", c.adapter, "a PEFT LoRA adapter folder to merge first")->type_name("DIR");
  command->add_option("--tokenizer", c.tokenizer, "tokenizer.model or tokenizer.json (default: MODEL's own)")
      ->type_name("PATH");
  add_choice_option(*command, "--outtype", c.type, EnumNames<GgmlType>(kOutTypes),
                    "the type of the 2-D weights (default f16)");
  return command;
}

}  // namespace ft
