#include "trainer/train_config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>

#include "kernels/checked_mul.h"
#include "kernels/error.h"
#include "kernels/input_file.h"
#include "model/lora_pattern.h"
#include "model/model_config.h"
#include "tokenizer/load_tokenizer.h"

namespace ft {
namespace {

// ---------------------------------------------------------------------------
// Enum spellings (enum_names(), train_config.h), in the order messages list them

const EnumName<InitMode> kInitModes[] = {{"pretrained", InitMode::pretrained}, {"random", InitMode::random}};
const EnumName<Trainable> kTrainables[] = {{"lora", Trainable::lora}, {"all", Trainable::all}};
const EnumName<QuantizedBase> kQuantModes[] = {
    {"int8", QuantizedBase::int8}, {"nf4", QuantizedBase::nf4}, {"none", QuantizedBase::none}};
const EnumName<Precision> kPrecisions[] = {{"fp32", Precision::fp32}, {"bf16", Precision::bf16}};
const EnumName<DeviceChoice> kDevices[] = {
    {"auto", DeviceChoice::automatic}, {"cpu", DeviceChoice::cpu}, {"cuda", DeviceChoice::cuda}};
const EnumName<ActivationCheckpointing> kCheckpointings[] = {{"none", ActivationCheckpointing::none},
                                                              {"per_layer", ActivationCheckpointing::per_layer}};
const EnumName<Schedule> kSchedules[] = {
    {"constant", Schedule::constant}, {"linear", Schedule::linear}, {"cosine", Schedule::cosine}};
const EnumName<TaskMetric> kTaskMetrics[] = {{"none", TaskMetric::none}, {"rouge", TaskMetric::rouge}};
const EnumName<Objective> kObjectives[] = {
    {"sft", Objective::sft}, {"dpo", Objective::dpo}, {"reward", Objective::reward}, {"grpo", Objective::grpo}, {"ppo", Objective::ppo}};
const EnumName<DpoLoss> kDpoLosses[] = {{"sigmoid", DpoLoss::sigmoid}, {"ipo", DpoLoss::ipo}};
const EnumName<OffloadTarget> kOffloadTargets[] = {{"device", OffloadTarget::device}, {"host", OffloadTarget::host}};

// ---------------------------------------------------------------------------
// One value read from the YAML file or from --set, with where it came from.

std::string describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsSequence()) return node.size() == 0 ? "an empty list" : "a list";
  if (node.IsMap()) return node.size() == 0 ? "an empty map" : "a map";
  return "\"" + node.Scalar() + "\"";
}

constexpr std::string_view kOutputDirVariable = "${output_dir}";

struct Value {
  const YAML::Node& node;
  std::string key;       // dotted, e.g. "lora.r"
  std::string where;     // "configs/x.yaml:12" or "configs/x.yaml (--set lr=1)"
  std::string base_dir;  // relative paths are resolved against it ("" = keep as is)

  [[noreturn]] void wrong(const std::string& expected) const {
    fail(where, ": ", key, ": expected ", expected, ", got ", describe(node));
  }
  void require(bool ok, const std::string& expected) const {
    if (!ok) wrong(expected);
  }
  const std::string& scalar(const char* expected) const {
    if (!node.IsScalar()) wrong(expected);
    return node.Scalar();
  }

  // std::from_chars over the whole text: no hex, no octal, no trailing junk;
  // never inf or nan (a run with them trains on garbage).
  double number() const {
    const std::string& text = scalar("a finite number");
    double value = 0;
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    require(error == std::errc() && end == text.data() + text.size() && std::isfinite(value), "a finite number");
    return value;
  }
  // Every integer field has an upper bound (configs/README.md), checked here
  // before any arithmetic uses the value.
  int64_t integer_in(int64_t low, int64_t high) const {
    const std::string expected = "an integer in [" + std::to_string(low) + ", " + std::to_string(high) + "]";
    const std::string& text = scalar(expected.c_str());
    int64_t value = 0;
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    require(error == std::errc() && end == text.data() + text.size() && value >= low && value <= high, expected);
    return value;
  }
  bool boolean() const {
    bool value = false;
    require(node.IsScalar() && YAML::convert<bool>::decode(node, value), "true or false");
    return value;
  }
  std::string string() const {
    if (node.IsNull()) return "";
    return scalar("a string");
  }
  // A path that starts with ${output_dir} is kept as written here and
  // expanded once every layer and --set is applied (expand_output_dir), so
  // it follows a --set output_dir: a comparison's later run names an earlier
  // run's output this way.
  std::string path() const {
    std::string text = string();
    if (text.starts_with("${")) {
      require(text.starts_with(kOutputDirVariable) &&
                  (text.size() == kOutputDirVariable.size() || text[kOutputDirVariable.size()] == '/'),
              "a path; the only variable is ${output_dir}, at its start");
      require(key != "output_dir", "a directory path without ${output_dir} (it is output_dir itself)");
      return text;
    }
    if (text.empty() || base_dir.empty() || std::filesystem::path(text).is_absolute()) return text;
    return (std::filesystem::path(base_dir) / text).lexically_normal().string();
  }
  std::vector<std::string> strings() const {
    if (!node.IsSequence()) wrong("a list of strings");
    std::vector<std::string> items;
    for (const YAML::Node& item : node) {
      require(item.IsScalar() && !item.Scalar().empty(), "a list of non-empty strings");
      items.push_back(item.Scalar());
    }
    return items;
  }
  // A map from PEFT module pattern to value (lora.rank_pattern), in the
  // file's order (the first matching pattern wins); each value is read by
  // `read` as a Value whose key names the pattern.
  template <class Read>
  void each_pattern(Read read) const {
    if (node.IsNull()) return;
    if (!node.IsMap()) wrong("a map from module pattern to value, e.g. {q_proj: 16}");
    std::set<std::string> seen;
    for (const auto& entry : node) {
      require(entry.first.IsScalar() && !entry.first.Scalar().empty(), "a map whose keys are module patterns");
      const std::string& pattern = entry.first.Scalar();
      require(seen.insert(pattern).second, "each module pattern once (\"" + pattern + "\" twice)");
      read(pattern, Value{entry.second, key + " \"" + pattern + "\"", where, ""});
    }
  }
  // An id in [0, 2^31) or the text of a token (checked against the
  // vocabulary once the tokenizer is loaded).
  TokenRef token() const {
    const std::string& text = scalar("a token id or a token's text");
    int64_t id = 0;
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), id);
    if (error == std::errc() && end == text.data() + text.size()) {
      require(id >= 0 && id <= INT32_MAX, "a token id in [0, 2147483647] or a token's text");
      return TokenRef{id, ""};
    }
    require(!text.empty(), "a token id or a token's (non-empty) text");
    return TokenRef{-1, text};
  }
  // true (padding_free), false (none), or a spelling of Packing.
  Packing packing() const {
    bool flag = false;
    if (node.IsScalar() && YAML::convert<bool>::decode(node, flag)) return flag ? Packing::padding_free : Packing::none;
    const std::optional<Packing> value = node.IsScalar() ? enum_value(node.Scalar(), enum_names(Packing{})) : std::nullopt;
    if (!value) wrong("true, false, " + enum_spellings(enum_names(Packing{})));
    return *value;
  }
  // PEFT's init_lora_weights: true, false, or "gaussian" (any case, as PEFT
  // lowers it).
  LoraInit lora_init() const {
    bool flag = false;
    if (node.IsScalar() && YAML::convert<bool>::decode(node, flag))
      return flag ? LoraInit::kaiming_uniform : LoraInit::random;
    if (!node.IsScalar() || ascii_lowercase(node.Scalar()) != "gaussian")
      wrong("true, false or gaussian (PEFT's initialisations from the weights or the data, such as pissa, olora, "
            "loftq, corda or eva, are not supported)");
    return LoraInit::gaussian;
  }
  template <class E>
  E choice() const {
    const std::optional<E> value = node.IsScalar() ? enum_value(node.Scalar(), enum_names(E{})) : std::nullopt;
    if (!value) wrong("one of " + enum_spellings(enum_names(E{})));
    return *value;
  }
};

