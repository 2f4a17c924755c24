#include "trainer/report/rouge.h"

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

// rouge_score's _lcs_table and _backtrack_norec: the indices into a of one
// longest common subsequence, ties broken as it breaks them.
std::vector<size_t> lcs_indices(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::vector<std::vector<size_t>> table(a.size() + 1, std::vector<size_t>(b.size() + 1, 0));
  for (size_t i = 1; i <= a.size(); i++)
    for (size_t j = 1; j <= b.size(); j++)
      table[i][j] = a[i - 1] == b[j - 1] ? table[i - 1][j - 1] + 1 : std::max(table[i - 1][j], table[i][j - 1]);
  std::vector<size_t> indices;
  for (size_t i = a.size(), j = b.size(); i > 0 && j > 0;) {
    if (a[i - 1] == b[j - 1]) {
      indices.push_back(--i);
      --j;
    } else if (table[i][j - 1] > table[i - 1][j]) {
      --j;
    } else {
      --i;
    }
  }
  std::reverse(indices.begin(), indices.end());
  return indices;
}

// The non-empty lines of text, each tokenized.
std::vector<std::vector<std::string>> sentences(const std::string& text) {
  std::vector<std::vector<std::string>> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = std::min(text.find('\n', start), text.size());
    if (end > start) out.push_back(rouge_tokenize(text.substr(start, end - start)));
    start = end + 1;
  }
  return out;
}

// rouge_score's _summary_level_lcs.
double rouge_lsum(const std::string& target, const std::string& prediction) {
  const auto target_sentences = sentences(target), predicted_sentences = sentences(prediction);
  std::map<std::string, int64_t> target_left, predicted_left;
  size_t target_total = 0, predicted_total = 0;
  for (const auto& sentence : target_sentences)
    for (const std::string& token : sentence) target_left[token]++, target_total++;
  for (const auto& sentence : predicted_sentences)
    for (const std::string& token : sentence) predicted_left[token]++, predicted_total++;
  if (target_total == 0 || predicted_total == 0) return 0;
  int64_t hits = 0;
  for (const auto& reference : target_sentences) {
    std::vector<size_t> union_indices;
    for (const auto& candidate : predicted_sentences)
      for (size_t index : lcs_indices(reference, candidate)) union_indices.push_back(index);
    std::sort(union_indices.begin(), union_indices.end());
    union_indices.erase(std::unique(union_indices.begin(), union_indices.end()), union_indices.end());
    for (size_t index : union_indices) {
      const std::string& token = reference[index];
      if (target_left[token] > 0 && predicted_left[token] > 0) {
        hits++;
        target_left[token]--;
        predicted_left[token]--;
      }
    }
  }
  return f_measure(double(hits), double(predicted_total), double(target_total));
}

}  // namespace

std::vector<std::string> rouge_tokenize(const std::string& text) {
  // The two characters Python's str.lower() (rouge_score lowercases so) turns
  // into ASCII letters: U+0130 into "i" and a combining dot (a separator),
  // the Kelvin sign U+212A into "k".
  std::string lowered = text;
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"\xC4\xB0", "i "}, {"\xE2\x84\xAA", "k"}})
    for (size_t at = lowered.find(from); at != std::string::npos; at = lowered.find(from, at + to.size()))
      lowered.replace(at, from.size(), to);
  std::vector<std::string> tokens;
  std::string token;
  for (char raw : lowered) {
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
  scores.rougeLsum = rouge_lsum(target, prediction);
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
    mean.rougeLsum += one.rougeLsum;
  }
  double count = double(targets.size());
  mean.rouge1 /= count;
  mean.rouge2 /= count;
  mean.rougeL /= count;
  mean.rougeLsum /= count;
  return mean;
}

}  // namespace ft
