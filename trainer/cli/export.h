// `finetune export MODEL [--adapter DIR] [--tokenizer PATH] --gguf OUT.gguf
// [--outtype f32|f16|bf16|q8_0]`: the checkpoint (with the adapter merged,
// when given) as one GGUF file for llama.cpp (trainer/gguf_export.h).
#pragma once
#include "trainer/gguf_export.h"

namespace CLI {
class App;
}

namespace ft {

// Adds the `export` subcommand to app: parsing app fills command.
CLI::App* add_export_command(CLI::App& app, GgufExportCommand& command);

}  // namespace ft