// ---------------------------------------------------------------------------
// The schema: every leaf key with its setter and range check, in README order.

// Upper bounds of the fields (configs/README.md): far above any real run,
// low enough that products of them (tokens per step, steps per run) stay
// exact in int64_t and every size is checked before it is allocated.
constexpr int64_t kMaxLoraRank = int64_t(1) << 16;
constexpr int64_t kMaxSeqLen = int64_t(1) << 20;
constexpr int64_t kMaxBatch = int64_t(1) << 16;
constexpr int64_t kMaxTokens = int64_t(1) << 30;
constexpr int64_t kMaxSteps = 1'000'000'000;
constexpr int64_t kMaxEpochs = 1'000'000;
constexpr int64_t kMaxExamples = 1'000'000;
constexpr int64_t kMaxBadSteps = 1'000'000;
constexpr int64_t kMaxRanks = int64_t(1) << 20;
constexpr int64_t kMaxTimeoutS = int64_t(1) << 31;
constexpr int64_t kMaxLayers = int64_t(1) << 16;
constexpr double kMaxLr = 10.0;
constexpr double kMaxScale = 1e6;
constexpr double kMaxTemperature = 100.0;

struct Field {
  const char* key;
  void (*set)(TrainConfig& c, const Value& v);
};

const Field kFields[] = {
    {"model", [](TrainConfig& c, const Value& v) { c.model = v.path(); }},
    {"tokenizer", [](TrainConfig& c, const Value& v) { c.tokenizer = v.path(); }},
    {"init", [](TrainConfig& c, const Value& v) { c.init = v.choice<InitMode>(); }},
    {"trainable", [](TrainConfig& c, const Value& v) { c.trainable = v.choice<Trainable>(); }},
    {"objective", [](TrainConfig& c, const Value& v) { c.objective = v.choice<Objective>(); }},
    {"dpo.beta",
     [](TrainConfig& c, const Value& v) {
       c.dpo.beta = v.number();
       v.require(c.dpo.beta > 0 && c.dpo.beta <= kMaxScale, "a number in (0, 1e6]");
     }},
    {"dpo.loss_type", [](TrainConfig& c, const Value& v) { c.dpo.loss = v.choice<DpoLoss>(); }},
    {"grpo.num_generations",
     [](TrainConfig& c, const Value& v) { c.grpo.num_generations = v.integer_in(2, kMaxBatch); }},
    {"grpo.num_iterations", [](TrainConfig& c, const Value& v) { c.grpo.num_iterations = v.integer_in(1, 1024); }},
    {"grpo.max_completion_length",
     [](TrainConfig& c, const Value& v) { c.grpo.max_completion_length = v.integer_in(1, kMaxSeqLen); }},
    {"grpo.beta",
     [](TrainConfig& c, const Value& v) {
       c.grpo.beta = v.number();
       v.require(c.grpo.beta >= 0 && c.grpo.beta <= kMaxScale, "a number in [0, 1e6]");
     }},
    {"grpo.epsilon",
     [](TrainConfig& c, const Value& v) {
       c.grpo.epsilon = v.number();
       v.require(c.grpo.epsilon >= 0 && c.grpo.epsilon < 1, "a number in [0, 1)");
     }},
    {"grpo.epsilon_high",
     [](TrainConfig& c, const Value& v) {
       c.grpo.epsilon_high = v.number();
       v.require(*c.grpo.epsilon_high >= 0 && *c.grpo.epsilon_high <= kMaxScale, "a number in [0, 1e6]");
     }},
    {"grpo.loss_type", [](TrainConfig& c, const Value& v) { c.grpo.loss_type = v.choice<GrpoLossType>(); }},
    {"grpo.scale_rewards", [](TrainConfig& c, const Value& v) { c.grpo.scale_rewards = v.choice<GrpoScaleRewards>(); }},
    {"grpo.top_p",
     [](TrainConfig& c, const Value& v) {
       c.grpo_top_p = v.number();
       v.require(c.grpo_top_p > 0 && c.grpo_top_p <= 1, "a number in (0, 1]");
     }},
    {"grpo.top_k", [](TrainConfig& c, const Value& v) { c.grpo_top_k = v.integer_in(0, kMaxTokens); }},
    {"ppo.batch_size", [](TrainConfig& c, const Value& v) { c.ppo.batch_size = v.integer_in(1, kMaxBatch); }},
    {"ppo.mini_batch_size", [](TrainConfig& c, const Value& v) { c.ppo.mini_batch_size = v.integer_in(1, kMaxBatch); }},
    {"ppo.gradient_accumulation_steps",
     [](TrainConfig& c, const Value& v) { c.ppo.gradient_accumulation_steps = v.integer_in(1, kMaxBatch); }},
    {"ppo.ppo_epochs", [](TrainConfig& c, const Value& v) { c.ppo.ppo_epochs = v.integer_in(1, kMaxEpochs); }},
    {"ppo.init_kl_coef",
     [](TrainConfig& c, const Value& v) {
       c.ppo.init_kl_coef = v.number();
       v.require(c.ppo.init_kl_coef >= 0 && c.ppo.init_kl_coef <= kMaxScale, "a number in [0, 1e6]");
     }},
    {"ppo.adap_kl_ctrl", [](TrainConfig& c, const Value& v) { c.ppo.adap_kl_ctrl = v.boolean(); }},
    {"ppo.target",
     [](TrainConfig& c, const Value& v) {
       c.ppo.target = v.number();
       v.require(c.ppo.target > 0 && c.ppo.target <= kMaxScale, "a number in (0, 1e6]");
     }},
    {"ppo.horizon",
     [](TrainConfig& c, const Value& v) {
       c.ppo.horizon = v.number();
       v.require(c.ppo.horizon > 0 && c.ppo.horizon <= 1e12, "a number in (0, 1e12]");
     }},
    {"ppo.kl_penalty", [](TrainConfig& c, const Value& v) { c.ppo.kl_penalty = v.choice<KlPenalty>(); }},
    {"ppo.gamma",
     [](TrainConfig& c, const Value& v) {
       c.ppo.gamma = v.number();
       v.require(c.ppo.gamma >= 0 && c.ppo.gamma <= 1, "a number in [0, 1]");
     }},
    {"ppo.lam",
     [](TrainConfig& c, const Value& v) {
       c.ppo.lam = v.number();
       v.require(c.ppo.lam >= 0 && c.ppo.lam <= 1, "a number in [0, 1]");
     }},
    {"ppo.cliprange",
     [](TrainConfig& c, const Value& v) {
       c.ppo.cliprange = v.number();
       v.require(c.ppo.cliprange >= 0 && c.ppo.cliprange <= kMaxScale, "a number in [0, 1e6]");
     }},
    {"ppo.cliprange_value",
     [](TrainConfig& c, const Value& v) {
       c.ppo.cliprange_value = v.number();
       v.require(c.ppo.cliprange_value >= 0 && c.ppo.cliprange_value <= kMaxScale, "a number in [0, 1e6]");
     }},
    {"ppo.vf_coef",
     [](TrainConfig& c, const Value& v) {
       c.ppo.vf_coef = v.number();
       v.require(c.ppo.vf_coef >= 0 && c.ppo.vf_coef <= kMaxScale, "a number in [0, 1e6]");
     }},
    {"ppo.whiten_rewards", [](TrainConfig& c, const Value& v) { c.ppo.whiten_rewards = v.boolean(); }},
    {"ppo.summary_dropout_prob",
     [](TrainConfig& c, const Value& v) {
       c.ppo.summary_dropout_prob = v.number();
       v.require(c.ppo.summary_dropout_prob >= 0 && c.ppo.summary_dropout_prob < 1, "a number in [0, 1)");
     }},
    {"ppo.early_stopping", [](TrainConfig& c, const Value& v) { c.ppo.early_stopping = v.boolean(); }},
    {"ppo.target_kl",
     [](TrainConfig& c, const Value& v) {
       c.ppo.target_kl = v.number();
       v.require(c.ppo.target_kl > 0 && c.ppo.target_kl <= kMaxScale, "a number in (0, 1e6]");
     }},
    {"ppo.ratio_threshold",
     [](TrainConfig& c, const Value& v) {
       c.ppo.ratio_threshold = v.number();
       v.require(c.ppo.ratio_threshold > 0 && c.ppo.ratio_threshold <= kMaxScale, "a number in (0, 1e6]");
     }},
    {"ppo.max_new_tokens", [](TrainConfig& c, const Value& v) { c.ppo_max_new_tokens = v.integer_in(1, kMaxSeqLen); }},
    {"ppo.top_p",
     [](TrainConfig& c, const Value& v) {
       c.ppo_top_p = v.number();
       v.require(c.ppo_top_p > 0 && c.ppo_top_p <= 1, "a number in (0, 1]");
     }},
    {"ppo.top_k", [](TrainConfig& c, const Value& v) { c.ppo_top_k = v.integer_in(0, kMaxTokens); }},
    {"rewards.regex", [](TrainConfig& c, const Value& v) { c.rewards.regex = v.string(); }},
    {"rewards.regex_weight", [](TrainConfig& c, const Value& v) { c.rewards.regex_weight = v.number(); }},
    {"rewards.rouge", [](TrainConfig& c, const Value& v) { c.rewards.rouge = v.string(); }},
    {"rewards.rouge_weight", [](TrainConfig& c, const Value& v) { c.rewards.rouge_weight = v.number(); }},
    {"rewards.answer", [](TrainConfig& c, const Value& v) { c.rewards.answer = v.string(); }},
    {"rewards.answer_weight", [](TrainConfig& c, const Value& v) { c.rewards.answer_weight = v.number(); }},
    {"rewards.length", [](TrainConfig& c, const Value& v) { c.rewards.length = v.integer_in(0, kMaxSeqLen); }},
    {"rewards.length_weight", [](TrainConfig& c, const Value& v) { c.rewards.length_weight = v.number(); }},
    {"rewards.model", [](TrainConfig& c, const Value& v) { c.rewards.model = v.path(); }},
    {"rewards.model_adapter", [](TrainConfig& c, const Value& v) { c.rewards.model_adapter = v.path(); }},
    {"rewards.model_tokenizer", [](TrainConfig& c, const Value& v) { c.rewards.model_tokenizer = v.path(); }},
    {"rewards.model_weight", [](TrainConfig& c, const Value& v) { c.rewards.model_weight = v.number(); }},
    {"lora.r", [](TrainConfig& c, const Value& v) { c.lora.r = v.integer_in(1, kMaxLoraRank); }},
    {"lora.lora_alpha",
     [](TrainConfig& c, const Value& v) {
       c.lora.lora_alpha = v.number();
       v.require(c.lora.lora_alpha > 0 && c.lora.lora_alpha <= kMaxScale, "a number in (0, 1e6]");
     }},
    {"lora.lora_dropout",
     [](TrainConfig& c, const Value& v) {
       c.lora.lora_dropout = v.number();
       v.require(c.lora.lora_dropout >= 0 && c.lora.lora_dropout < 1, "a number in [0, 1)");
     }},
    {"lora.target_modules",
     [](TrainConfig& c, const Value& v) {
       // As PEFT: a list of module names, or one string: "all-linear" (in
       // any case), else a regular expression the whole module name must match.
       const std::string expected = "a non-empty list of module names such as [q_proj, v_proj], all-linear, or a "
                                    "regular expression over whole module names";
       c.lora.target_modules.clear();
       c.lora.target_modules_regex.clear();
       if (v.node.IsSequence()) c.lora.target_modules = v.strings();
       else if (is_all_linear(v.scalar(expected.c_str()))) c.lora.target_modules = {kAllLinear};
       else c.lora.target_modules_regex = v.node.Scalar();
       v.require(!c.lora.target_modules.empty() || !c.lora.target_modules_regex.empty(), expected);
       if (!c.lora.target_modules_regex.empty())  // compiled here, so an invalid one names its line
         regex_fullmatch(c.lora.target_modules_regex, "", v.where + ": " + v.key);
     }},
    {"lora.exclude_modules",
     [](TrainConfig& c, const Value& v) {
       c.lora.exclude_modules.clear();
       c.lora.exclude_modules_regex.clear();
       if (v.node.IsNull()) return;
       if (v.node.IsSequence()) c.lora.exclude_modules = v.strings();
       else c.lora.exclude_modules_regex = v.scalar("a list of module names, or a regular expression over whole "
                                                    "module names");
       if (!c.lora.exclude_modules_regex.empty())
         regex_fullmatch(c.lora.exclude_modules_regex, "", v.where + ": " + v.key);
     }},
    {"lora.layers_to_transform",
     [](TrainConfig& c, const Value& v) {
       c.lora.layers_to_transform.clear();
       if (v.node.IsNull()) return;
       if (!v.node.IsSequence()) {
         c.lora.layers_to_transform = {v.integer_in(0, kMaxModelConfigInt)};
         return;
       }
       for (const YAML::Node& layer : v.node)
         c.lora.layers_to_transform.push_back(Value{layer, v.key, v.where, ""}.integer_in(0, kMaxModelConfigInt));
     }},
    {"lora.layers_pattern",
     [](TrainConfig& c, const Value& v) {
       c.lora.layers_pattern.clear();
       if (v.node.IsNull()) return;
       if (v.node.IsSequence()) c.lora.layers_pattern = v.strings();
       else c.lora.layers_pattern = {v.scalar("a name such as layers, or a list of them")};
     }},
    {"lora.rank_pattern",
     [](TrainConfig& c, const Value& v) {
       c.lora.rank_pattern.clear();
       v.each_pattern([&](const std::string& pattern, const Value& r) {
         c.lora.rank_pattern.emplace_back(pattern, r.integer_in(1, kMaxLoraRank));
       });
       check_lora_patterns(c.lora, v.where + ": lora.");  // each pattern a regular expression
     }},
    {"lora.alpha_pattern",
     [](TrainConfig& c, const Value& v) {
       c.lora.alpha_pattern.clear();
       v.each_pattern([&](const std::string& pattern, const Value& alpha) {
         const double value = alpha.number();
         alpha.require(value > 0 && value <= kMaxScale, "a number in (0, 1e6]");
         c.lora.alpha_pattern.emplace_back(pattern, value);
       });
       check_lora_patterns(c.lora, v.where + ": lora.");
     }},
    {"lora.use_rslora", [](TrainConfig& c, const Value& v) { c.lora.use_rslora = v.boolean(); }},
    {"lora.init_lora_weights", [](TrainConfig& c, const Value& v) { c.lora.init_lora_weights = v.lora_init(); }},
    {"lora.use_dora", [](TrainConfig& c, const Value& v) { c.lora.use_dora = v.boolean(); }},
    {"quantization.mode", [](TrainConfig& c, const Value& v) { c.quantization.mode = v.choice<QuantizedBase>(); }},
    {"quantization.threshold",
     [](TrainConfig& c, const Value& v) {
       c.quantization.threshold = v.number();
       v.require(c.quantization.threshold >= 0 && c.quantization.threshold <= kMaxScale, "a number in [0, 1e6]");
     }},
    {"quantization.double_quant",
     [](TrainConfig& c, const Value& v) { c.quantization.double_quant = v.boolean(); }},
    {"quantization.save_base", [](TrainConfig& c, const Value& v) { c.quantization.save_base = v.path(); }},
    {"precision", [](TrainConfig& c, const Value& v) { c.precision = v.choice<Precision>(); }},
    {"device", [](TrainConfig& c, const Value& v) { c.device = v.choice<DeviceChoice>(); }},
    {"data.train", [](TrainConfig& c, const Value& v) { c.data.train = v.path(); }},
    {"data.eval", [](TrainConfig& c, const Value& v) { c.data.eval = v.path(); }},
    {"data.format", [](TrainConfig& c, const Value& v) { c.data.format = v.choice<DataFormat>(); }},
    {"data.chat_template", [](TrainConfig& c, const Value& v) { c.data.chat_template = v.choice<ChatTemplateKind>(); }},
    {"data.packing", [](TrainConfig& c, const Value& v) { c.data.packing = v.packing(); }},
    {"data.template.prompt", [](TrainConfig& c, const Value& v) { c.data.row_template.prompt = v.string(); }},
    {"data.template.completion", [](TrainConfig& c, const Value& v) { c.data.row_template.completion = v.string(); }},
    {"data.text_split", [](TrainConfig& c, const Value& v) { c.data.text_split = v.string(); }},
    {"data.completion_only_loss",
     [](TrainConfig& c, const Value& v) { c.data.loss_scope.completion_only = v.boolean(); }},
    {"data.assistant_only_loss",
     [](TrainConfig& c, const Value& v) { c.data.loss_scope.assistant_only = v.boolean(); }},
    {"data.add_eos",
     [](TrainConfig& c, const Value& v) {
       bool flag = false;
       if (v.node.IsScalar() && YAML::convert<bool>::decode(v.node, flag)) {
         c.data.add_eos = AddEos{flag, true, {}};
         return;
       }
       c.data.add_eos = AddEos{true, false, v.token()};
     }},
    {"seq_len", [](TrainConfig& c, const Value& v) { c.seq_len = v.integer_in(1, kMaxSeqLen); }},
    {"micro_batch_size", [](TrainConfig& c, const Value& v) { c.micro_batch_size = v.integer_in(1, kMaxBatch); }},
    {"grad_accum_steps", [](TrainConfig& c, const Value& v) { c.grad_accum_steps = v.integer_in(1, kMaxBatch); }},
    {"lr",
     [](TrainConfig& c, const Value& v) {
       c.lr = v.number();
       v.require(c.lr > 0 && c.lr <= kMaxLr, "a number in (0, 10]");
     }},
    {"activation_checkpointing",
     [](TrainConfig& c, const Value& v) { c.activation_checkpointing = v.choice<ActivationCheckpointing>(); }},
    {"loss_chunk_tokens", [](TrainConfig& c, const Value& v) { c.loss_chunk_tokens = v.integer_in(0, kMaxTokens); }},
    {"mlp_chunk_tokens", [](TrainConfig& c, const Value& v) { c.mlp_chunk_tokens = v.integer_in(0, kMaxTokens); }},
    {"offload.optimizer", [](TrainConfig& c, const Value& v) { c.offload_optimizer = v.choice<OffloadTarget>(); }},
    {"offload.base", [](TrainConfig& c, const Value& v) { c.offload_base = v.choice<OffloadTarget>(); }},
    {"offload.activations",
     [](TrainConfig& c, const Value& v) { c.offload_activations = v.choice<OffloadTarget>(); }},
    {"offload.resident_layers",
     [](TrainConfig& c, const Value& v) { c.resident_layers = v.integer_in(0, kMaxLayers); }},
    {"offload.stream_slots", [](TrainConfig& c, const Value& v) { c.stream_slots = v.integer_in(1, kMaxLayers); }},
    {"neftune_noise_alpha",
     [](TrainConfig& c, const Value& v) {
       c.neftune_noise_alpha = v.number();
       v.require(c.neftune_noise_alpha >= 0 && c.neftune_noise_alpha <= kMaxScale, "a number in [0, 1e6] (0 = off)");
     }},
    {"parallel.data", [](TrainConfig& c, const Value& v) { c.parallel.data = v.integer_in(0, kMaxRanks); }},
    {"parallel.pipeline", [](TrainConfig& c, const Value& v) { c.parallel.pipeline = v.integer_in(1, kMaxRanks); }},
    {"parallel.tensor", [](TrainConfig& c, const Value& v) { c.parallel.tensor = v.integer_in(1, kMaxRanks); }},
    {"parallel.timeout_s", [](TrainConfig& c, const Value& v) { c.parallel.timeout_s = v.integer_in(0, kMaxTimeoutS); }},
    {"parallel.shard_optimizer", [](TrainConfig& c, const Value& v) { c.parallel.shard_optimizer = v.boolean(); }},
    {"warmup_steps",
     [](TrainConfig& c, const Value& v) {
       // transformers 5's rule: a number in (0, 1) is a ratio of the total steps (its warmup_ratio before).
       const double value = v.number();
       v.require(value >= 0 && (value < 1 || value == std::floor(value)) && value <= double(kMaxSteps),
                 "an integer in [0, " + std::to_string(kMaxSteps) + "] or a ratio of the run's steps in (0, 1)");
       c.warmup_fraction = value < 1 ? value : 0.0;
       c.warmup_steps = value < 1 ? 0 : int64_t(value);
     }},
    {"schedule", [](TrainConfig& c, const Value& v) { c.schedule = v.choice<Schedule>(); }},
    {"min_lr_ratio",
     [](TrainConfig& c, const Value& v) {
       c.min_lr_ratio = v.number();
       v.require(c.min_lr_ratio >= 0 && c.min_lr_ratio <= 1, "a number in [0, 1]");
     }},
    {"weight_decay",
     [](TrainConfig& c, const Value& v) {
       c.weight_decay = v.number();
       v.require(c.weight_decay >= 0 && c.weight_decay <= kMaxLr, "a number in [0, 10]");
     }},
    {"max_grad_norm",
     [](TrainConfig& c, const Value& v) {
       c.max_grad_norm = v.number();
       v.require(c.max_grad_norm >= 0 && c.max_grad_norm <= kMaxScale, "a number in [0, 1e6] (0 = no clipping)");
     }},
    {"loraplus_lr_ratio",
     [](TrainConfig& c, const Value& v) {
       c.loraplus_lr_ratio = v.number();
       v.require(c.loraplus_lr_ratio > 0 && c.loraplus_lr_ratio <= kMaxScale, "a number in (0, 1e6]");
     }},
    {"max_steps", [](TrainConfig& c, const Value& v) { c.max_steps = v.integer_in(0, kMaxSteps); }},
    {"epochs", [](TrainConfig& c, const Value& v) { c.epochs = v.integer_in(0, kMaxEpochs); }},
    {"max_bad_steps",
     [](TrainConfig& c, const Value& v) { c.max_bad_steps = v.integer_in(1, kMaxBadSteps); }},
    {"eval_every", [](TrainConfig& c, const Value& v) { c.eval_every = v.integer_in(0, kMaxSteps); }},
    {"eval_batches", [](TrainConfig& c, const Value& v) { c.eval_batches = v.integer_in(0, kMaxSteps); }},
    {"save_every", [](TrainConfig& c, const Value& v) { c.save_every = v.integer_in(0, kMaxSteps); }},
    {"log_every", [](TrainConfig& c, const Value& v) { c.log_every = v.integer_in(1, kMaxSteps); }},
    {"seed",
     [](TrainConfig& c, const Value& v) {
       c.seed = uint64_t(v.integer_in(0, INT64_MAX));
     }},
    {"output_dir",
     [](TrainConfig& c, const Value& v) {
       c.output_dir = v.path();
       v.require(!c.output_dir.empty(), "a directory path");
     }},
    {"generate.max_new_tokens", [](TrainConfig& c, const Value& v) { c.generate.max_new_tokens = v.integer_in(0, kMaxSeqLen); }},
    {"generate.temperature",
     [](TrainConfig& c, const Value& v) {
       c.generate.temperature = v.number();
       v.require(c.generate.temperature >= 0 && c.generate.temperature <= kMaxTemperature, "a number in [0, 100] (0 = greedy)");
     }},
    {"generate.top_p",
     [](TrainConfig& c, const Value& v) {
       c.generate.top_p = v.number();
       v.require(c.generate.top_p > 0 && c.generate.top_p <= 1, "a number in (0, 1]");
     }},
    {"generate.num_samples", [](TrainConfig& c, const Value& v) { c.generate.num_samples = v.integer_in(0, kMaxExamples); }},
    {"generate.stop",
     [](TrainConfig& c, const Value& v) {
       c.generate.stop.clear();
       if (!v.node.IsSequence()) return c.generate.stop.push_back(v.token());
       for (const YAML::Node& item : v.node) c.generate.stop.push_back(Value{item, v.key, v.where, ""}.token());
     }},
    {"task_metric", [](TrainConfig& c, const Value& v) { c.task_metric = v.choice<TaskMetric>(); }},
    {"metric_examples", [](TrainConfig& c, const Value& v) { c.metric_examples = v.integer_in(1, kMaxExamples); }},
};

