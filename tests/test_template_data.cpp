// DialogSum-shaped data: CSV with a header (quoted fields holding commas,
// doubled quotes and line breaks) or JSONL objects with named fields, made
// into prompt/completion examples by data.template; bad files and templates
// are errors naming the file, line and field.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "kernels/error.h"
#include "trainer/data/template_data.h"
#include "trainer/train_config.h"

using namespace ft;

namespace {

const std::string kFixtures = std::string(FT_FIXTURES_DIR) + "/dialogsum";
const RowTemplate kCourse = {"Summarize the following conversation.\n\n{dialogue}\n\nSummary: ", "{summary}"};

std::vector<NamedRow> csv(const std::string& text) {
  std::istringstream input(text);
  return read_csv(input, "t.csv");
}

}  // namespace

TEST_CASE("DialogSum as CSV: quoted multi-line fields, commas and doubled quotes, through the course's prompt") {
  const Dataset data = load_templated(kFixtures + "/train.csv", kCourse);
  REQUIRE(data.examples.size() == 2);
  CHECK(data.format == DataFormat::prompt_completion);
  CHECK(data.examples[0].prompt ==
        "Summarize the following conversation.\n\n#Person1#: Hi, Mr. Smith. I'm Doctor Hawkins.\r\n"
        "#Person2#: I found it on the \"tips\" page, of course.\n\nSummary: ");
  CHECK(data.examples[0].completion == "Mr. Smith's getting a check-up from Doctor Hawkins.");
  CHECK(data.examples[0].line == 2);
  CHECK(data.examples[1].completion == "#Person2# calls, \"finally\"; they talk.");
  CHECK(data.examples[1].line == 4);  // the record starts on line 4: line 3 is inside the first one's dialogue
}

TEST_CASE("DialogSum as JSONL with the same template") {
  const Dataset data = load_templated(kFixtures + "/train.jsonl", kCourse);
  REQUIRE(data.examples.size() == 1);
  CHECK(data.examples[0].prompt == "Summarize the following conversation.\n\n#Person1#: Hi.\n#Person2#: Hello.\n\nSummary: ");
  CHECK(data.examples[0].completion == "They greet.");
  // Numbers and booleans fill a field as their JSON text, as the same cell of a CSV file would.
  const std::string path = std::string(FT_BINARY_DIR) + "/template_numbers.jsonl";
  std::ofstream(path) << "{\"id\": 5, \"score\": 0.5, \"ok\": true, \"dialogue\": \"hi\", \"summary\": 7}\n";
  const Dataset numbers = load_templated(path, {"{id}. {dialogue} ({score}, {ok})", "{summary}"});
  REQUIRE(numbers.examples.size() == 1);
  CHECK(numbers.examples[0].prompt == "5. hi (0.5, true)");
  CHECK(numbers.examples[0].completion == "7");
  // An object, list or null is named for what it is, not as a field the row lacks.
  std::ofstream(path) << "{\"q\": \"hi\", \"meta\": {\"src\": \"x\"}, \"tags\": [\"a\"], \"none\": null}\n";
  CHECK_THROWS_WITH_AS(load_templated(path, {"{q} {meta}", "{q}"}),
                       (path + ":1: data.template.prompt names the field \"meta\", which is an object (expected a "
                               "string, number or boolean)").c_str(),
                       Error);
  CHECK_THROWS_WITH_AS(load_templated(path, {"{q}", "{tags}"}),
                       doctest::Contains("data.template.completion names the field \"tags\", which is a list"), Error);
  CHECK_THROWS_WITH_AS(load_templated(path, {"{none}", "{q}"}),
                       doctest::Contains("names the field \"none\", which is null"), Error);
}

TEST_CASE("CSV records: blank lines skipped, a missing final newline, empty fields") {
  const std::vector<NamedRow> rows = csv("a,b\n1,\n\n\"x\ny\",2");
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].fields.at("a") == "1");
  CHECK(rows[0].fields.at("b") == "");
  CHECK(rows[1].line == 4);
  CHECK(rows[1].fields.at("a") == "x\ny");
  CHECK(rows[1].fields.at("b") == "2");
  // Excel's "CSV UTF-8": a byte order mark before the header, CRLF line ends.
  const std::vector<NamedRow> excel = csv("\xEF\xBB\xBF" "dialogue,summary\r\nhi,caf\xC3\xA9\r\n");
  REQUIRE(excel.size() == 1);
  CHECK(excel[0].fields.at("dialogue") == "hi");
  CHECK(excel[0].fields.at("summary") == "caf\xC3\xA9");
}

