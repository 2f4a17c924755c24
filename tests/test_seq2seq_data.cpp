// Seq2seq (T5) rows: tokenize_seq2seq_example's layout and truncation,
// text rows split for the prefix-LM objective, and t5_rows splitting the
// loader's batches back into right-padded encoder rows, their lengths and
// -100-padded labels.
#include <doctest/doctest.h>

#include <vector>

#include "kernels/error.h"
#include "model/t5.h"
#include "tokenizer/sentencepiece_tokenizer.h"
#include "trainer/data/data.h"

using namespace ft;

namespace {

const std::string kTokenizerPath = std::string(FT_SOURCE_DIR) + "/configs/tiny-base/tokenizer.model";
constexpr int32_t kEos = 2, kPad = 3;

std::vector<int32_t> ints(const Tensor& t) { return {t.ptr<int32_t>(), t.ptr<int32_t>() + t.numel()}; }

}  // namespace

TEST_CASE("a seq2seq row is encode(prompt) + eos, then encode(completion) + eos with the loss") {
  SentencePieceTokenizer tokenizer(kTokenizerPath);
  const Example example{"Summarize: a b", "short answer"};
  bool truncated = true;
  const TokenSequence row = tokenize_seq2seq_example(example, tokenizer, 64, kEos, truncated);
  std::vector<int32_t> want = tokenizer.encode(example.prompt);
  want.push_back(kEos);
  const size_t encoder_tokens = want.size();
  for (int32_t id : tokenizer.encode(example.completion)) want.push_back(id);
  want.push_back(kEos);
  CHECK(row.tokens == want);
  CHECK_FALSE(truncated);
  for (size_t i = 0; i < row.tokens.size(); ++i) CHECK(row.loss_mask[i] == (i >= encoder_tokens ? 1 : 0));
}

TEST_CASE("seq2seq truncation keeps each part's eos: labels at most seq_len / 2, the prompt's beginning the rest") {
  SentencePieceTokenizer tokenizer(kTokenizerPath);
  std::string long_text;
  for (int i = 0; i < 40; ++i) long_text += "word" + std::to_string(i) + " ";
  bool truncated = false;
  const int64_t seq_len = 16;
  const TokenSequence row = tokenize_seq2seq_example({long_text, long_text}, tokenizer, seq_len, kEos, truncated);
  CHECK(truncated);
  CHECK(int64_t(row.tokens.size()) == seq_len + 1);
  const int64_t labels = std::count(row.loss_mask.begin(), row.loss_mask.end(), 1);
  CHECK(labels == seq_len / 2);
  CHECK(row.tokens.back() == kEos);
  CHECK(row.tokens[size_t(seq_len - labels)] == kEos);  // the encoder's last token
  const std::vector<int32_t> prompt = tokenizer.encode(long_text);
  CHECK(std::equal(row.tokens.begin(), row.tokens.begin() + (seq_len - labels), prompt.begin()));
}

TEST_CASE("a text row splits after the marker's last occurrence, else at the word boundary nearest its middle") {
  using Halves = std::pair<std::string, std::string>;
  CHECK(split_text_row("one two three four", "") == Halves{"one two", " three four"});
  CHECK(split_text_row("aaaa bb c", "") == Halves{"aaaa", " bb c"});
  CHECK(split_text_row("nospace", "") == Halves{"nos", "pace"});
  CHECK(split_text_row("a: b\nIn short: c. In short: d", "In short: ") == Halves{"a: b\nIn short: c. In short: ", "d"});
  CHECK(split_text_row("one two three four", "In short: ") == Halves{"one two", " three four"});
}

TEST_CASE("t5_rows splits loader batches into padded encoder rows, lengths and labels") {
  // Rows: encoder {10, 11, 12, eos} labels {20, eos}; encoder {13, eos} labels {21, 22, 23, eos}.
  auto row = [](std::vector<int32_t> encoder, std::vector<int32_t> labels) {
    TokenSequence seq;
    seq.tokens = encoder;
    seq.loss_mask.assign(encoder.size(), 0);
    for (int32_t id : labels) seq.tokens.push_back(id), seq.loss_mask.push_back(1);
    return seq;
  };
  HostAllocator host;
  // Three slots per batch, two rows: the third is the epoch's empty padding row.
  DataLoader loader({row({10, 11, 12, kEos}, {20, kEos}), row({13, kEos}, {21, 22, 23, kEos})}, 3, 8, kPad, 1, host);
  const Batch batch = loader.batch_in_order(0);
  const T5Rows split = t5_rows(batch.input_ids, batch.targets, /*decoder_start_token_id=*/kPad, kPad, host);
  CHECK(split.encoder_lengths == std::vector<int32_t>{4, 2, 1});
  CHECK(split.encoder_ids.shape == Shape{3, 4});
  CHECK(ints(split.encoder_ids) == std::vector<int32_t>{10, 11, 12, kEos, 13, kEos, kPad, kPad, kPad, kPad, kPad, kPad});
  CHECK(split.labels.shape == Shape{3, 4});
  CHECK(ints(split.labels) == std::vector<int32_t>{20, kEos, -100, -100, 21, 22, 23, kEos, -100, -100, -100, -100});
  // transformers' _shift_right: the start token, then the labels, -100 as pad.
  CHECK(ints(split.decoder_ids) == std::vector<int32_t>{kPad, 20, kEos, kPad, kPad, 21, 22, 23, kPad, kPad, kPad, kPad});
}

TEST_CASE("seq2seq rows refuse chat data and a missing eos") {
  SentencePieceTokenizer tokenizer(kTokenizerPath);
  bool truncated = false;
  CHECK_THROWS_WITH_AS(tokenize_seq2seq_example({"a", "b"}, tokenizer, 16, -1, truncated),
                       doctest::Contains("end-of-sequence"), Error);
  Dataset chat;
  chat.path = "chat.jsonl";
  chat.format = DataFormat::chat;
  chat.examples.push_back(Example{});
  ChatTemplate templ;
  CHECK_THROWS_WITH_AS(tokenize_dataset(chat, tokenizer, 16, kEos, &templ, RowLayout::seq2seq),
                       doctest::Contains("chat.jsonl: chat rows train decoder-only models"), Error);
}
