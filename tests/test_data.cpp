// JSONL loading, tokenisation with loss masks, batching, packing and the
// shuffled, resumable DataLoader.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/sentencepiece_tokenizer.h"
#include "trainer/data/chat_template.h"
#include "trainer/data/data.h"
#include "trainer/data/preference_data.h"

using namespace ft;

namespace {

const std::string kTokenizerPath = std::string(FT_FIXTURES_DIR) + "/tokenizer/tokenizer.model";

// Writes content to a scratch file under the build directory; returns its path.
std::string write_file(const std::string& name, const std::string& content) {
  std::filesystem::path dir = std::filesystem::path(FT_BINARY_DIR) / "test_data_tmp";
  std::filesystem::create_directories(dir);
  std::string path = (dir / name).string();
  std::ofstream(path) << content;
  return path;
}

std::string load_error(const std::string& name, const std::string& content, DataFormat format = DataFormat::automatic) {
  std::string path = write_file(name, content);
  try {
    load_jsonl(path, format);
  } catch (const Error& e) {
    std::string message = e.what();
    // Strip the scratch directory so messages compare as "name:line: ...".
    return message.starts_with(path) ? name + message.substr(path.size()) : message;
  }
  return "";
}

std::vector<int32_t> concat(std::vector<std::vector<int32_t>> parts) {
  std::vector<int32_t> all;
  for (const auto& part : parts) all.insert(all.end(), part.begin(), part.end());
  return all;
}

std::vector<int32_t> row_of(const Tensor& tensor, int64_t row) {
  const int32_t* begin = tensor.ptr<int32_t>() + row * tensor.cols();
  return {begin, begin + tensor.cols()};
}

// Row r holds tokens [100 + r, 200 + r, 300 + r] with loss on the last two, so
// a batch row's first input names the row it came from.
std::vector<TokenSequence> numbered_rows(int count) {
  std::vector<TokenSequence> rows;
  for (int r = 0; r < count; r++) rows.push_back({{100 + r, 200 + r, 300 + r}, {0, 1, 1}});
  return rows;
}

std::vector<int32_t> rows_in(const Batch& batch) {
  std::vector<int32_t> ids;
  for (int64_t b = 0; b < batch.input_ids.dim(0); b++)
    if (batch.targets.ptr<int32_t>()[b * batch.targets.cols() + 1] != kIgnoreIndex)
      ids.push_back(batch.input_ids.ptr<int32_t>()[b * batch.input_ids.cols()] - 100);
  return ids;
}

}  // namespace

TEST_CASE("load_jsonl reads prompt/completion and text rows, skipping blank lines") {
  std::string pairs = write_file("pairs.jsonl",
                                 "{\"prompt\": \"Q: 2+2?\", \"completion\": \" A: 4\", \"id\": 7}\n"
                                 "\n"
                                 "   \r\n"
                                 "{\"completion\": \" world\", \"prompt\": \"Hello\"}\r\n");
  Dataset data = load_jsonl(pairs, DataFormat::automatic);
  CHECK(data.path == pairs);
  CHECK(data.format == DataFormat::prompt_completion);
  REQUIRE(data.examples.size() == 2);
  CHECK(data.examples[0].prompt == "Q: 2+2?");
  CHECK(data.examples[0].completion == " A: 4");
  CHECK(data.examples[1].prompt == "Hello");
  CHECK(data.examples[1].completion == " world");

  std::string text = write_file("text.jsonl", "{\"text\": \"Hello world\"}\n{\"text\": \"\"}\n");
  Dataset corpus = load_jsonl(text, DataFormat::text);
  CHECK(corpus.format == DataFormat::text);
  REQUIRE(corpus.examples.size() == 2);
  CHECK(corpus.examples[0].prompt == "");
  CHECK(corpus.examples[0].completion == "Hello world");
  CHECK(load_jsonl(text, DataFormat::automatic).format == DataFormat::text);

  // Keys of several formats: read as trl's SFTTrainer reads the row (prompt/completion, then messages, then
  // text), the others left as extra fields.
  const Dataset both = load_jsonl(write_file("both.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\", \"text\": \"c\"}\n"),
                                  DataFormat::automatic);
  CHECK(both.format == DataFormat::prompt_completion);
  CHECK(both.examples[0].completion == "b");
}