const Field* find_field(const std::string& key) {
  for (const Field& field : kFields)
    if (key == field.key) return &field;
  return nullptr;
}

// "lora" is a section because "lora.r" is a field.
bool is_section(const std::string& key) {
  for (const Field& field : kFields)
    if (std::string(field.key).starts_with(key + ".")) return true;
  return false;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> previous(b.size() + 1), current(b.size() + 1);
  for (size_t j = 0; j <= b.size(); j++) previous[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); j++) {
      size_t substitution = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitution});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

// How far candidate is from key, closest first: a key of the same section
// whose name holds the other's (lora.alpha in lora.lora_alpha, templat in
// template, lr in lr_rate, r in rank), by the length it adds; then by edit
// distance.
std::pair<size_t, size_t> key_distance(const std::string& key, const std::string& candidate) {
  const std::string name = key.substr(key.rfind('.') + 1), other = candidate.substr(candidate.rfind('.') + 1);
  const bool same_section =
      key.substr(0, key.size() - name.size()) == candidate.substr(0, candidate.size() - other.size());
  const std::string& shorter = name.size() < other.size() ? name : other;
  const std::string& longer = name.size() < other.size() ? other : name;
  const size_t at = longer.find(shorter);
  if (same_section && at != std::string::npos && (shorter.size() >= 3 || at == 0))
    return {0, longer.size() - shorter.size()};
  return {edit_distance(key, candidate), 0};
}

