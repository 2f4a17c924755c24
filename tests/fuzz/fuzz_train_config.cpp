// The YAML training config (parse_train_config, as `finetune CONFIG` reads it).
#include "tests/fuzz/fuzz_util.h"
#include "trainer/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ft::fuzz::expect_success_or_error([&] {
    ft::parse_train_config(std::string(reinterpret_cast<const char*>(data), size), "config.yaml");
  });
  return 0;
}
