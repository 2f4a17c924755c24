#include "trainer/rl/rewards.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "kernels/error.h"
#include "model/checksum.h"
#include "model/families.h"
#include "model/peft_adapter.h"
#include "trainer/data/data.h"
#include "model/safetensors.h"
#include "tokenizer/load_tokenizer.h"
#include "trainer/data/data.h"
#include "trainer/report/rouge.h"
#include "trainer/rl/grpo.h"
#include "trainer/rl/reward.h"

namespace ft {

std::vector<std::string> RewardRules::names() const {
  std::vector<std::string> out;
  if (!regex.empty()) out.push_back("regex");
  if (!rouge.empty()) out.push_back("rouge");
  if (!answer.empty()) out.push_back("answer");
  if (length > 0) out.push_back("length");
  if (!model.empty()) out.push_back("model");
  return out;
}

namespace {

// 1 where the completion matches pattern (a search), else 0.
std::vector<double> regex_rewards(const std::string& pattern, const std::vector<Rollout>& completions) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF, &error,
                                   &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    fail("rewards.regex: \"", pattern, "\" is not a valid pattern at offset ", offset, ": ",
         reinterpret_cast<const char*>(message));
  }
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(code, nullptr);
  std::vector<double> values;
  for (const Rollout& c : completions) {
    // PCRE2_NO_UTF_CHECK is not passed: a completion cut inside a character is invalid UTF-8 and does not match.
    const int found = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(c.text.data()), c.text.size(), 0, 0, match,
                                  nullptr);
    values.push_back(found >= 0 ? 1.0 : 0.0);
  }
  pcre2_match_data_free(match);
  pcre2_code_free(code);
  return values;
}

// At most 80 bytes of text, marked where cut.
std::string excerpt(const std::string& text) { return text.size() <= 80 ? text : text.substr(0, 77) + "..."; }

std::string row_text(const Rollout& c, const std::string& field, const char* key) {
  FT_CHECK(c.row && c.row->contains(field) && (*c.row)[field].is_string(), "rewards.", key, ": the prompt row ",
           c.row ? excerpt(c.row->dump()) : "", " has no string field \"", field, "\"");
  return (*c.row)[field].get<std::string>();
}

// The last number in text (an optional sign, digits, an optional fraction), if any.
std::optional<double> last_number(const std::string& text) {
  std::optional<double> found;
  for (size_t i = 0; i < text.size();) {
    const bool sign = text[i] == '-' && i + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[i + 1]));
    if (!sign && !std::isdigit(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    size_t end = i + (sign ? 1 : 0);
    while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == ',')) ++end;
    if (end + 1 < text.size() && text[end] == '.' && std::isdigit(static_cast<unsigned char>(text[end + 1])))
      for (++end; end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]));) ++end;
    std::string digits;
    for (size_t k = i; k < end; ++k)
      if (text[k] != ',') digits += text[k];
    // strtod, not stod: a completion's run of 400 digits is +inf here, not an exception that ends the run.
    found = std::strtod(digits.c_str(), nullptr);
    i = end;
  }
  return found;
}

std::vector<double> rule_values(const RewardRules& rules, const std::string& name,
                                const std::vector<Rollout>& completions, const RewardModel* reward_model) {
  if (name == "regex") return regex_rewards(rules.regex, completions);
  if (name == "model") {
    FT_CHECK(reward_model, "rewards.model: the reward model is not loaded");
    return reward_model->scores(completions);
  }
  std::vector<double> values;
  for (const Rollout& c : completions) {
    if (name == "rouge") values.push_back(rouge_scores(row_text(c, rules.rouge, "rouge"), c.text).rougeL);
    if (name == "answer") {
      const std::string want = row_text(c, rules.answer, "answer");
      const std::optional<double> expected = last_number(want), got = last_number(c.text);
      FT_CHECK(expected, "rewards.answer: field \"", rules.answer, "\" holds no number: \"", excerpt(want), "\"");
      values.push_back(got && std::abs(*got - *expected) <= 1e-9 * std::max(1.0, std::abs(*expected)) ? 1.0 : 0.0);
    }
    if (name == "length") {
      const double target = double(rules.length);
      values.push_back(-std::abs(double(c.tokens.size()) - target) / target);
    }
  }
  return values;
}

