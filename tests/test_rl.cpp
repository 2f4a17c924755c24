// Online RL's parts around the loss (trainer/rl/): the reward rules on
// hand-made rollouts, against values worked out by hand or from the tested
// ROUGE (test_rouge's worked example), their weighted sum and trl's figures;
// the prompt rows (a row without "prompt", left truncation), trl's
// conversational prompts and their reward-model inputs against trl's
// GRPOTrainer (tests/fixtures/rl/conversational.json, written by
// scripts/make_rl_conversational_fixture.py) and their errors, the prompt
// loader's order, epoch after epoch, and its resume position; and the
// policy gradient's path, token_logps_backward, against the training step's
// own cross-entropy backward.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "tests/host_tensors.h"
#include "tokenizer/load_tokenizer.h"
#include "trainer/data/chat_template.h"
#include "trainer/data/data.h"
#include "trainer/evaluate.h"
#include "trainer/report/rouge.h"
#include "trainer/rl/reward.h"
#include "trainer/rl/prompts.h"
#include "trainer/rl/rewards.h"

using namespace ft;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = FT_FIXTURES_DIR;

// Rollouts of one prompt row with these texts; completion i has token_counts[i] tokens.
std::vector<Rollout> rollouts(const nlohmann::json& row, const std::vector<std::string>& texts,
                              const std::vector<size_t>& token_counts = {}) {
  std::vector<Rollout> out;
  for (size_t i = 0; i < texts.size(); ++i) {
    Rollout r;
    r.row = &row;
    r.prompt = "A prompt.";
    r.prompt_tokens = {1, 7, 9};
    r.tokens.assign(token_counts.empty() ? 1 : token_counts[i], 5);
    r.text = texts[i];
    out.push_back(r);
  }
  return out;
}

std::vector<double> rule(const RewardRules& rules, const std::vector<Rollout>& completions) {
  const Rewards rewards = compute_rewards(rules, completions, nullptr);
  REQUIRE(rewards.values.size() == 1);
  return rewards.values[0];
}

std::string write_rows(const std::string& name, const std::string& text) {
  const fs::path path = fs::path(FT_BINARY_DIR) / "test_rl" / name;
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
  return path.string();
}

}  // namespace

TEST_CASE("rewards.regex: 1 where the pattern is found (a search), 0 elsewhere; a bad pattern names its offset") {
  const nlohmann::json row = {{"prompt", "p"}};
  RewardRules rules;
  rules.regex = "^<think>.*</think>\\s*\\d+$";
  CHECK(rule(rules, rollouts(row, {"<think>so</think> 12", "<think>so</think> twelve", "12", ""})) ==
        std::vector<double>{1, 0, 0, 0});
  rules.regex = "cat";  // unanchored: anywhere in the text
  CHECK(rule(rules, rollouts(row, {"concatenate", "dog", "a cat\n"})) == std::vector<double>{1, 0, 1});
  // A completion cut inside a UTF-8 character is not valid UTF-8 and matches nothing.
  rules.regex = "caf";
  CHECK(rule(rules, rollouts(row, {"caf\xC3", "caf\xC3\xA9"})) == std::vector<double>{0, 1});
  rules.regex = "(ab";
  CHECK_THROWS_WITH_AS(compute_rewards(rules, rollouts(row, {"ab"}), nullptr),
                       "rewards.regex: \"(ab\" is not a valid pattern at offset 3: missing closing parenthesis",
                       Error);
}