TEST_CASE("bad CSV and templates are errors naming the file, line and field") {
  CHECK_THROWS_WITH_AS(csv("a,b\n1,2,3\n"), "t.csv:2: 3 fields, but the header has 2 columns", Error);
  CHECK_THROWS_WITH_AS(csv("a,b\n\"1,2\n"), "t.csv:2: a quoted field is not closed before the end of the file",
                       Error);
  CHECK_THROWS_WITH_AS(csv("a,a\n1,2\n"), "t.csv:1: column \"a\" twice", Error);
  CHECK_THROWS_WITH_AS(csv("a,b\n\"1\"x,2\n"), "t.csv:2: text after a quoted field's closing quote", Error);
  CHECK_THROWS_WITH_AS(csv(""), "t.csv: empty CSV file (expected a header line of column names)", Error);
  // Latin-1 (Excel's plain "CSV" on Windows) is refused as a JSONL row with those bytes is.
  CHECK_THROWS_WITH_AS(csv("a,b\nx,caf\xE9\n"),
                       "t.csv:2: column \"b\" (a CSV file is read as UTF-8: save it as \"CSV UTF-8\"): invalid UTF-8 "
                       "at byte 3",
                       Error);
  const NamedRow row{7, {{"dialogue", "hi"}, {"summary", "s"}}, {}};
  CHECK(fill_template("{{{dialogue}}}", row, "f:7", "p") == "{hi}");
  CHECK_THROWS_WITH_AS(fill_template("{topic}", row, "f.csv:7", "data.template.prompt"),
                       "f.csv:7: data.template.prompt names the field \"topic\", which the row lacks (it has "
                       "\"dialogue\", \"summary\")",
                       Error);
  CHECK_THROWS_WITH_AS(fill_template("{dialogue", row, "f:7", "data.template.prompt"),
                       doctest::Contains("data.template.prompt: a '{' without its '}'"), Error);
}

TEST_CASE("data.template in a config; a CSV file without one is refused naming the file") {
  const std::string base = "model: m\ndata:\n  train: " + kFixtures + "/train.csv\n";
  const TrainConfig c = parse_train_config(base + "  template: {prompt: \"{dialogue}\", completion: \"{summary}\"}\n",
                                           "c.yaml");
  CHECK(c.data.row_template.prompt == "{dialogue}");
  CHECK(c.data.row_template.completion == "{summary}");
  CHECK_THROWS_WITH_AS(parse_train_config(base, "c.yaml"),
                       doctest::Contains(("c.yaml: data: " + kFixtures + "/train.csv is CSV: set data.template.prompt").c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(parse_train_config(base + "  template: {prompt: \"{dialogue}\"}\n", "c.yaml"),
                       doctest::Contains("c.yaml: data.template needs both prompt and completion"), Error);
}

TEST_CASE("the course's FLAN-T5-base configs: its prompt, LoRA r=32 on q and v at lr 1e-3, full fine-tuning at 1e-5") {
  const std::string configs = std::string(FT_SOURCE_DIR) + "/configs/";
  const TrainConfig lora = load_train_config(configs + "flan-t5-base-dialogsum-lora.yaml");
  const TrainConfig full = load_train_config(configs + "flan-t5-base-dialogsum-full.yaml");
  for (const TrainConfig* c : {&lora, &full}) {
    CHECK(c->data.row_template.prompt == kCourse.prompt);
    CHECK(c->data.row_template.completion == kCourse.completion);
    CHECK(c->data.train.ends_with("dialogsum/train.csv"));
    CHECK(c->model.ends_with("flan-t5-base"));
  }
  CHECK(lora.trainable == Trainable::lora);
  CHECK(lora.lr == 1e-3);
  CHECK(lora.lora.r == 32);
  CHECK(lora.lora.lora_alpha == 32.0);
  CHECK(lora.lora.lora_dropout == 0.05);
  CHECK(lora.lora.target_modules == std::vector<std::string>{"q", "v"});
  CHECK(full.trainable == Trainable::all);
  CHECK(full.lr == 1e-5);
  // The fixture through their template: the lab's prompt around the dialogue.
  const Dataset data = load_templated(kFixtures + "/train.csv", lora.data.row_template);
  CHECK(data.examples[1].prompt.starts_with("Summarize the following conversation.\n\n#Person1#: Hello?"));
  CHECK(data.examples[1].prompt.ends_with("it's me.\n\nSummary: "));
}