// transformers' TrainingArguments, trl's and PEFT's names for what this
// config calls otherwise, or does not offer: told plainly, where the closest
// spelling would point at an unrelated key.
struct PeerName {
  const char* key;
  const char* answer;
};
constexpr PeerName kPeerNames[] = {
    {"learning_rate", "this config's key is \"lr\""},
    {"per_device_train_batch_size", "this config's key is \"micro_batch_size\" (sequences per forward pass)"},
    {"gradient_accumulation_steps", "this config's key is \"grad_accum_steps\""},
    {"num_train_epochs", "this config's key is \"epochs\""},
    {"logging_steps", "this config's key is \"log_every\""},
    {"eval_steps", "this config's key is \"eval_every\""},
    {"save_steps", "this config's key is \"save_every\""},
    {"max_seq_length", "this config's key is \"seq_len\""},
    {"max_length", "this config's key is \"seq_len\""},
    {"lr_scheduler_type", "this config's key is \"schedule\" (constant, linear or cosine)"},
    {"warmup_ratio", "this config's key is \"warmup_steps\", which takes a ratio below 1 too"},
    {"bf16", "this config says \"precision: bf16\""},
    {"fp16", "this config says \"precision: bf16\" (or fp32); fp16 training is not offered"},
    {"gradient_checkpointing", "this config's key is \"activation_checkpointing\""},
    {"optim", "the optimizer is AdamW, with transformers' defaults (betas 0.9 and 0.999, eps 1e-8)"},
    {"adam_beta1", "AdamW's betas are fixed at transformers' defaults, 0.9 and 0.999"},
    {"adam_beta2", "AdamW's betas are fixed at transformers' defaults, 0.9 and 0.999"},
    {"adam_epsilon", "AdamW's eps is fixed at transformers' default, 1e-8"},
    {"lora.bias", "LoRA trains no biases here (PEFT's bias=\"none\")"},
    {"lora.modules_to_save", "whole modules are not trained beside LoRA here (trainable: all trains every weight)"},
    {"lora.lora_r", "this config's key is \"lora.r\""},
};