TEST_CASE("load_jsonl errors name the file and the line") {
  // The parser's reason at the row's column (not its "line 1"), bytes beyond ASCII escaped.
  CHECK(load_error("bad_json.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"\n") ==
        "bad_json.jsonl:2: not valid JSON at column 13: syntax error while parsing object - unexpected end of input; "
        "expected '}'");
  CHECK(load_error("latin1.jsonl", "{\"text\": \"caf\xE9\"}\n") ==
        "latin1.jsonl:1: not valid JSON at column 15: syntax error while parsing value - invalid string: ill-formed "
        "UTF-8 byte; last read: '\"caf\\xE9\"'");
  // What is not JSONL is named: a list, a pretty-printed object, a UTF-16 file.
  const std::string one_a_line = ": write each row as one line (Python: for row in rows: print(json.dumps(row)))";
  CHECK(load_error("array.jsonl", "\n[1, 2]\n") ==
        "array.jsonl:2: a JSONL file holds one JSON object a line, and this line starts a JSON list" + one_a_line);
  CHECK(load_error("pretty.jsonl", "{\n  \"text\": \"a\"\n}\n") ==
        "pretty.jsonl:1: a JSONL file holds one JSON object a line, and this line opens an object over several lines "
        "(pretty-printed JSON)" + one_a_line);
  CHECK(load_error("utf16.jsonl", std::string("\xFF\xFE{\0\"\0", 6)) ==
        "utf16.jsonl:1: the file is UTF-16 (it starts with UTF-16's byte order mark); save it as UTF-8");
  CHECK(load_error("fields.jsonl", "{\"question\": \"a\", \"answer\": \"b\"}\n") ==
        "fields.jsonl:1: expected \"prompt\" and \"completion\" strings, a \"text\" string, a \"messages\" list or "
        "\"instruction\" and \"output\" strings, got keys \"answer\", "
        "\"question\"");
  CHECK(load_error("sharegpt.jsonl", "{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}]}\n") ==
        "sharegpt.jsonl:1: expected \"prompt\" and \"completion\" strings, a \"text\" string, a \"messages\" list or "
        "\"instruction\" and \"output\" strings, got keys \"conversations\" (ShareGPT rows: write \"conversations\" "
        "as \"messages\" of {\"role\", \"content\"}, from human -> user, gpt -> assistant, value -> content)");
  CHECK(load_error("lacks.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"c\"}\n") ==
        "lacks.jsonl:2: row lacks \"completion\"");
  CHECK(load_error("pairs.jsonl", "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n") ==
        "pairs.jsonl:1: a preference pair (\"chosen\", \"rejected\"), and objective: sft trains on a \"completion\": "
        "set objective: dpo (or reward) to train on pairs");
  CHECK(load_error("number.jsonl", "{\"prompt\": \"a\", \"completion\": 4}\n") ==
        "number.jsonl:1: \"completion\" must be a string, got number");
  CHECK(load_error("null.jsonl", "{\"text\": null}\n") == "null.jsonl:1: \"text\" must be a string, got null");
  // Other formats are named by their extension (any case), not parsed as JSON.
  CHECK_THROWS_WITH_AS(load_jsonl("rows.parquet", DataFormat::automatic),
                       "rows.parquet: a parquet file; data files are JSONL, one JSON object a line (datasets writes "
                       "one with Dataset.to_json(path, lines=True))",
                       Error);
  CHECK_THROWS_WITH_AS(load_jsonl("rows.CSV", DataFormat::automatic),
                       "rows.CSV: a CSV file, which data.template.prompt and .completion read (their {column} names); "
                       "without them data files are JSONL, one JSON object a line",
                       Error);

  CHECK(load_error("mixed.jsonl", "\n{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"text\": \"c\"}\n") ==
        "mixed.jsonl:3: a text row, but line 2 is a prompt_completion row and all rows must agree");
  CHECK(load_error("forced.jsonl", "{\"text\": \"c\"}\n", DataFormat::prompt_completion) ==
        "forced.jsonl:1: a text row, but data.format is prompt_completion");
  CHECK(load_error("empty.jsonl", "\n  \n") == "empty.jsonl: the dataset is empty (no JSON rows)");
  std::string missing = std::string(FT_BINARY_DIR) + "/test_data_tmp/missing.jsonl";
  CHECK_THROWS_WITH_AS(load_jsonl(missing, DataFormat::automatic), (missing + ": cannot open data file").c_str(),
                       Error);
}

TEST_CASE("tokenisation: bos + prompt + completion + eos, loss on completion and eos") {
  SentencePieceTokenizer tokenizer(kTokenizerPath);
  REQUIRE(tokenizer.bos_id() == 1);
  REQUIRE(tokenizer.eos_id() == 2);
  CHECK(padding_id(tokenizer) == 3);
  Dataset data{"mem", DataFormat::prompt_completion, {{"Hello", " world"}, {"", "Alice and Bob"}}};
  TokenizedDataset tokens = tokenize_dataset(data, tokenizer, 64, tokenizer.eos_id());
  REQUIRE(tokens.examples.size() == 2);
  // "Hello" -> 118 252 260 260 254, " world" -> 51 44 260 259 (fixture tokenizer).
  CHECK(tokens.examples[0].tokens == concat({{1}, tokenizer.encode("Hello"), tokenizer.encode(" world"), {2}}));
  CHECK(tokens.examples[0].tokens == std::vector<int32_t>{1, 118, 252, 260, 260, 254, 51, 44, 260, 259, 2});
  CHECK(tokens.examples[0].loss_mask == std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1});
  // A text row is an empty prompt: loss on every token after bos.
  CHECK(tokens.examples[1].tokens == std::vector<int32_t>{1, 107, 13, 86, 2});
  CHECK(tokens.examples[1].loss_mask == std::vector<uint8_t>{0, 1, 1, 1, 1});
  CHECK(tokens.truncated_count == 0);
  CHECK(tokens.dropped_count == 0);
  CHECK(tokens.loss_token_count == 5 + 4);
}

