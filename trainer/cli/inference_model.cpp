#include "trainer/cli/inference_model.h"

#include <filesystem>
#include <iostream>
#include <string_view>

#include "kernels/error.h"
#include "model/families.h"
#include "model/peft_adapter.h"
#include "model/quant/formats.h"
#include "model/safetensors.h"
#include "tokenizer/load_tokenizer.h"
#include "trainer/setup.h"

namespace ft {

void load_inference_model(InferenceModel& out, const InferenceRequest& request,
                          const std::vector<std::string>& stop_texts) {
  TrainConfig& config = out.config;
  config.source = request.source;
  config.model = request.model;
  out.record = request.adapter.empty() ? std::nullopt : read_adapter_record(request.adapter);
  const std::optional<AdapterRecord>& record = out.record;
  const std::string config_json = (std::filesystem::path(request.model) / "config.json").string();
  FT_CHECK(std::filesystem::is_directory(request.model), request.model,
           ": MODEL must be a Hugging Face checkpoint folder (config.json, safetensors, tokenizer)");
  const ModelConfig model_config = read_model_config(config_json);
  // A base saved quantised (config.json's quantization_config) loads in its
  // own format, as transformers loads it: the default, and the only choice.
  const StoredQuantization& stored = model_config.stored_quantization;
  config.quantization.mode = request.quantization.value_or(record ? record->quantization : stored.format);
  config.quantization.double_quant = stored.format == QuantizedBase::nf4 ? stored.double_quant
                                     : record                           ? record->double_quant
                                                                        : config.quantization.double_quant;
  config.precision = request.precision.value_or(record ? record->precision : Precision::fp32);
  // Which of the two the record set (the other given on the command line).
  const char* recorded = !record || (request.quantization && request.precision) ? nullptr
                         : request.quantization                                   ? "precision "
                         : request.precision                                      ? "base "
                                                                                  : "";
  const bool as_stored = !record && !request.quantization && stored.format != QuantizedBase::none;
  std::cerr << "base: " << enum_name(config.quantization.mode)
            << (config.quantization.mode != QuantizedBase::nf4 ? ""
                : config.quantization.double_quant             ? ", double_quant true"
                                                               : ", double_quant false")
            << ", precision " << enum_name(config.precision)
            << (recorded ? std::string(" (") + recorded + "as the adapter was trained: " + request.adapter + "/" +
                               kAdapterRecordFile + ")"
                : as_stored ? " (the base as stored: " + config_json + "'s quantization_config)"
                            : "")
            << "\n";
  if (stored.format != QuantizedBase::none) {
    const char* mode = quantized_format(stored.format).names.mode;
    FT_CHECK(config.quantization.mode == stored.format, config_json, ": quantization_config: the base's decoder "
             "linears are stored ", quantized_format(stored.format).names.format, " and load only with --quantization ",
             mode, ", not ", enum_name(config.quantization.mode),
             request.quantization ? "" : " (as the adapter was trained: give --quantization " + std::string(mode) + ")");
  }
  for (const std::string& stop : stop_texts) config.generate.stop.push_back(TokenRef{-1, stop});
  const Checkpoint checkpoint(request.model);
  FT_CHECK(request.output_head != OutputHead::none || !checkpoint.contains("score.weight"), request.model,
           ": holds \"score.weight\", a sequence classifier's score head (a reward model merged by finetune merge): "
           "it has no language-model head to generate with; score rows with `finetune score`");
  config.tokenizer = command_tokenizer_path(request.tokenizer, request.model);
  out.tokenizer = load_tokenizer(config.tokenizer, model_config.vocab_size);
  out.special = resolve_special_tokens(config, *out.tokenizer, model_config.vocab_size);
  ModelOptions options = model_options(config);
  options.lora.reset();
  options.output_head = request.output_head;
  if (!request.adapter.empty()) {
    const PeftAdapterConfig adapter = read_peft_adapter_config(request.adapter);
    adapter_weights(request.adapter);  // an adapter this cannot read is named before its target_modules build the model
    options.lora = adapter.lora;
    const std::string other_base = other_base_warning(adapter, request.adapter, request.model);
    if (!other_base.empty()) std::cerr << "warning: " << other_base << "\n";
  }
  out.device = make_device_backend(request.device, config.source, out.host, std::cerr);
  try {
    out.model = request.encoder_decoder ? make_language_model(model_config, *out.device.backend, options)
                                        : make_causal_lm(model_config, *out.device.backend, options);
  } catch (const Error& error) {
    // The model names the adapter's LoRA field it cannot take, not the file that set it.
    const std::string adapter_config = (std::filesystem::path(request.adapter) / "adapter_config.json").string();
    if (options.lora && std::string_view(error.what()).starts_with("lora.")) fail(adapter_config, ": ", error.what());
    throw;
  }
  out.model->load(checkpoint);
  if (!request.adapter.empty()) load_peft_adapter(request.adapter, *out.model);
}

}  // namespace ft