TEST_CASE("rewards.answer: the last number of the completion against the row's answer, signs and commas read") {
  RewardRules rules;
  rules.answer = "answer";
  const nlohmann::json gsm8k = {{"prompt", "p"}, {"answer", "She pays 3 x 6 = 18.\n#### 1,234"}};
  CHECK(rule(rules, rollouts(gsm8k, {"so 1234", "The total is 1,234.", "1,234 or 1,235", "12.34", "none"})) ==
        std::vector<double>{1, 1, 0, 0, 0});
  const nlohmann::json negative = {{"prompt", "p"}, {"answer", "-3"}};
  // "5 - 3": a minus before a space is not a sign; "5-3" ends with -3.
  CHECK(rule(rules, rollouts(negative, {"it is -3", "5 - 3", "5-3", "-3.0", "-3.5"})) ==
        std::vector<double>{1, 0, 1, 1, 0});
  const nlohmann::json fraction = {{"prompt", "p"}, {"answer", "2.5"}};
  CHECK(rule(rules, rollouts(fraction, {"2.50", "2.", "x = 2.5."})) == std::vector<double>{1, 0, 1});
  // A completion's number too large for a double is no match, not an error.
  CHECK(rule(rules, rollouts(fraction, {"1" + std::string(400, '0'), "-" + std::string(400, '9')})) ==
        std::vector<double>{0, 0});
  const nlohmann::json no_number = {{"prompt", "p"}, {"answer", "many"}};
  CHECK_THROWS_WITH_AS(compute_rewards(rules, rollouts(no_number, {"3"}), nullptr),
                       "rewards.answer: field \"answer\" holds no number: \"many\"", Error);
  const nlohmann::json missing = {{"prompt", "p"}};
  CHECK_THROWS_WITH_AS(compute_rewards(rules, rollouts(missing, {"3"}), nullptr),
                       "rewards.answer: the prompt row {\"prompt\":\"p\"} has no string field \"answer\"", Error);
}

TEST_CASE("rewards.length and rewards.rouge: -|tokens - L| / L, and ROUGE-L F1 against the row's field") {
  const nlohmann::json row = {{"prompt", "p"}, {"summary", "the cat sat on the mat"}};
  RewardRules length;
  length.length = 10;
  CHECK(rule(length, rollouts(row, {"a", "b", "c", "d"}, {5, 10, 15, 1})) ==
        std::vector<double>{-0.5, 0.0, -0.5, -0.9});
  RewardRules rouge;
  rouge.rouge = "summary";
  const std::vector<double> values = rule(rouge, rollouts(row, {"the cat is on the mat", "dogs", "the cat sat on the mat"}));
  // test_rouge's worked example: LCS "the cat on the mat", 5 of 6 tokens each side.
  CHECK(values[0] == doctest::Approx(5.0 / 6.0).epsilon(1e-12));
  CHECK(values[0] == rouge_scores("the cat sat on the mat", "the cat is on the mat").rougeL);
  CHECK(values[1] == 0.0);
  CHECK(values[2] == 1.0);
}

TEST_CASE("several rules: each is reported and the reward is their sum with weights; trl's figures") {
  const nlohmann::json row = {{"prompt", "p"}, {"answer", "7"}};
  RewardRules rules;
  rules.regex = "^\\d+$";
  rules.regex_weight = 2.0;
  rules.answer = "answer";
  rules.answer_weight = -1.0;
  rules.length = 4;
  rules.length_weight = 0.5;
  CHECK(rules.names() == std::vector<std::string>{"regex", "answer", "length"});
  const Rewards rewards = compute_rewards(rules, rollouts(row, {"7", "8", "it is 7"}, {2, 4, 6}), nullptr);
  REQUIRE(rewards.names == rules.names());
  CHECK(rewards.values[0] == std::vector<double>{1, 1, 0});
  CHECK(rewards.values[1] == std::vector<double>{1, 0, 1});
  CHECK(rewards.values[2] == std::vector<double>{-0.5, 0, -0.5});
  // 2 regex - answer + 0.5 length.
  CHECK(rewards.total == std::vector<double>{2 - 1 - 0.25, 2.0, -1 - 0.25});
  const nlohmann::json figures = rewards.metrics();
  CHECK(figures["reward"].get<double>() == doctest::Approx((0.75 + 2.0 - 1.25) / 3).epsilon(1e-12));
  CHECK(figures["rewards/regex/mean"].get<double>() == doctest::Approx(2.0 / 3).epsilon(1e-12));
  // torch.std (unbiased) of {1, 1, 0}: mean 2/3, squares 1/9 + 1/9 + 4/9 = 2/3, over n - 1 = 2.
  CHECK(figures["rewards/regex/std"].get<double>() == doctest::Approx(std::sqrt(1.0 / 3)).epsilon(1e-12));
  CHECK(figures["rewards/length/mean"].get<double>() == doctest::Approx(-1.0 / 3).epsilon(1e-12));
  CHECK_THROWS_WITH_AS(compute_rewards(RewardRules{}, rollouts(row, {"7"}), nullptr),
                       "rewards: no reward is configured (rewards.regex, rouge, answer, length or model)", Error);
}