// trl's trainers tokenize the prompt and the prompt + completion whole and
// start the completion where the two differ (scripts/make_trl_tokenization_fixture.py
// reads their prepared datasets back): a prompt's trailing space merges into
// the completion, a completion already ending with the eos text gets no
// second eos, a pair's two sides share the shorter prompt, and
// conversational rows and pairs (lists of messages) are rendered with the
// chat template and train on everything after the prompt. With trl's
// completion_only_loss=False (prompt/completion rows) and
// assistant_only_loss=False (rows of messages: trl's default, not ours) every
// token trains.
TEST_CASE("rows and preference pairs load and tokenize as trl's SFTTrainer and DPOTrainer prepare them") {
  std::ifstream file(std::string(FT_FIXTURES_DIR) + "/trl_tokenization.json");
  REQUIRE(file.good());
  const nlohmann::json fixture = nlohmann::json::parse(file);
  int sft = 0, dpo = 0, conversational = 0, every_token = 0;
  for (const nlohmann::json& c : fixture["cases"]) {
    const nlohmann::json& row = c["row"];
    CAPTURE(row.dump());
    const std::string path = write_file("trl_row.jsonl", row.dump() + "\n");
    BpeTokenizer tokenizer(std::string(FT_FIXTURES_DIR) + "/" + c["checkpoint"].get<std::string>() + "/tokenizer.json");
    const ChatTemplate chat = resolve_chat_template(
        ChatTemplateKind::automatic, std::string(FT_FIXTURES_DIR) + "/chat/" + c["chat_template"].get<std::string>());
    conversational += row.contains("chosen") ? row["chosen"].is_array() : row.contains("prompt") && row["prompt"].is_array();
    if (c["trainer"] == "SFTTrainer") {
      const Dataset data = load_jsonl(path, DataFormat::automatic);
      const nlohmann::json& args = c["sft_args"];
      const LossScope scope{args.value("completion_only_loss", true), args.value("assistant_only_loss", true)};
      every_token += !args.empty();
      const TokenizedDataset tokens =
          tokenize_dataset(data, tokenizer, 4096, tokenizer.eos_id(), &chat, RowLayout::causal, Packing::none, scope);
      REQUIRE(tokens.examples.size() == 1);
      const TokenSequence& seq = tokens.examples[0];
      CHECK(seq.tokens == c["input_ids"].get<std::vector<int32_t>>());
      // The first token's label never counts (nothing precedes it): trl marks a text row's first token, we do not.
      const std::vector<int> mask = c["loss_mask"];
      CHECK(std::vector<int>(seq.loss_mask.begin() + 1, seq.loss_mask.end()) == std::vector<int>(mask.begin() + 1, mask.end()));
      sft++;
      continue;
    }
    const TokenizedPairs pairs =
        tokenize_pairs(load_preference_jsonl(path), path, tokenizer, 4096, tokenizer.eos_id(), &chat);
    REQUIRE(pairs.chosen.size() == 1);
    const std::vector<int32_t> prompt = c["prompt_ids"];
    for (const auto& [seq, side] : {std::pair{pairs.chosen[0], "chosen_ids"}, std::pair{pairs.rejected[0], "rejected_ids"}}) {
      std::vector<int32_t> want = prompt, completion = c[side];
      want.insert(want.end(), completion.begin(), completion.end());
      CHECK(seq.tokens == want);
      std::vector<uint8_t> mask(want.size(), 0);
      std::fill(mask.begin() + long(prompt.size()), mask.end(), uint8_t(1));
      CHECK(seq.loss_mask == mask);
    }
    dpo++;
  }
  CHECK(sft == 30);
  CHECK(every_token == 14);
  CHECK(dpo == 16);
  CHECK(conversational == 12);
}