// A key its section does not have lists the section's keys unless one is
// close; elsewhere the closest key or section is suggested.
[[noreturn]] void fail_unknown_key(const std::string& where, const std::string& key) {
  for (const PeerName& peer : kPeerNames)
    FT_CHECK(key != peer.key, where, ": unknown key \"", key, "\"; ", peer.answer);
  // compare: is a comparison file's list of runs, not a field of one run.
  FT_CHECK(key != "compare" && !key.starts_with("compare."), where, ": \"", key,
           "\": a comparison's runs (compare:) are written in its file, each a run's fields; --set sets a field "
           "of every run (e.g. --set lr=3e-4)");
  const size_t dot = key.rfind('.');
  const std::string section = dot == std::string::npos ? "" : key.substr(0, dot);
  const bool in_section = !section.empty() && is_section(section);
  std::vector<std::string> candidates;
  for (const Field& field : kFields) {
    const std::string name = field.key;
    if (in_section) {
      // Its keys and its subsections (data.template), each once.
      const std::string own = name.substr(0, name.find('.', section.size() + 1));
      if (name.starts_with(section + ".") && std::find(candidates.begin(), candidates.end(), own) == candidates.end())
        candidates.push_back(own);
    } else {
      candidates.push_back(name);
      if (name.find('.') != std::string::npos) candidates.push_back(name.substr(0, name.find('.')));  // sections too
    }
  }
  std::string best;
  std::pair<size_t, size_t> best_distance{SIZE_MAX, 0};
  for (const std::string& candidate : candidates) {
    const std::pair<size_t, size_t> distance = key_distance(key, candidate);
    if (distance < best_distance) best = candidate, best_distance = distance;
  }
  if (!in_section || best_distance.first <= std::max<size_t>(2, key.size() / 4))
    fail(where, ": unknown key \"", key, "\"; did you mean \"", best, "\"?");
  std::string names;
  for (const std::string& candidate : candidates) names += (names.empty() ? "" : ", ") + candidate.substr(dot + 1);
  fail(where, ": unknown key \"", key, "\"; ", section, " takes ", names);
}

