// The PEFT adapter reader: adapter_config.json and adapter_model.safetensors
// loaded into a tiny llama (the llama_gqa fixture's shape, LoRA r 4 on q_proj
// and v_proj, as the llama_lora fixture). Input layout: a little-endian u32
// n, then n bytes of adapter_config.json, then the safetensors file.
#include <cstring>

#include "kernels/cpu/cpu_backend.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/peft_adapter.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

ft::CausalLM& tiny_llama() {
  static ft::HostAllocator host;
  static ft::CpuBackend backend(host);
  static std::unique_ptr<ft::CausalLM> model = [] {
    ft::ModelConfig config = ft::parse_model_config(
        R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 88, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 320})",
        "tiny");
    ft::ModelOptions options;
    options.lora.emplace();
    options.lora->r = 4;
    options.lora->lora_alpha = 8;
    return ft::make_causal_lm(config, backend, options);
  }();
  return *model;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint32_t config_bytes = 0;
  if (size >= 4) std::memcpy(&config_bytes, data, 4);
  const size_t header = std::min<size_t>(size, 4);
  const size_t config_size = std::min<size_t>(config_bytes, size - header);
  ft::fuzz::write_scratch_file("adapter_config.json", data + header, config_size);
  ft::fuzz::write_scratch_file("adapter_model.safetensors", data + header + config_size, size - header - config_size);
  ft::CausalLM& model = tiny_llama();
  ft::fuzz::expect_success_or_error([&] { ft::load_peft_adapter(ft::fuzz::scratch_folder().string(), model); });
  return 0;
}