TEST_CASE("truncation keeps the first seq_len + 1 tokens; prompt-only windows are dropped") {
  SentencePieceTokenizer tokenizer(kTokenizerPath);
  Dataset data{"mem",
               DataFormat::prompt_completion,
               {{"Hello", " world"}, {"", "Alice and Bob"}, {"Hello world Hello world", " A: 4"}}};
  TokenizedDataset tokens = tokenize_dataset(data, tokenizer, 4, tokenizer.eos_id());
  CHECK(tokens.truncated_count == 2);  // 11 and 12 tokens exceed 4 + 1; "Alice and Bob" has exactly 5
  CHECK(tokens.dropped_count == 2);    // the first and third keep only prompt tokens
  REQUIRE(tokens.examples.size() == 1);
  CHECK(tokens.examples[0].tokens == std::vector<int32_t>{1, 107, 13, 86, 2});
  CHECK(tokens.loss_token_count == 4);

  Dataset prompts_only{"long.jsonl", DataFormat::prompt_completion, {{"Hello world", " A: 4"}}};
  CHECK_THROWS_WITH_AS(tokenize_dataset(prompts_only, tokenizer, 3, tokenizer.eos_id()),
                       "long.jsonl: no example has a completion token within seq_len = 3 (all 1 prompts fill the "
                       "window)",
                       Error);
  // Concatenated, nothing is cut: the windows cut the joined stream, so every token trains.
  TokenizedDataset whole = tokenize_dataset(data, tokenizer, 4, tokenizer.eos_id(), nullptr, RowLayout::causal,
                                            Packing::concatenate);
  CHECK(whole.truncated_count == 0);
  CHECK(whole.dropped_count == 0);
  REQUIRE(whole.examples.size() == 3);
  const TokenizedDataset long_window = tokenize_dataset(data, tokenizer, 64, tokenizer.eos_id());
  CHECK(long_window.truncated_count == 0);
  for (size_t i = 0; i < 3; ++i) CHECK(whole.examples[i].tokens == long_window.examples[i].tokens);
  CHECK(whole.examples[2].tokens.size() > 5);
}