TEST_CASE("prompt rows: a row without \"prompt\" names its line; long prompts keep their end") {
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(kFixtures + "/tokenizer/tokenizer.model", 320);
  const std::string good = write_rows("prompts.jsonl",
                                      "{\"prompt\": \"Hello there, how are you today?\", \"answer\": \"4\"}\n"
                                      "{\"prompt\": \"Hi\"}\n");
  const std::vector<int32_t> whole = prompt_tokens(*tokenizer, "Hello there, how are you today?");
  REQUIRE(whole.size() > 4);
  const std::vector<PromptRow> rows = load_prompt_rows(good, *tokenizer, 4);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].row["answer"] == "4");
  CHECK(rows[0].tokens == std::vector<int32_t>(whole.end() - 4, whole.end()));
  CHECK(rows[1].tokens == prompt_tokens(*tokenizer, "Hi"));
  const std::string bad = write_rows("no_prompt.jsonl", "{\"prompt\": \"a\"}\n{\"text\": \"b\"}\n");
  CHECK_THROWS_WITH_AS(load_prompt_rows(bad, *tokenizer, 64),
                       (bad + ":2: row lacks \"prompt\": expected a \"prompt\" string or list of messages "
                              "(objective: grpo and ppo generate from prompts), got keys \"text\"").c_str(),
                       Error);
  // The rule rewards' fields are checked as the rows load, each failure naming the row's line.
  RewardRules rules;
  rules.answer = "answer";
  CHECK_THROWS_WITH_AS(load_prompt_rows(good, *tokenizer, 4, ModelKind::causal, &rules),
                       (good + ":2: rewards.answer reads the field \"answer\", which this row lacks (expected a "
                               "string; the row has keys \"prompt\")").c_str(),
                       Error);
  const std::string words = write_rows("words.jsonl", "{\"prompt\": \"p\", \"answer\": \"x = 4\"}\n"
                                                      "{\"prompt\": \"p\", \"answer\": \"four\"}\n");
  CHECK_THROWS_WITH_AS(load_prompt_rows(words, *tokenizer, 4, ModelKind::causal, &rules),
                       (words + ":2: rewards.answer: the field \"answer\" holds no number: \"four\"").c_str(), Error);
  RewardRules rouge;
  rouge.rouge = "answer";
  CHECK(load_prompt_rows(words, *tokenizer, 4, ModelKind::causal, &rouge).size() == 2);
  // An empty prompt under a tokenizer that adds no bos (Qwen2's) leaves nothing to generate from.
  const std::unique_ptr<Tokenizer> no_bos = load_tokenizer(kFixtures + "/tokenizers/qwen2/tokenizer.json", 1024);
  const std::string empty = write_rows("empty.jsonl", "{\"prompt\": \"a\"}\n{\"prompt\": \"\"}\n");
  CHECK(load_prompt_rows(empty, *tokenizer, 4).size() == 2);  // its bos
  CHECK_THROWS_WITH_AS(load_prompt_rows(empty, *no_bos, 4),
                       (empty + ":2: \"prompt\" is empty and the tokenizer adds no bos token, so the policy would "
                                "have no token to generate from (give every prompt some text)").c_str(),
                       Error);
  const std::string number = write_rows("number.jsonl", "{\"prompt\": \"p\", \"answer\": 4}\n");
  CHECK_THROWS_WITH_AS(load_prompt_rows(number, *tokenizer, 4, ModelKind::causal, &rouge),
                       (number + ":1: rewards.rouge reads the field \"answer\", which this row holds as a number "
                                 "(expected a string; the row has keys \"answer\", \"prompt\")").c_str(),
                       Error);
}

