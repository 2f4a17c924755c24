// `finetune merge MODEL --adapter DIR --out DIR [--dtype DTYPE] [--max-shard-size 5GB]`:
// folds a PEFT LoRA adapter into the checkpoint's ORIGINAL weights, W +
// scaling * B A computed in f32 and rounded once to the output dtype (PEFT's
// merge_and_unload()), and writes a Hugging Face folder transformers loads:
// config.json (its dtype updated), the weights in safetensors shards of at
// most --max-shard-size (model.safetensors when one suffices, else
// model-0000i-of-0000n.safetensors plus model.safetensors.index.json, as
// save_pretrained names them), and the tokenizer and generation files copied.
// Works on the safetensors tensors alone (no model is built), so any
// architecture the adapter names merges. One shard is held in memory at a
// time, and each source tensor's mapped pages are dropped once converted.
#pragma once
#include <cstddef>
#include <optional>
#include <ostream>
#include <string>

#include "kernels/dtype.h"

namespace CLI {
class App;
}

namespace ft {

struct MergeCommand {
  std::string model, adapter, out;      // folders
  std::optional<DType> dtype;           // none: the base weights' own dtype
  size_t max_shard_bytes = size_t(5e9);  // save_pretrained's default, 5GB
};

// Adds the `merge` subcommand to app: parsing app fills command.
CLI::App* add_merge_command(CLI::App& app, MergeCommand& command);
// Writes command.out; a bad model, adapter or output folder is an Error
// naming the file and what was expected, raised before anything is written.
void merge_adapter(const MergeCommand& command, std::ostream& log);

}  // namespace ft