TEST_CASE("a reward model's pairs longer than seq_len + 1 tokens are dropped whole, as trl's RewardTrainer filters them") {
  SentencePieceTokenizer tokenizer(kTokenizerPath);
  // The second pair's chosen side is longer than 16 + 1 tokens; everything else fits.
  const std::string long_text = " Alice and Bob and Alice and Bob and Alice and Bob and Alice and Bob";
  const std::vector<PreferencePair> pairs = {{"Hello", " world", " Bob"}, {"Hello", long_text, " world"}};
  const TokenizedPairs cut = tokenize_pairs(pairs, "pairs.jsonl", tokenizer, 16, tokenizer.eos_id());
  CHECK(cut.chosen.size() == 2);  // DPO cuts the long side, as trl's DPOTrainer
  CHECK(cut.truncated_count == 1);
  const TokenizedPairs reward = tokenize_pairs(pairs, "pairs.jsonl", tokenizer, 16, tokenizer.eos_id(), nullptr, true);
  REQUIRE(reward.chosen.size() == 1);
  CHECK(reward.too_long_count == 1);
  CHECK(reward.truncated_count == 0);
  CHECK(reward.chosen[0].tokens == cut.chosen[0].tokens);
  CHECK_THROWS_WITH_AS(tokenize_pairs({pairs[1]}, "pairs.jsonl", tokenizer, 16, tokenizer.eos_id(), nullptr, true),
                       "pairs.jsonl: no pair has a completion token on both sides within seq_len = 16 (0 prompts fill "
                       "the window, 1 pairs are longer)",
                       Error);
}

TEST_CASE("unpacked batches: one example a row, right-padded, targets shifted by one") {
  HostAllocator host;
  std::vector<TokenSequence> rows = {{{1, 10, 11, 12, 2}, {0, 0, 1, 1, 1}}, {{1, 20, 2}, {0, 1, 1}}};
  DataLoader loader(rows, 2, 6, 3, 1234, host);
  CHECK(loader.batches_per_epoch() == 1);
  Batch batch = loader.batch_in_order(0);
  CHECK(batch.input_ids.dtype == DType::i32);
  CHECK(batch.input_ids.device == Device::cpu);
  CHECK(batch.input_ids.shape == Shape{2, 6});
  CHECK(batch.targets.shape == Shape{2, 6});
  CHECK(row_of(batch.input_ids, 0) == std::vector<int32_t>{1, 10, 11, 12, 2, 3});
  CHECK(row_of(batch.targets, 0) == std::vector<int32_t>{-100, 11, 12, 2, -100, -100});
  CHECK(row_of(batch.input_ids, 1) == std::vector<int32_t>{1, 20, 2, 3, 3, 3});
  CHECK(row_of(batch.targets, 1) == std::vector<int32_t>{20, 2, -100, -100, -100, -100});
  CHECK(batch.counted_tokens == 5);
  // A full seq_len + 1 row fills the inputs and predicts its last token.
  DataLoader full({{{1, 5, 6, 7}, {0, 1, 1, 1}}}, 1, 3, 3, 0, host);
  Batch one = full.batch_in_order(0);
  CHECK(row_of(one.input_ids, 0) == std::vector<int32_t>{1, 5, 6});
  CHECK(row_of(one.targets, 0) == std::vector<int32_t>{5, 6, 7});
  CHECK(one.counted_tokens == 3);
}