// GRPOTrainer._tokenize_prompts renders every conversational prompt with
// add_generation_prompt (a prompt ending with the assistant's message too: a
// new assistant turn follows it, where trl's maybe_apply_chat_template would
// continue it) and adds no special token of its own; its _calculate_rewards
// gives a reward model the prompt and the completion as the assistant's
// message, rendered with the reward tokenizer's template, no special token added.
TEST_CASE("conversational prompts: the policy's prompt tokens and the reward model's inputs are trl's GRPOTrainer's") {
  std::ifstream file(kFixtures + "/rl/conversational.json");
  REQUIRE(file.good());
  const nlohmann::json fixture = nlohmann::json::parse(file);
  REQUIRE(fixture["prompts"].size() == 8);
  REQUIRE(fixture["rewards"].size() == 8);
  auto chat_of = [&](const nlohmann::json& family) {
    return resolve_chat_template(ChatTemplateKind::automatic, kFixtures + "/chat/" + family.get<std::string>());
  };
  auto tokenizer_of = [&](const nlohmann::json& checkpoint) {
    return load_tokenizer(kFixtures + "/" + checkpoint.get<std::string>() + "/tokenizer.json", 700);
  };
  int continued = 0;
  for (const nlohmann::json& c : fixture["prompts"]) {
    CAPTURE(c["prompt"].dump());
    const std::unique_ptr<Tokenizer> tokenizer = tokenizer_of(c["checkpoint"]);
    const ChatTemplate chat = chat_of(c["chat_template"]);
    const std::string path = write_rows("conversational.jsonl", nlohmann::json{{"prompt", c["prompt"]}}.dump() + "\n");
    const std::vector<PromptRow> rows = load_prompt_rows(path, *tokenizer, 4096, ModelKind::causal, nullptr, &chat);
    REQUIRE(rows.size() == 1);
    const std::vector<int32_t> want = c["prompt_ids"];
    CHECK(rows[0].tokens == want);
    CHECK(rows[0].messages == nlohmann::ordered_json(c["prompt"]));
    if (c["prompt"].back()["role"] == "assistant") continued++;
    else CHECK(rows[0].prompt == c["maybe_apply_chat_template_prompt"].get<std::string>());
    // Cut to the prompt budget as a string prompt is: its end kept.
    const std::vector<PromptRow> cut = load_prompt_rows(path, *tokenizer, 5, ModelKind::causal, nullptr, &chat);
    CHECK(cut[0].tokens == std::vector<int32_t>(want.end() - 5, want.end()));
  }
  CHECK(continued == 2);
  for (const nlohmann::json& c : fixture["rewards"]) {
    CAPTURE(c["prompt"].dump());
    const std::unique_ptr<Tokenizer> tokenizer = tokenizer_of(c["reward_checkpoint"]);
    const nlohmann::ordered_json messages = c["prompt"];
    Rollout rollout;
    rollout.messages = &messages;
    rollout.text = c["completion"];
    CHECK(conversation_reward_tokens(rollout, *tokenizer, chat_of(c["reward_chat_template"])) ==
          c["reward_ids"].get<std::vector<int32_t>>());
  }
}