// ---------------------------------------------------------------------------
// Applying a YAML map (the file, a section, or a --set value) to the config.

struct Source {
  std::string file;      // for messages
  std::string where;     // "" = use file:line of each key; else e.g. "x.yaml (--set lr=1)"
  std::string base_dir;  // for relative paths
  // Every dotted key this source has set, so `lora.r: 8` beside `lora: {r: 4}`
  // in one file is a duplicate as `r` twice in one section is.
  std::set<std::string>* seen_keys;
};

void apply(TrainConfig& c, const std::string& key, const YAML::Node& node, const std::string& where,
           const Source& source);

// skipped: keys of this map that are not config fields (a comparison's own).
void apply_map(TrainConfig& c, const std::string& prefix, const YAML::Node& map, const std::string& where,
               const Source& source, const std::vector<std::string>& skipped = {}) {
  FT_CHECK(map.IsMap() || map.IsNull(), where, ": ", prefix.empty() ? "the config" : prefix,
           ": expected a map of keys, got ", describe(map));
  for (const auto& entry : map) {
    std::string key_where =
        source.where.empty() ? source.file + ":" + std::to_string(entry.first.Mark().line + 1) : source.where;
    FT_CHECK(entry.first.IsScalar(), key_where, ": keys must be plain names");
    if (std::find(skipped.begin(), skipped.end(), entry.first.Scalar()) != skipped.end()) continue;
    std::string key = (prefix.empty() ? "" : prefix + ".") + entry.first.Scalar();
    FT_CHECK(source.seen_keys->insert(key).second, key_where, ": duplicate key \"", key,
             "\" (set earlier in the same ", source.where.empty() ? "file" : "--set", ")");
    apply(c, key, entry.second, key_where, source);
  }
}

void apply(TrainConfig& c, const std::string& key, const YAML::Node& node, const std::string& where,
           const Source& source) {
  if (is_section(key)) return apply_map(c, key, node, where, source);
  const Field* field = find_field(key);
  if (!field) fail_unknown_key(where, key);
  field->set(c, Value{node, key, where, source.base_dir});
  for (const char* section : {"dpo.", "grpo.", "ppo."})
    if (key.starts_with(section)) c.objective_keys.emplace_back(key, where);
}