TEST_CASE("concatenate packing: windows of seq_len + 1 tokens, seq_len apart, every token predicted once") {
  TokenizedDataset data;
  data.examples = {{{1, 10, 11, 2}, {0, 0, 1, 1}}, {{1, 20, 2}, {0, 1, 1}}};
  // Stream 1 10 11 2 | 1 20 2, windows at 0 and 3 (sharing token 2).
  std::vector<TokenSequence> rows = make_rows(data, 3, Packing::concatenate);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].tokens == std::vector<int32_t>{1, 10, 11, 2});
  CHECK(rows[1].tokens == std::vector<int32_t>{2, 1, 20, 2});
  CHECK(rows[1].loss_mask == std::vector<uint8_t>{1, 0, 1, 1});
  HostAllocator host;
  DataLoader loader(rows, 2, 3, 3, 1234, host);
  Batch batch = loader.batch_in_order(0);
  CHECK(row_of(batch.input_ids, 0) == std::vector<int32_t>{1, 10, 11});
  CHECK(row_of(batch.targets, 0) == std::vector<int32_t>{-100, 11, 2});
  CHECK(row_of(batch.input_ids, 1) == std::vector<int32_t>{2, 1, 20});
  CHECK(row_of(batch.targets, 1) == std::vector<int32_t>{-100, 20, 2});  // eos -> bos carries no loss
  CHECK(batch.counted_tokens == 4);  // = the loss tokens of both examples, none lost at the seam
  // The tail window is short; a lone last token makes no window.
  CHECK(make_rows(data, 2, Packing::concatenate).size() == 3);  // starts 0, 2, 4: [1 10 11] [11 2 1] [1 20 2]
  CHECK(make_rows(data, 6, Packing::concatenate).size() == 1);
  CHECK(make_rows(data, 3, Packing::none).size() == 2);
  CHECK(!batch.position_ids.defined());
}

// Lengths (inputs = tokens - 1) 5, 2, 4, 1, 3 into rows of 6 inputs, longest
// first, each where it fits most tightly: [5 1] [4 2] [3], file order on ties.
TEST_CASE("padding-free packing: whole examples by best-fit decreasing, positions restarting, own targets") {
  TokenizedDataset data;
  data.examples = {{{1, 10, 11, 12, 13, 2}, {0, 0, 1, 1, 1, 1}},
                   {{1, 20, 2}, {0, 1, 1}},
                   {{1, 30, 31, 32, 2}, {0, 1, 1, 1, 1}},
                   {{1, 2}, {0, 1}},
                   {{1, 50, 51, 2}, {0, 0, 1, 1}}};
  std::vector<TokenSequence> rows = make_rows(data, 6, Packing::padding_free);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].tokens == std::vector<int32_t>{1, 10, 11, 12, 13, 2, 1, 2});
  CHECK(rows[0].example_starts == std::vector<int64_t>{0, 6});
  CHECK(rows[1].tokens == std::vector<int32_t>{1, 30, 31, 32, 2, 1, 20, 2});
  CHECK(rows[1].example_starts == std::vector<int64_t>{0, 5});
  CHECK(rows[2].tokens == std::vector<int32_t>{1, 50, 51, 2});
  HostAllocator host;
  DataLoader loader(rows, 3, 6, 3, 1234, host);
  Batch batch = loader.batch_in_order(0);
  REQUIRE(batch.position_ids.defined());
  CHECK(row_of(batch.input_ids, 0) == std::vector<int32_t>{1, 10, 11, 12, 13, 1});
  CHECK(row_of(batch.targets, 0) == std::vector<int32_t>{-100, 11, 12, 13, 2, 2});
  CHECK(row_of(batch.position_ids, 0) == std::vector<int32_t>{0, 1, 2, 3, 4, 0});
  CHECK(row_of(batch.input_ids, 1) == std::vector<int32_t>{1, 30, 31, 32, 1, 20});
  CHECK(row_of(batch.targets, 1) == std::vector<int32_t>{30, 31, 32, 2, 20, 2});
  CHECK(row_of(batch.position_ids, 1) == std::vector<int32_t>{0, 1, 2, 3, 0, 1});
  CHECK(row_of(batch.input_ids, 2) == std::vector<int32_t>{1, 50, 51, 3, 3, 3});
  CHECK(row_of(batch.targets, 2) == std::vector<int32_t>{-100, 51, 2, -100, -100, -100});
  CHECK(row_of(batch.position_ids, 2) == std::vector<int32_t>{0, 1, 2, 0, 1, 2});  // the padding: a sequence of its own
  int64_t loss_tokens = 0;
  for (const TokenSequence& example : data.examples) loss_tokens += loss_token_count(example);
  CHECK(batch.counted_tokens == loss_tokens);
  // An epoch's empty tail rows count 0.. too; trim_padding keeps a prefix of them.
  DataLoader two_per_batch(rows, 2, 6, 3, 1234, host);
  CHECK(row_of(two_per_batch.batch_in_order(1).position_ids, 1) == std::vector<int32_t>{0, 1, 2, 3, 4, 5});
  // The same rows every time: they depend on the data and seq_len alone.
  CHECK(make_rows(data, 6, Packing::padding_free)[1].tokens == rows[1].tokens);
  // An example filling more than a row cannot be placed.
  TokenizedDataset too_long;
  too_long.examples = {{{1, 10, 11, 12, 13, 14, 15, 2}, {0, 1, 1, 1, 1, 1, 1, 1}}};
  CHECK_THROWS_WITH_AS(make_rows(too_long, 6, Packing::padding_free),
                       "padding-free packing: an example of 8 tokens does not fit a row of seq_len 6 + 1 tokens",
                       Error);
  TokenizedDataset empty;
  empty.examples = {{{1}, {0}}};
  CHECK_THROWS_WITH_AS(make_rows(empty, 6, Packing::padding_free),
                       "padding-free packing: an example of 1 tokens predicts nothing (it needs 2 tokens or more)",
                       Error);
}