TEST_CASE("conversational prompts: bad rows, mixed forms, a seq2seq policy and a missing template are refused by line") {
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(kFixtures + "/qwen2_tiny/tokenizer.json", 700);
  const ChatTemplate chat = resolve_chat_template(ChatTemplateKind::chatml, kFixtures + "/qwen2_tiny");
  const std::string user = R"({"role": "user", "content": "Hi"})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt": 5})", ":1: \"prompt\" must be a string or a list of {\"role\", \"content\"} messages (trl's "
                           "conversational prompt), got number"},
      {R"({"prompt": []})", ":1: \"prompt\" is an empty list (expected a \"prompt\" string or list of messages)"},
      {R"({"prompt": ["Hi"]})", ":1: \"prompt\": messages[0] must be a {\"role\", \"content\"} object, got string"},
      {R"({"prompt": [{"role": "user"}]})", ":1: \"prompt\": messages[0] lacks \"content\""},
      {R"({"prompt": [{"role": "user", "content": 3}]})",
       ":1: \"prompt\": messages[0].content must be a string, got number"},
      {"{\"prompt\": [" + user + R"(, {"role": "tool", "content": "4"}]})",
       ":1: \"prompt\": messages[1].role is \"tool\" (expected system, user or assistant)"},
      {"{\"prompt\": [" + user + "]}\n{\"prompt\": \"Hi\"}",
       ":2: \"prompt\" is a string and the first row's is not: give every row's prompt in one form"},
      {"{\"prompt\": \"Hi\"}\n\n{\"prompt\": [" + user + "]}",
       ":3: \"prompt\" is a list of messages and the first row's is not: give every row's prompt in one form"},
  };
  for (const auto& [rows, error] : cases) {
    CAPTURE(rows);
    const std::string path = write_rows("bad_conversational.jsonl", rows + "\n");
    CHECK_THROWS_WITH_AS(load_prompt_rows(path, *tokenizer, 64, ModelKind::causal, nullptr, &chat),
                         (path + error).c_str(), Error);
  }
  const std::string good = write_rows("good_conversational.jsonl", "\n{\"prompt\": [" + user + "]}\n");
  const std::string seq2seq = good + ":2: \"prompt\" is a list of messages (trl's conversational prompt), which a "
                              "decoder-only policy's chat template renders; this policy is an encoder-decoder "
                              "(seq2seq) model without one: give \"prompt\" strings";
  CHECK_THROWS_WITH_AS(load_prompt_rows(good, *tokenizer, 64, ModelKind::seq2seq, nullptr, &chat), seq2seq.c_str(),
                       Error);
  CHECK_THROWS_WITH_AS(
      prompt_chat_template({"", good}, ChatTemplateKind::chatml, kFixtures + "/qwen2_tiny", ModelKind::seq2seq),
      seq2seq.c_str(), Error);
  CHECK(load_prompt_rows(good, *tokenizer, 64, ModelKind::causal, nullptr, &chat)[0].prompt ==
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");

  // The template is found before the weights load, from the first conversational row of either file.
  const std::string strings = write_rows("string_prompts.jsonl", "{\"prompt\": \"Hi\"}\n");
  CHECK(!prompt_chat_template({strings, ""}, ChatTemplateKind::automatic, kFixtures + "/qwen2_tiny", ModelKind::causal));
  const std::optional<ChatTemplate> found =
      prompt_chat_template({strings, good}, ChatTemplateKind::automatic, kFixtures + "/chat/qwen2", ModelKind::causal);
  REQUIRE(found);
  CHECK(found->source == kFixtures + "/chat/qwen2/tokenizer_config.json");
  CHECK_THROWS_WITH_AS(
      prompt_chat_template({strings, good}, ChatTemplateKind::automatic, kFixtures + "/qwen2_tiny", ModelKind::causal),
      (good + ":2: \"prompt\" is a list of messages (trl's conversational prompt), which the policy's chat template "
              "renders: " + kFixtures + "/qwen2_tiny/tokenizer_config.json: no chat_template to render chat rows "
              "with; set data.chat_template to one of chatml, llama2, llama3, zephyr").c_str(),
      Error);
  // A reward model reads conversational prompts with its own tokenizer's template.
  CHECK_THROWS_WITH_AS(reward_chat_template(kFixtures + "/qwen2_tiny/tokenizer.json"),
                       ("rewards.model: the prompts are lists of messages, so the reward model reads each prompt and "
                        "completion rendered with its own tokenizer's chat template (as trl's GRPOTrainer): " +
                        kFixtures + "/qwen2_tiny/tokenizer_config.json: no chat_template to render chat rows with")
                           .c_str(),
                       Error);
  CHECK(reward_chat_template(kFixtures + "/chat/llama3/tokenizer.json").name ==
        kFixtures + "/chat/llama3/tokenizer_config.json: chat_template");
}

