// tokenizer.model (a SentencePiece ModelProto) through SentencePieceTokenizer,
// then one encode/decode round of a text that reaches the normalizer's
// character map (full-width letters, ligatures, accents, whitespace runs, an
// invalid UTF-8 byte), the special pieces and the byte fallback.
#include "tests/fuzz/fuzz_util.h"
#include "tokenizer/sentencepiece_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ft::fuzz::write_scratch_file("tokenizer.model", data, size);
  ft::fuzz::expect_success_or_error([&] {
    ft::SentencePieceTokenizer tokenizer(path);
    const std::vector<int32_t> ids =
        tokenizer.encode("Hello  world,\t\u00e9 e\u0301 \uff21\uff22\uff23 \ufb01 \u2460 \u3000x\xff<s></s><unk> 123\n");
    tokenizer.decode(ids);
    for (int32_t id : ids) tokenizer.token_text(id);
  });
  return 0;
}
