// tokenizer.json through BpeTokenizer's public constructor, then one
// encode/decode round of a fixed text with whatever tokenizer was accepted.
#include <nlohmann/json.hpp>

#include "model/json_input.h"
#include "tests/fuzz/fuzz_util.h"
#include "tokenizer/bpe_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ft::fuzz::expect_success_or_error([&] {
    const nlohmann::json config =
        ft::parse_json(std::string_view(reinterpret_cast<const char*>(data), size), "tokenizer.json");
    ft::BpeTokenizer tokenizer(config, "tokenizer.json");
    tokenizer.decode(tokenizer.encode("Hello world, héllo 123!<|endoftext|>"));
  });
  return 0;
}