// Where each document starts; nothing else of the events is kept.
struct DocumentStarts : YAML::EventHandler {
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// One YAML document: a second (after a "---") would otherwise be dropped
// unread. Documents are counted up to two (yaml-cpp's LoadAll can run on
// without end over some malformed text).
YAML::Node parse_yaml(const std::string& text, const std::string& where) {
  try {
    std::istringstream stream(text);
    YAML::Parser parser(stream);
    DocumentStarts documents;
    while (documents.starts.size() < 2 && parser.HandleNextDocument(documents)) {}
    FT_CHECK(documents.starts.size() < 2, where, ":", documents.starts.back().line + 1, ": a second YAML document "
             "(after \"---\"): a config is one document; put every key in the first");
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail(where, ":", e.mark.line + 1, ":", e.mark.column + 1, ": invalid YAML: ", e.msg);
  }
}

void apply_override(TrainConfig& c, const std::string& text, const std::string& file) {
  std::string where = file + " (--set " + text + ")";
  size_t equals = text.find('=');
  FT_CHECK(equals != std::string::npos && equals > 0, where, ": --set expects key=value");
  std::string key = text.substr(0, equals);
  YAML::Node value = parse_yaml(text.substr(equals + 1), where);
  // Paths on the command line are relative to the working directory.
  std::set<std::string> seen_keys;
  apply(c, key, value, where, Source{file, where, "", &seen_keys});
}

// objective: grpo's rules (trl's GRPOConfig checks and what a rollout needs).
void check_grpo(const TrainConfig& c) {
  const std::string& f = c.source;
  FT_CHECK(c.trainable == Trainable::lora || c.grpo.beta == 0, f, ": objective: grpo with grpo.beta > 0 needs "
           "trainable: lora: its reference model is the base with the adapters disabled");
  const int64_t completions = checked_mul(c.micro_batch_size, c.grad_accum_steps);
  FT_CHECK(completions % c.grpo.num_generations == 0, f, ": objective: grpo generates micro_batch_size x "
           "grad_accum_steps = ", completions, " completions a step, which must be a multiple of "
           "grpo.num_generations (", c.grpo.num_generations, "): whole groups of one prompt");
  FT_CHECK(c.grpo.max_completion_length < c.seq_len, f, ": grpo.max_completion_length (",
           c.grpo.max_completion_length, ") must leave room for the prompt within seq_len (", c.seq_len, ")");
  FT_CHECK(!c.rewards.names().empty(), f, ": objective: grpo needs a reward: set rewards.regex, rewards.rouge, "
           "rewards.answer, rewards.length or rewards.model");
  FT_CHECK(c.data.packing == Packing::none, f, ": objective: grpo generates its rows; data.packing applies to "
           "objective: sft and dpo");
  FT_CHECK(c.task_metric == TaskMetric::none, f, ": task_metric: ", enum_name(c.task_metric),
           " applies to objective: sft; objective: grpo reports the held-out reward");
  validate(c.grpo);
}

// objective: ppo's rules (trl's PPOConfig checks and what a rollout needs).
void check_ppo(const TrainConfig& c) {
  const std::string& f = c.source;
  FT_CHECK(c.trainable == Trainable::lora, f, ": objective: ppo needs trainable: lora: its reference model is the "
           "base with the adapters disabled");
  FT_CHECK(c.grad_accum_steps == 1, f, ": objective: ppo accumulates over ppo.gradient_accumulation_steps "
           "mini-batches (trl's name); leave grad_accum_steps at 1");
  FT_CHECK(c.ppo_max_new_tokens < c.seq_len, f, ": ppo.max_new_tokens (", c.ppo_max_new_tokens,
           ") must leave room for the query within seq_len (", c.seq_len, ")");
  // trl whitens the advantages over the batch's response tokens with an unbiased variance: one token divides
  // by zero (trl's loss is NaN too).
  FT_CHECK(c.ppo.batch_size > 1 || c.ppo_max_new_tokens > 1, f, ": ppo.batch_size 1 with ppo.max_new_tokens 1 "
           "gives each step one response token, over which the advantages cannot be whitened (an unbiased variance "
           "of one value): raise either");
  FT_CHECK(!c.rewards.names().empty(), f, ": objective: ppo needs a reward: set rewards.model (a reward model, as "
           "trl's PPO uses) or a rule (rewards.regex, rouge, answer, length)");
  FT_CHECK(c.data.packing == Packing::none, f, ": objective: ppo generates its rows; data.packing applies to "
           "objective: sft and dpo");
  FT_CHECK(c.task_metric == TaskMetric::none, f, ": task_metric: ", enum_name(c.task_metric),
           " applies to objective: sft; objective: ppo reports the held-out reward");
  try {
    validate(c.ppo);
  } catch (const Error& error) {
    fail(f, ": ppo: ", error.what());
  }
}

// Rules that involve more than one field.
void check_consistency(const TrainConfig& c) {
  const std::string& f = c.source;
  FT_CHECK(!c.model.empty(), f, ": model: required (a Hugging Face checkpoint folder)");
  FT_CHECK(!c.data.train.empty(), f, ": data.train: required (a JSONL file)");
  FT_CHECK(c.max_steps > 0 || c.epochs > 0, f, ": max_steps and epochs are both 0; set one of them > 0");
  checked_mul(checked_mul(c.micro_batch_size, c.seq_len), c.grad_accum_steps);  // tokens per optimizer step
  FT_CHECK(!(c.trainable == Trainable::all && c.quantization.mode != QuantizedBase::none), f,
           ": trainable: all needs quantization.mode: none (INT8 and NF4 base weights are frozen)");
  FT_CHECK(!(c.objective == Objective::dpo && c.trainable == Trainable::all), f,
           ": objective: dpo needs trainable: lora: its reference model is the base with the adapters disabled, "
           "and full fine-tuning has no adapters to disable");
  FT_CHECK(c.objective != Objective::dpo || c.data.format == DataFormat::automatic, f,
           ": objective: dpo reads {\"prompt\", \"chosen\", \"rejected\"} rows: data.format applies to objective: "
           "sft only");
  FT_CHECK(c.objective != Objective::dpo || c.data.packing != Packing::concatenate, f,
           ": objective: dpo keeps each completion whole: data.packing: concatenate applies to objective: sft only "
           "(padding_free packs whole pairs)");
  FT_CHECK(c.objective != Objective::dpo || c.task_metric == TaskMetric::none, f,
           ": task_metric: ", enum_name(c.task_metric), " scores completions (objective: sft); objective: dpo reports "
           "trl's preference figures instead");
  FT_CHECK(c.objective != Objective::reward || c.data.format == DataFormat::automatic, f,
           ": objective: reward reads {\"prompt\", \"chosen\", \"rejected\"} rows: data.format applies to "
           "objective: sft only");
  FT_CHECK(c.objective != Objective::reward || c.data.packing == Packing::none, f,
           ": objective: reward scores each row's last token, one sequence a row: set data.packing: false");
  FT_CHECK(c.objective != Objective::reward || c.task_metric == TaskMetric::none, f, ": task_metric: ",
           enum_name(c.task_metric), " scores generated text; objective: reward reports trl's accuracy instead");
  FT_CHECK(!c.rewards.model.empty() || (c.rewards.model_adapter.empty() && c.rewards.model_tokenizer.empty()), f,
           ": rewards.", c.rewards.model_adapter.empty() ? "model_tokenizer" : "model_adapter",
           " belongs to a reward model: set rewards.model (its checkpoint folder) too");
  FT_CHECK(c.rewards.names().empty() || c.objective == Objective::grpo || c.objective == Objective::ppo, f,
           ": rewards.", c.rewards.names().front(), " scores generated completions: rewards apply to objective: "
           "grpo and ppo, and this run's objective is ", enum_name(c.objective));
  const LossScope& scope = c.data.loss_scope;
  FT_CHECK(c.objective == Objective::sft || (scope.completion_only && scope.assistant_only), f, ": data.",
           scope.completion_only ? "assistant_only_loss" : "completion_only_loss", ": false applies to objective: "
           "sft, and this run's objective is ", enum_name(c.objective));
  for (const auto& [key, where] : c.objective_keys) {
    const std::string section = key.substr(0, key.find('.'));
    FT_CHECK(section == enum_name(c.objective), where, ": ", key, " applies to objective: ", section,
             ", and this run's objective is ", enum_name(c.objective));
  }
  // transformers' Trainer gives every trainer the key; it is implemented
  // here for SFT on padded or concatenated rows, where L is the one
  // transformers sees. trl's padding-free batch is one flattened row (L its
  // token count), and the other objectives' extra forwards (reference,
  // rollouts, scoring) are not matched against the hook.
  FT_CHECK(c.neftune_noise_alpha == 0 || c.objective == Objective::sft, f, ": neftune_noise_alpha applies to "
           "objective: sft, and this run's objective is ", enum_name(c.objective));
  FT_CHECK(c.neftune_noise_alpha == 0 || c.data.packing != Packing::padding_free, f, ": neftune_noise_alpha with "
           "data.packing: padding_free is not supported (trl flattens such a micro-batch into one row, whose length "
           "is NEFTune's L); use data.packing: false or concatenate");
  if (c.objective == Objective::grpo) check_grpo(c);
  if (c.objective == Objective::ppo) check_ppo(c);
  check_lora_targets(c.lora, f + ": lora.");
  FT_CHECK(c.loraplus_lr_ratio == 1.0 || c.trainable == Trainable::lora, f, ": loraplus_lr_ratio applies to "
           "trainable: lora (it steps lora_B faster than lora_A)");
  FT_CHECK(!c.lora.use_dora || c.trainable == Trainable::lora, f, ": lora.use_dora applies to trainable: lora");
  FT_CHECK(!c.lora.use_dora || c.parallel.tensor == 1, f, ": lora.use_dora: true with parallel.tensor above 1 is "
           "not supported (a row-parallel weight's row norms span the ranks)");
  FT_CHECK(!c.lora.use_dora || c.offload_base == OffloadTarget::device, f, ": lora.use_dora: true with "
           "offload.base: host is not supported (the magnitude starts as the base weights' row norms)");
  FT_CHECK(c.quantization.save_base.empty() || c.quantization.mode != QuantizedBase::none, f,
           ": quantization.save_base needs quantization.mode: int8 or nf4 (it saves the quantised base)");
  FT_CHECK(c.offload_base == OffloadTarget::device || c.quantization.mode != QuantizedBase::none, f,
           ": offload.base: host streams the frozen quantized base from host memory: it needs quantization.mode: "
           "int8 or nf4");
  FT_CHECK(c.offload_base == OffloadTarget::device || c.quantization.save_base.empty(), f,
           ": quantization.save_base with offload.base: host is not supported (the streamed layers are in host "
           "memory); save the base in a run without offload.base");
  FT_CHECK(c.offload_activations == OffloadTarget::device ||
               c.activation_checkpointing == ActivationCheckpointing::per_layer,
           f, ": offload.activations: host keeps the per-layer checkpoints in host memory: it needs "
              "activation_checkpointing: per_layer");
  FT_CHECK(c.offload_activations == OffloadTarget::device || c.parallel.pipeline == 1, f,
           ": offload.activations: host runs in one pipeline stage (parallel.pipeline: 1): micro-batches in flight "
           "would share its buffers");
  FT_CHECK(c.offload_activations == OffloadTarget::device || c.device != DeviceChoice::cpu, f,
           ": offload.activations: host moves the checkpoints from a GPU to host memory; with device: cpu they are "
           "in host memory already");
  FT_CHECK(c.offload_base == OffloadTarget::host || (c.resident_layers == 0 && c.stream_slots == 2), f,
           ": offload.resident_layers and offload.stream_slots apply to offload.base: host only");
  for (const std::string& path : {c.data.train, c.data.eval})
    FT_CHECK(!path.ends_with(".csv") || !c.data.row_template.empty(), f, ": data: ", path,
             " is CSV: set data.template.prompt and data.template.completion (\"{column}\" is a column's value)");
  FT_CHECK(c.data.row_template.empty() || (!c.data.row_template.prompt.empty() &&
                                           !c.data.row_template.completion.empty() &&
                                           c.data.format == DataFormat::automatic),
           f, ": data.template needs both prompt and completion, and makes prompt/completion rows (no data.format)");
  FT_CHECK(c.task_metric == TaskMetric::none || !c.data.eval.empty(), f, ": task_metric: ", enum_name(c.task_metric),
           " needs data.eval (prompt/completion pairs to score)");
}

// The path fields' ${output_dir} (Value::path) replaced by the final output_dir.
void expand_output_dir(TrainConfig& c) {
  for (std::string* path : {&c.model, &c.tokenizer, &c.data.train, &c.data.eval, &c.rewards.model,
                            &c.rewards.model_adapter, &c.rewards.model_tokenizer, &c.quantization.save_base}) {
    if (!path->starts_with(kOutputDirVariable)) continue;
    const std::filesystem::path rest = path->substr(std::min(path->size(), kOutputDirVariable.size() + 1));
    *path = (rest.empty() ? std::filesystem::path(c.output_dir) : c.output_dir / rest).lexically_normal().string();
  }
}

}  // namespace

