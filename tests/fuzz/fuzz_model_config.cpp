// ModelConfig from a Hugging Face config.json.
#include "model/families.h"
#include "model/model_config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ft::fuzz::expect_success_or_error([&] {
    ft::ModelConfig config =
        ft::parse_model_config(std::string(reinterpret_cast<const char*>(data), size), "config.json");
    // What every accepted config promises the model builders.
    if (config.head_dim <= 0 || config.num_attention_heads % config.num_key_value_heads != 0) std::abort();
  });
  return 0;
}
