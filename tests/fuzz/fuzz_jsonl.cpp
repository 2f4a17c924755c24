// JSONL training data (load_jsonl), every format setting.
#include <sstream>

#include "tests/fuzz/fuzz_util.h"
#include "trainer/data/data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (ft::DataFormat format : {ft::DataFormat::automatic, ft::DataFormat::prompt_completion, ft::DataFormat::text,
                                ft::DataFormat::chat, ft::DataFormat::alpaca}) {
    std::istringstream input(text);
    ft::fuzz::expect_success_or_error([&] { ft::load_jsonl(input, "train.jsonl", format); });
  }
  return 0;
}
