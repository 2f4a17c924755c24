// ROUGE-1, ROUGE-2 and ROUGE-L F-measures, computed as Google's rouge_score
// package does with use_stemmer=False (the setting HF `evaluate` uses):
//   tokens  = lowercase (Python's: U+0130 and the Kelvin sign become
//             ASCII letters), every character outside [a-z0-9] becomes a
//             space, split on whitespace (other non-ASCII bytes are separators);
//   ROUGE-N = overlap of n-gram multisets (counts clipped to the smaller side),
//             precision = overlap / prediction n-grams, recall = overlap /
//             target n-grams, F = 2PR / (P + R), 0 when either side is empty;
//   ROUGE-L = the same with the longest common subsequence as the overlap;
//   ROUGE-Lsum = summary-level: both texts split on newlines into sentences,
//             each target sentence's union LCS with every predicted sentence
//             (rouge_score's _union_lcs, its backtracking's tie order) counts
//             tokens, each at most as often as it occurs on both sides. On
//             one-line texts it equals ROUGE-L.
#pragma once
#include <string>
#include <vector>

namespace ft {

struct RougeScores {
  double rouge1 = 0;  // F-measures in [0, 1]
  double rouge2 = 0;
  double rougeL = 0;
  double rougeLsum = 0;
};

std::vector<std::string> rouge_tokenize(const std::string& text);

// Argument order as rouge_score's RougeScorer.score(target, prediction).
RougeScores rouge_scores(const std::string& target, const std::string& prediction);

// The plain mean of the per-example F-measures. (`evaluate` reports the
// median of 1000 bootstrap resamples by default; the mean is what it
// converges to and needs no random numbers.) Sizes must match and be > 0.
RougeScores rouge_corpus(const std::vector<std::string>& targets, const std::vector<std::string>& predictions);

}  // namespace ft