// The reward fixture's classifier, its tokenizer in a folder whose
// tokenizer_config.json holds a ChatML template: a conversational rollout is
// scored as that template renders prompt + completion, encoded alone.
TEST_CASE("rewards.model: a conversational rollout is scored on the reward tokenizer's chat template's text") {
  const fs::path folder = fs::path(FT_BINARY_DIR) / "test_rl" / "chat_reward_tokenizer";
  fs::create_directories(folder);
  fs::copy_file(kFixtures + "/tokenizer/tokenizer.model", folder / "tokenizer.model",
                fs::copy_options::overwrite_existing);
  std::ofstream(folder / "tokenizer_config.json")
      << R"({"chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"})";
  RewardRules rules;
  rules.model = kFixtures + "/reward/model";
  rules.model_tokenizer = (folder / "tokenizer.model").string();
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options;
  options.output_head = OutputHead::score;
  const std::string policy_tokenizer = kFixtures + "/tokenizer/tokenizer.model";
  const RewardModel conversational(rules, backend, options, policy_tokenizer, false, 2, true);
  const RewardModel plain(rules, backend, options, policy_tokenizer, false, 2, false);

  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(policy_tokenizer, 320);
  const nlohmann::json row = {{"prompt", "ignored"}};
  const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "Hello there"}}};
  Rollout rollout;
  rollout.row = &row;
  rollout.prompt = "Hello there";
  rollout.prompt_tokens = prompt_tokens(*tokenizer, rollout.prompt);
  rollout.text = "General Kenobi";
  rollout.tokens = tokenizer->encode(rollout.text);
  rollout.messages = &messages;

  std::unique_ptr<CausalLM> model = make_causal_lm(read_model_config(rules.model + "/config.json"), backend, options);
  model->load(Checkpoint(rules.model));
  TokenSequence rendered;
  rendered.tokens = tokenizer->encode("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\nGeneral Kenobi"
                                      "<|im_end|>\n");
  const double want = sequence_scores(*model, scored_sequences({rendered}, padding_id(*tokenizer), host))[0];
  const double got = conversational.scores({rollout})[0];
  CHECK(got == doctest::Approx(want).epsilon(1e-6));
  CHECK(plain.scores({rollout})[0] != doctest::Approx(got).epsilon(1e-6));
}

TEST_CASE("the prompt loader draws each epoch in shuffled_order and resumes from its position") {
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(kFixtures + "/tokenizer/tokenizer.model", 320);
  std::string text;
  for (int i = 0; i < 7; ++i) text += "{\"prompt\": \"p\", \"id\": " + std::to_string(i) + "}\n";
  const std::vector<PromptRow> rows = load_prompt_rows(write_rows("seven.jsonl", text), *tokenizer, 16);
  auto ids = [](const std::vector<const PromptRow*>& drawn) {
    std::vector<int64_t> out;
    for (const PromptRow* p : drawn) out.push_back(p->row["id"].get<int64_t>());
    return out;
  };
  PromptLoader loader(rows, 99);
  // 3 steps of 4: the first epoch's order, then the second's.
  std::vector<int64_t> drawn;
  for (int step = 0; step < 3; ++step)
    for (int64_t id : ids(loader.next(4))) drawn.push_back(id);
  std::vector<int64_t> expected = shuffled_order(7, 99, 0);
  const std::vector<int64_t> second = shuffled_order(7, 99, 1);
  expected.insert(expected.end(), second.begin(), second.begin() + 5);
  CHECK(drawn == expected);
  CHECK(loader.position().epoch == 1);
  CHECK(loader.position().index == 5);
  CHECK(shuffled_order(7, 99, 0) != second);

  // A loader set to any position draws what the first one drew from there on.
  for (int64_t start : {0, 3, 7, 9}) {
    CAPTURE(start);
    PromptLoader first(rows, 99), resumed(rows, 99);
    first.next(start);
    resumed.set_position(first.position());
    CHECK(ids(resumed.next(6)) == ids(first.next(6)));
  }
  PromptLoader other(rows, 99);
  CHECK_THROWS_WITH_AS(other.set_position({0, 8}), "the checkpoint's prompt position 8 is past the 7 prompt rows",
                       Error);
}

