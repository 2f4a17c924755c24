#include "trainer/rouge.h"

#include <algorithm>
#include <map>

#include "kernels/error.h"

namespace ft {
namespace {

double f_measure(double overlap, double prediction_count, double target_count) {
  if (prediction_count == 0 || target_count == 0) return 0;
  double precision = overlap / prediction_count, recall = overlap / target_count;
  return precision + recall > 0 ? 2 * precision * recall / (precision + recall) : 0;
}

std::map<std::vector<std::string>, int64_t> ngram_counts(const std::vector<std::string>& tokens, size_t n) {
  std::map<std::vector<std::string>, int64_t> counts;
  for (size_t i = 0; i + n <= tokens.size(); i++) counts[{tokens.begin() + i, tokens.begin() + i + n}]++;
  return counts;
}

double rouge_n(const std::vector<std::string>& target, const std::vector<std::string>& prediction, size_t n) {
  auto target_counts = ngram_counts(target, n), prediction_counts = ngram_counts(prediction, n);
  int64_t overlap = 0, target_total = 0, prediction_total = 0;
  for (const auto& [gram, count] : target_counts) {
    target_total += count;
    auto found = prediction_counts.find(gram);
    if (found != prediction_counts.end()) overlap += std::min(count, found->second);
  }
  for (const auto& [gram, count] : prediction_counts) prediction_total += count;
  return f_measure(double(overlap), double(prediction_total), double(target_total));
}

// Classic O(|a| |b|) dynamic programme, one row at a time.
size_t lcs_length(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::vector<size_t> previous(b.size() + 1, 0), current(b.size() + 1, 0);
  for (size_t i = 1; i <= a.size(); i++) {
    for (size_t j = 1; j <= b.size(); j++)
      current[j] = a[i - 1] == b[j - 1] ? previous[j - 1] + 1 : std::max(previous[j], current[j - 1]);
    std::swap(previous, current);
  }
  return previous[b.size()];
}

}  // namespace

std::vector<std::string> rouge_tokenize(const std::string& text) {
  std::vector<std::string> tokens;
  std::string token;
  for (char raw : text) {
    char ch = (raw >= 'A' && raw <= 'Z') ? char(raw - 'A' + 'a') : raw;
    if ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9')) {
      token += ch;
    } else if (!token.empty()) {
      tokens.push_back(token);
      token.clear();
    }
  }
  if (!token.empty()) tokens.push_back(token);
  return tokens;
}

RougeScores rouge_scores(const std::string& target, const std::string& prediction) {
  std::vector<std::string> target_tokens = rouge_tokenize(target), prediction_tokens = rouge_tokenize(prediction);
  RougeScores scores;
  scores.rouge1 = rouge_n(target_tokens, prediction_tokens, 1);
  scores.rouge2 = rouge_n(target_tokens, prediction_tokens, 2);
  scores.rougeL = f_measure(double(lcs_length(target_tokens, prediction_tokens)), double(prediction_tokens.size()),
                            double(target_tokens.size()));
  return scores;
}

RougeScores rouge_corpus(const std::vector<std::string>& targets, const std::vector<std::string>& predictions) {
  FT_CHECK(!targets.empty() && targets.size() == predictions.size(), "rouge_corpus: ", targets.size(), " targets but ",
           predictions.size(), " predictions");
  RougeScores mean;
  for (size_t i = 0; i < targets.size(); i++) {
    RougeScores one = rouge_scores(targets[i], predictions[i]);
    mean.rouge1 += one.rouge1;
    mean.rouge2 += one.rouge2;
    mean.rougeL += one.rougeL;
  }
  double count = double(targets.size());
  mean.rouge1 /= count;
  mean.rouge2 /= count;
  mean.rougeL /= count;
  return mean;
}

}  // namespace ft