TEST_CASE("a loader row with more inputs than seq_len is refused") {
  HostAllocator host;
  TokenSequence packed{{1, 10, 11, 2, 1, 20, 2}, {0, 1, 1, 1, 0, 1, 1}, {0, 4}};  // 3 + 2 = 5 inputs
  CHECK_NOTHROW(DataLoader({packed}, 1, 5, 3, 0, host));
  CHECK_THROWS_WITH_AS(DataLoader({packed}, 1, 4, 3, 0, host),
                       "DataLoader: a row of 2 examples in 7 tokens fills 5 inputs, more than seq_len = 4", Error);
}

TEST_CASE("shuffled order: deterministic from the seed, new each epoch, a permutation") {
  HostAllocator host;
  DataLoader loader(numbered_rows(10), 3, 4, 0, 1234, host);
  CHECK(loader.row_count() == 10);
  CHECK(loader.batches_per_epoch() == 4);
  std::vector<int64_t> order0 = loader.epoch_order(0), order1 = loader.epoch_order(1);
  // mt19937_64 is fully specified by the standard and the shuffle is ours, so
  // these orders hold on every compiler and standard library (cross-checked
  // with an independent Python MT19937-64 running the same Fisher-Yates).
  CHECK(order0 == std::vector<int64_t>{0, 3, 4, 7, 9, 8, 5, 6, 1, 2});
  CHECK(order1 == std::vector<int64_t>{9, 8, 0, 4, 6, 5, 1, 2, 7, 3});
  std::vector<int64_t> sorted = order1;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(order0 != order1);
  CHECK(DataLoader(numbered_rows(10), 3, 4, 0, 1234, host).epoch_order(1) == order1);
  CHECK(DataLoader(numbered_rows(10), 3, 4, 0, 1235, host).epoch_order(0) == order1);  // seed + epoch
  CHECK(DataLoader(numbered_rows(10), 3, 4, 0, 99, host).epoch_order(0) != order0);

  // next() walks epoch 0 in order0, pads the last micro-batch, then epoch 1.
  std::vector<int32_t> seen;
  for (int i = 0; i < 4; i++) {
    Batch batch = loader.next();
    std::vector<int32_t> ids = rows_in(batch);
    seen.insert(seen.end(), ids.begin(), ids.end());
    if (i == 3) {
      CHECK(ids.size() == 1);
      CHECK(batch.counted_tokens == 2);
      CHECK(row_of(batch.targets, 2) == std::vector<int32_t>{-100, -100, -100, -100});
    }
  }
  CHECK(std::vector<int64_t>(seen.begin(), seen.end()) == order0);
  CHECK(loader.position().epoch == 1);
  CHECK(loader.position().index == 0);
  std::vector<int32_t> first_of_epoch1 = rows_in(loader.next());
  CHECK(std::vector<int64_t>(first_of_epoch1.begin(), first_of_epoch1.end()) ==
        std::vector<int64_t>(order1.begin(), order1.begin() + 3));

  // Evaluation order is the file order.
  CHECK(rows_in(loader.batch_in_order(0)) == std::vector<int32_t>{0, 1, 2});
  CHECK(rows_in(loader.batch_in_order(3)) == std::vector<int32_t>{9});
}