double rule_weight(const RewardRules& rules, const std::string& name) {
  return name == "regex" ? rules.regex_weight : name == "rouge" ? rules.rouge_weight
       : name == "answer" ? rules.answer_weight : name == "length" ? rules.length_weight : rules.model_weight;
}


}  // namespace

void check_reward_fields(const RewardRules& rules, const nlohmann::json& row, const std::string& where) {
  for (const auto& [key, field] : {std::pair{"rouge", &rules.rouge}, std::pair{"answer", &rules.answer}}) {
    if (field->empty()) continue;
    FT_CHECK(row.contains(*field) && row[*field].is_string(), where, ": rewards.", key, " reads the field \"", *field,
             "\", which this row ", row.contains(*field) ? "holds as a " + std::string(row[*field].type_name()) :
             "lacks", " (expected a string; the row has ", key_list(row), ")");
  }
  if (!rules.answer.empty())
    FT_CHECK(last_number(row[rules.answer].get<std::string>()), where, ": rewards.answer: the field \"",
             rules.answer, "\" holds no number: \"", excerpt(row[rules.answer].get<std::string>()), "\"");
}

ChatTemplate reward_chat_template(const std::string& tokenizer_file) {
  try {
    return resolve_chat_template(ChatTemplateKind::automatic,
                                 std::filesystem::path(tokenizer_file).parent_path().string(), nullptr);
  } catch (const Error& e) {
    fail("rewards.model: the prompts are lists of messages, so the reward model reads each prompt and completion "
         "rendered with its own tokenizer's chat template (as trl's GRPOTrainer): ", e.what());
  }
}

std::vector<int32_t> conversation_reward_tokens(const Rollout& rollout, const Tokenizer& tokenizer,
                                                const ChatTemplate& chat) {
  FT_CHECK(rollout.messages && rollout.messages->is_array(), "rewards.model: a rollout's prompt is not a list of "
           "messages");
  nlohmann::ordered_json messages = *rollout.messages;
  messages.push_back({{"role", "assistant"}, {"content", rollout.text}});
  return tokenizer.encode(render_chat_text(chat, messages, nullptr, false, "rewards.model"));
}

RewardModel::RewardModel(const RewardRules& rules, Backend& backend, const ModelOptions& options,
                         const std::string& policy_tokenizer_file, bool policy_seq2seq, int64_t rows_per_forward,
                         bool conversational_prompts)
    : rows_per_forward_(std::max<int64_t>(rows_per_forward, 1)) {
  const std::string config_json = (std::filesystem::path(rules.model) / "config.json").string();
  const ModelConfig config = read_model_config(config_json);
  const std::string own_tokenizer = default_tokenizer_path(rules.model);
  if (!rules.model_tokenizer.empty()) {
    tokenizer_ = load_tokenizer(rules.model_tokenizer, config.vocab_size);
  } else {
    FT_CHECK(std::filesystem::exists(own_tokenizer) &&
                 file_fingerprint(own_tokenizer) == file_fingerprint(policy_tokenizer_file),
             "rewards.model: ", rules.model, "'s tokenizer (", own_tokenizer, ") is not the policy's (",
             policy_tokenizer_file, "): set rewards.model_tokenizer to the reward model's tokenizer file, and "
             "prompts and completions are encoded anew with it");
    if (policy_seq2seq) tokenizer_ = load_tokenizer(own_tokenizer, config.vocab_size);
  }
  if (conversational_prompts) {  // rendered anew, with the reward tokenizer's own template
    if (!tokenizer_) tokenizer_ = load_tokenizer(own_tokenizer, config.vocab_size);
    chat_ = reward_chat_template(rules.model_tokenizer.empty() ? own_tokenizer : rules.model_tokenizer);
  }
  const std::unique_ptr<Tokenizer> own = tokenizer_ ? nullptr : load_tokenizer(own_tokenizer, config.vocab_size);
  const Tokenizer& tokenizer = tokenizer_ ? *tokenizer_ : *own;
  pad_id_ = padding_id(tokenizer);
  eos_id_ = tokenizer.eos_id();
  model_ = make_causal_lm(config, backend, options);
  model_->load(Checkpoint(rules.model));
  if (!rules.model_adapter.empty()) load_peft_adapter(rules.model_adapter, *model_);
  FT_CHECK(model_->output_head_loaded(), "rewards.model: ", rules.model, " has no score head (score.weight)",
           rules.model_adapter.empty() ? "" : " and rewards.model_adapter saves none",
           ": train one with objective: reward");
}

