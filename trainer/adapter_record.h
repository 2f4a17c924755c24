// How an adapter was trained, written beside PEFT's files in a file PEFT
// ignores (finetune_run.json): the frozen base's quantization and the
// precision the run computed in, the chat template its chat rows were
// rendered with (none for other data), and the run's config file with its
// fingerprint. `finetune generate` takes its defaults from it, so the
// adapter runs over the base it was trained with, and knows to render chat
// prompts.
#pragma once
#include <optional>
#include <string>

#include "model/model_options.h"
#include "trainer/data/chat_template.h"
#include "trainer/train_config.h"

namespace ft {

inline constexpr const char* kAdapterRecordFile = "finetune_run.json";

struct AdapterRecord {
  QuantizedBase quantization = QuantizedBase::none;
  bool double_quant = true;  // nf4: the absmax constants double-quantised (a record without it: the default)
  Precision precision = Precision::fp32;
  std::optional<ChatTemplateKind> chat_template;  // chatml, llama2, ...: the run's rows were chat
  std::string config;                             // the run's config file, and its fingerprint
  std::string config_fingerprint;
};

// Atomically, into the adapter folder.
void write_adapter_record(const std::string& adapter_dir, const AdapterRecord& record);
// nullopt when the folder has no record (an adapter trained elsewhere);
// a malformed one is an Error naming the file and the field.
std::optional<AdapterRecord> read_adapter_record(const std::string& adapter_dir);

}  // namespace ft
