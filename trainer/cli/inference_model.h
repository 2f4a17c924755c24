// A checkpoint (with a PEFT adapter when given) built for inference by the
// subcommands that read a trained model: `finetune generate` and `finetune
// score`. The base is quantised as asked, else as the adapter's
// finetune_run.json records it was trained, else left in full precision.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "model/causal_lm.h"
#include "tokenizer/tokenizer.h"
#include "trainer/adapter_record.h"
#include "trainer/data/special_tokens.h"
#include "trainer/device_backend.h"
#include "trainer/train_config.h"

namespace ft {

struct InferenceRequest {
  std::string model, adapter, tokenizer;  // folders; "": no adapter, MODEL's tokenizer file
  std::optional<QuantizedBase> quantization;
  std::optional<Precision> precision;
  DeviceChoice device = DeviceChoice::automatic;
  OutputHead output_head = OutputHead::none;  // score: a reward model
  std::string source;                         // the subcommand, for messages ("finetune score")
  bool encoder_decoder = false;               // a T5 checkpoint too (generate); else decoder-only ones only
};

struct InferenceModel {
  HostAllocator host;  // before the device backend and the model, which use it
  DeviceBackend device;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<LanguageModel> model;  // a CausalLM, or with request.encoder_decoder a T5Model
  SpecialTokens special;
  std::optional<AdapterRecord> record;  // the adapter's, when it has one
  TrainConfig config;                   // what the model was built from (quantization, precision, stop texts)
};

// Builds into `out` (status lines to stderr). stop_texts go to the special
// tokens' stop strings as generate.stop would.
void load_inference_model(InferenceModel& out, const InferenceRequest& request,
                          const std::vector<std::string>& stop_texts = {});

}  // namespace ft