RewardModel::~RewardModel() = default;

// Scored as `finetune score` scores a row: the tokens the policy saw (or
// with the reward model's tokenizer, prompt and completion encoded as
// tokenize_example encodes them), ending with eos; a conversational one as
// trl's GRPOTrainer scores it (conversation_reward_tokens), cut to the
// model's positions as tokenize_example cuts (the start kept).
std::vector<double> RewardModel::scores(const std::vector<Rollout>& completions) const {
  std::vector<TokenSequence> sequences;
  for (const Rollout& c : completions) {
    TokenSequence sequence;
    if (chat_) {
      sequence.tokens = conversation_reward_tokens(c, *tokenizer_, *chat_);
      sequence.tokens.resize(std::min<size_t>(sequence.tokens.size(), size_t(model_->config().position_limit())));
    } else if (tokenizer_) {
      bool truncated = false;
      sequence = tokenize_example({c.prompt, c.text}, *tokenizer_, model_->config().position_limit() - 1,
                                  eos_id_, truncated);
    } else {
      sequence.tokens = c.prompt_tokens;
      sequence.tokens.insert(sequence.tokens.end(), c.tokens.begin(), c.tokens.end());
    }
    sequences.push_back(std::move(sequence));
  }
  std::vector<double> scores;
  for (size_t first = 0; first < sequences.size(); first += size_t(rows_per_forward_)) {
    const size_t end = std::min(sequences.size(), first + size_t(rows_per_forward_));
    HostAllocator host;
    const std::vector<TokenSequence> part(sequences.begin() + first, sequences.begin() + end);
    const std::vector<double> part_scores = sequence_scores(*model_, scored_sequences(part, pad_id_, host));
    scores.insert(scores.end(), part_scores.begin(), part_scores.end());
  }
  return scores;
}

Rewards compute_rewards(const RewardRules& rules, const std::vector<Rollout>& completions,
                        const RewardModel* reward_model) {
  Rewards rewards;
  rewards.names = rules.names();
  FT_CHECK(!rewards.names.empty(), "rewards: no reward is configured (rewards.regex, rouge, answer, length or model)");
  rewards.total.assign(completions.size(), 0.0);
  for (const std::string& name : rewards.names) {
    rewards.values.push_back(rule_values(rules, name, completions, reward_model));
    const double weight = rule_weight(rules, name);
    for (size_t i = 0; i < completions.size(); ++i) rewards.total[i] += weight * rewards.values.back()[i];
  }
  return rewards;
}

nlohmann::json Rewards::metrics() const {
  nlohmann::json out;
  for (size_t k = 0; k < names.size(); ++k) {
    out["rewards/" + names[k] + "/mean"] = mean_of(values[k]);
    out["rewards/" + names[k] + "/std"] = values[k].size() > 1 ? unbiased_std(values[k], 0, values[k].size()) : 0.0;
  }
  out["reward"] = mean_of(total);
  return out;
}

}  // namespace ft
