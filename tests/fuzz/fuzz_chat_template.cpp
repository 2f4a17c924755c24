// A checkpoint's chat template (Jinja source from tokenizer_config.json):
// compiled, then rendered as training renders a conversation (its roles,
// tools, a generation prompt), as apply_chat_template would.
#include <nlohmann/json.hpp>

#include "tests/fuzz/fuzz_util.h"
#include "trainer/data/jinja/render.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  ft::fuzz::expect_success_or_error([&] {
    const auto tmpl = ft::jinja::compile(source, "chat_template");
    const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(
        R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},)"
        R"( {"role": "assistant", "content": "Hello", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},)"
        R"( {"role": "tool", "content": [{"type": "text", "text": "21"}]}])");
    for (bool add_generation_prompt : {false, true})
      ft::jinja::render(*tmpl,
                        {{"messages", messages},
                         {"tools", nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])")},
                         {"add_generation_prompt", add_generation_prompt},
                         {"bos_token", "<s>"},
                         {"eos_token", "</s>"}},
                        0);
  });
  return 0;
}
