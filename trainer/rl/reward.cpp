#include "trainer/rl/reward.h"

#include <algorithm>
#include <cmath>

#include "kernels/error.h"
#include "trainer/evaluate.h"
#include "trainer/rl/reward_loss.h"

namespace ft {

namespace {

// transformers: the last position whose id is not pad_token_id (so a
// trailing eos that is also the pad token is not scored), 0 if none.
int64_t score_position(const int32_t* ids, int64_t length, int32_t pad_id) {
  int64_t position = length - 1;
  while (position > 0 && ids[position] == pad_id) --position;
  return position;
}

}  // namespace

ScoredRows scored_sequences(const std::vector<TokenSequence>& sequences, int32_t pad_id, Allocator& host) {
  size_t width = 1;
  for (const TokenSequence& sequence : sequences) width = std::max(width, sequence.tokens.size());
  const int64_t R = int64_t(sequences.size()), T = int64_t(width);
  ScoredRows rows{Tensor::empty({R, T}, DType::i32, host, MemCategory::activations), {}};
  int32_t* ids = rows.ids.ptr<int32_t>();
  std::fill_n(ids, R * T, pad_id);
  for (int64_t r = 0; r < R; ++r) {
    const std::vector<int32_t>& tokens = sequences[size_t(r)].tokens;
    std::copy(tokens.begin(), tokens.end(), ids + r * T);
    rows.score_positions.push_back(score_position(ids + r * T, int64_t(tokens.size()), pad_id));
  }
  return rows;
}

ScoredRows scored_rows(const Batch& batch, int32_t pad_id, Allocator& host) {
  FT_CHECK(!batch.position_ids.defined(), "objective: reward: packed rows cannot be scored (a score reads one "
           "sequence's last token); set data.packing: false");
  const int64_t R = batch.input_ids.dim(0), T = batch.input_ids.dim(1);
  ScoredRows rows{Tensor::empty({R, T + 1}, DType::i32, host, MemCategory::activations), {}};
  int32_t* ids = rows.ids.ptr<int32_t>();
  std::fill_n(ids, R * (T + 1), pad_id);
  for (int64_t r = 0; r < R; ++r) {
    const int32_t* inputs = batch.input_ids.ptr<int32_t>() + r * T;
    const int32_t* targets = batch.targets.ptr<int32_t>() + r * T;
    int64_t last = T - 1;  // the last target that counts: the sequence's last token
    while (last >= 0 && targets[last] == kIgnoreIndex) --last;
    if (last < 0) {
      rows.score_positions.push_back(-1);
      continue;
    }
    std::copy(inputs, inputs + last + 1, ids + r * (T + 1));
    ids[r * (T + 1) + last + 1] = targets[last];
    rows.score_positions.push_back(score_position(ids + r * (T + 1), last + 2, pad_id));
  }
  return rows;
}

namespace {

// The score head's outputs at each row's score position.
std::vector<double> scores_at(const std::vector<float>& outputs, const ScoredRows& rows) {
  const int64_t width = rows.ids.dim(1);
  std::vector<double> scores(rows.score_positions.size(), 0.0);
  for (size_t r = 0; r < scores.size(); ++r)
    if (rows.score_positions[r] >= 0) scores[r] = outputs[size_t(int64_t(r) * width + rows.score_positions[r])];
  return scores;
}

}  // namespace

std::vector<double> sequence_scores(CausalLM& model, const ScoredRows& rows) {
  std::vector<double> scores;
  const HiddenHead head = [&](const Tensor& hidden, Tensor*) {
    scores = scores_at(head_outputs(model.backend(), model.output_head(), hidden), rows);
  };
  model.head_step(rows.ids, nullptr, false, head);
  return scores;
}

void RewardFigures::add(const RewardFigures& other) {
  pairs += other.pairs;
  loss += other.loss;
  accuracy += other.accuracy;
  margin += other.margin;
  rewards += other.rewards;
  min_reward = std::min(min_reward, other.min_reward);
  max_reward = std::max(max_reward, other.max_reward);
}

nlohmann::json RewardFigures::means(const std::string& prefix) const {
  const double n = double(std::max<int64_t>(pairs, 1));
  return {{prefix + "loss", loss / n},
          {prefix + "accuracy", accuracy / n},
          {prefix + "margin", margin / n},
          {prefix + "mean_reward", rewards / (2 * n)},
          {prefix + "min_reward", pairs ? min_reward : 0.0},
          {prefix + "max_reward", pairs ? max_reward : 0.0}};
}

RewardFigures reward_micro_batch(CausalLM& model, const Batch& batch, int32_t pad_id, bool train,
                                 double pair_weight) {
  FT_CHECK(model.output_head().defined() && !model.output_head().bias, "objective: reward needs the model built "
           "with its score head");
  HostAllocator host;
  const ScoredRows rows = scored_rows(batch, pad_id, host);
  const int64_t P = int64_t(rows.score_positions.size()) / 2, width = rows.ids.dim(1);
  RewardFigures figures;
  const HiddenHead head = [&](const Tensor& hidden, Tensor* dhidden) {
    const HeadParameters& score = model.output_head();
    const std::vector<float> outputs = head_outputs(model.backend(), score, hidden);
    const std::vector<double> scores = scores_at(outputs, rows);
    std::vector<float> doutputs(outputs.size(), 0.0f);
    for (int64_t i = 0; i < P; ++i) {
      const int64_t chosen_at = rows.score_positions[size_t(i)], rejected_at = rows.score_positions[size_t(P + i)];
      if (chosen_at < 0 || rejected_at < 0) continue;
      const double chosen = scores[size_t(i)], rejected = scores[size_t(P + i)];
      const RewardPairLoss pair =
          reward_pair_loss(chosen, rejected, batch.margins.empty() ? 0.0 : batch.margins[size_t(i)]);
      doutputs[size_t(i * width + chosen_at)] = float(pair_weight * pair.dchosen);
      doutputs[size_t((P + i) * width + rejected_at)] = float(pair_weight * pair.drejected);
      figures.add({1, pair.loss, chosen > rejected ? 1.0 : 0.0, chosen - rejected, chosen + rejected,
                   std::min(chosen, rejected), std::max(chosen, rejected)});
    }
    if (dhidden) head_backward(model.backend(), score, hidden, doutputs, *dhidden);
  };
  model.head_step(rows.ids, nullptr, train, head);
  return figures;
}

RewardFigures evaluate_reward(CausalLM& model, const PreferenceLoader& eval, int32_t pad_id, int64_t max_batches) {
  HostAllocator host;
  const int64_t batches = max_batches > 0 ? std::min(max_batches, eval.batches_per_epoch()) : eval.batches_per_epoch();
  RewardFigures figures;
  for (int64_t i = 0; i < batches; ++i)
    figures.add(reward_micro_batch(model, trim_padding(eval.batch_in_order(i), host), pad_id, false, 0.0));
  return figures;
}

}  // namespace ft