TEST_CASE("token_logps_backward with d/dlogp = -1/N per counted token gives the cross-entropy step's gradients") {
  // GRPO's (and PPO's) loss reaches the adapters only through the gradient in
  // each token's log-probability; -mean(logp) is the SFT loss, whose
  // gradients forward_backward computes by another path.
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options;
  options.lora = read_peft_adapter_config(kFixtures + "/llama_lora/adapter").lora;
  options.lora->lora_dropout = 0.0;
  auto model = make_causal_lm(read_model_config(kFixtures + "/llama_gqa/config.json"), backend, options);
  model->load(Checkpoint(kFixtures + "/llama_gqa"));
  load_peft_adapter(kFixtures + "/llama_lora/adapter", *model);
  model->set_trainable([](const std::string& name) { return name.find("lora_") != std::string::npos; });
  const int64_t B = 2, T = 6;
  Tensor ids = Tensor::empty({B, T}, DType::i32, host, MemCategory::activations);
  Tensor targets = Tensor::empty({B, T}, DType::i32, host, MemCategory::activations);
  const std::vector<int32_t> id_values = {1, 17, 99, 250, 8, 40, 1, 5, 300, 12, 3, 3};
  const std::vector<int32_t> target_values = {-100, -100, 250, 8, 40, 61, -100, 300, 12, 2, -100, -100};
  std::copy(id_values.begin(), id_values.end(), ids.ptr<int32_t>());
  std::copy(target_values.begin(), target_values.end(), targets.ptr<int32_t>());
  const int64_t counted = 7;

  model->zero_grads();
  const double loss = model->forward_backward(ids, targets);
  std::vector<std::vector<float>> want;
  for (Parameter& adapter : model->adapters()) want.push_back(testing::read(adapter.grad));
  const std::vector<float> eval_logps = model->token_logps(ids, targets);

  model->zero_grads();
  const TokenLogpsGradient mean_nll = [&](const std::vector<float>& logps) {
    std::vector<float> d(logps.size(), 0.0f);
    for (size_t n = 0; n < d.size(); ++n) d[n] = target_values[n] == -100 ? 0.0f : -1.0f / float(counted);
    return d;
  };
  const std::vector<float> logps = model->token_logps_backward(ids, targets, mean_nll);
  REQUIRE(logps.size() == size_t(B * T));
  double sum = 0.0;
  for (size_t n = 0; n < logps.size(); ++n) {
    CAPTURE(n);
    CHECK(logps[n] == doctest::Approx(eval_logps[n]).epsilon(1e-6));
    if (target_values[n] == -100) CHECK(logps[n] == 0.0f);
    sum += logps[n];
  }
  CHECK(-sum / double(counted) == doctest::Approx(loss).epsilon(1e-5));
  size_t k = 0;
  for (Parameter& adapter : model->adapters()) {
    CAPTURE(adapter.name);
    const std::vector<float> got = testing::read(adapter.grad);
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      diff += (double(got[i]) - want[k][i]) * (double(got[i]) - want[k][i]);
      norm += double(want[k][i]) * want[k][i];
    }
    CHECK(norm > 0.0);
    CHECK(std::sqrt(diff / norm) <= 1e-5);
    ++k;
  }
}