std::vector<std::string> train_config_keys() {
  std::vector<std::string> keys;
  for (const Field& field : kFields) keys.push_back(field.key);
  return keys;
}

TrainConfig parse_train_config(const std::string& yaml_text, const std::string& source,
                               const std::vector<std::string>& overrides) {
  return train_config_from_layers({parse_yaml(yaml_text, source)}, {}, source, overrides);
}

TrainConfig train_config_from_layers(const std::vector<YAML::Node>& layers, const std::vector<std::string>& skipped,
                                     const std::string& source, const std::vector<std::string>& overrides) {
  std::string config_dir = std::filesystem::path(source).parent_path().string();
  TrainConfig c;
  c.source = source;
  c.output_dir = Value{YAML::Node("runs/out"), "output_dir", source, config_dir}.path();
  for (const YAML::Node& layer : layers) {
    std::set<std::string> seen_keys;
    apply_map(c, "", layer, source, Source{source, "", config_dir, &seen_keys}, skipped);
  }
  for (const std::string& text : overrides) apply_override(c, text, source);
  expand_output_dir(c);
  if (c.tokenizer.empty() && !c.model.empty())
    c.tokenizer = default_tokenizer_path(c.model);
  check_consistency(c);
  return c;
}

YAML::Node load_yaml_file(const std::string& path) {
  // A JSONL row reads as YAML too (a map of its keys): name the mistake instead.
  FT_CHECK(!path.ends_with(".jsonl"), path, ": a JSONL data file where a YAML training config (CONFIG.yaml) was "
           "expected; a config names its data as data.train and data.eval");
  std::ifstream file = open_input_file(path, "config file");
  std::stringstream text;
  text << file.rdbuf();
  return parse_yaml(text.str(), path);
}

TrainConfig load_train_config(const std::string& yaml_path, const std::vector<std::string>& overrides) {
  return train_config_from_layers({load_yaml_file(yaml_path)}, {}, yaml_path, overrides);
}

EnumNames<InitMode> enum_names(InitMode) { return kInitModes; }
EnumNames<Trainable> enum_names(Trainable) { return kTrainables; }
EnumNames<QuantizedBase> enum_names(QuantizedBase) { return kQuantModes; }
EnumNames<Precision> enum_names(Precision) { return kPrecisions; }
EnumNames<DeviceChoice> enum_names(DeviceChoice) { return kDevices; }
EnumNames<Schedule> enum_names(Schedule) { return kSchedules; }
EnumNames<ActivationCheckpointing> enum_names(ActivationCheckpointing) { return kCheckpointings; }
EnumNames<TaskMetric> enum_names(TaskMetric) { return kTaskMetrics; }
EnumNames<OffloadTarget> enum_names(OffloadTarget) { return kOffloadTargets; }
EnumNames<Objective> enum_names(Objective) { return kObjectives; }
EnumNames<DpoLoss> enum_names(DpoLoss) { return kDpoLosses; }

}  // namespace ft