TEST_CASE("a restored position continues with exactly the same batches") {
  HostAllocator host;
  DataLoader run(numbered_rows(7), 2, 4, 0, 42, host);
  for (int i = 0; i < 6; i++) run.next();  // 4 batches per epoch: now epoch 1, index 2
  DataPosition saved = run.position();
  CHECK(saved.epoch == 1);
  CHECK(saved.index == 2);
  DataLoader resumed(numbered_rows(7), 2, 4, 0, 42, host);
  resumed.set_position(saved);
  for (int i = 0; i < 5; i++) {
    Batch expected = run.next(), actual = resumed.next();
    CHECK(row_of(actual.input_ids, 0) == row_of(expected.input_ids, 0));
    CHECK(row_of(actual.input_ids, 1) == row_of(expected.input_ids, 1));
    CHECK(row_of(actual.targets, 1) == row_of(expected.targets, 1));
    CHECK(actual.counted_tokens == expected.counted_tokens);
  }
  CHECK(resumed.position().epoch == run.position().epoch);
  CHECK(resumed.position().index == run.position().index);
  CHECK_THROWS_WITH_AS(resumed.set_position({0, 4}),
                       "data position (epoch 0, micro-batch 4) does not exist: this dataset has 4 micro-batches per "
                       "epoch (did the data, seq_len, packing or micro_batch_size change?)",
                       Error);
  CHECK_THROWS_AS(resumed.set_position({-1, 0}), Error);
  CHECK_THROWS_AS(resumed.batch_in_order(4), Error);
}

TEST_CASE("end to end: a JSONL file to packed and unpacked batches") {
  SentencePieceTokenizer tokenizer(kTokenizerPath);
  std::string path = write_file("e2e.jsonl",
                                "{\"prompt\": \"Q: 2+2?\", \"completion\": \" A: 4\"}\n"
                                "{\"prompt\": \"Hello\", \"completion\": \" world\"}\n"
                                "{\"prompt\": \"Alice and Bob\", \"completion\": \" Hello world\"}\n");
  TokenizedDataset tokens = tokenize_dataset(load_jsonl(path, DataFormat::automatic), tokenizer, 8, tokenizer.eos_id());
  HostAllocator host;
  for (Packing packing : {Packing::none, Packing::padding_free, Packing::concatenate}) {
    CAPTURE(enum_name(packing));
    DataLoader loader(make_rows(tokens, 8, packing), 2, 8, padding_id(tokenizer), 1234, host);
    int64_t counted = 0;
    for (int64_t i = 0; i < loader.batches_per_epoch(); i++) {
      Batch batch = loader.next();
      CHECK(batch.input_ids.shape == Shape{2, 8});
      counted += batch.counted_tokens;
    }
    // Every loss token is predicted once every way; with concatenate because
    // consecutive windows share a token.
    CHECK(counted == tokens.loss_token_count);
    CHECK(loader.position().epoch == 1);
  }
  std::filesystem::remove_all(std::filesystem::path(FT_BINARY_DIR) / "test_data_tmp");
}
