// ROUGE-1/2/L against hand-computed values and against Google's rouge_score.
#include <doctest/doctest.h>

#include "kernels/error.h"
#include "trainer/report/rouge.h"

using namespace ft;

TEST_CASE("rouge tokenisation lowercases and splits on everything outside [a-z0-9]") {
  CHECK(rouge_tokenize("Hello, World! It's 2024.") == std::vector<std::string>{"hello", "world", "it", "s", "2024"});
  CHECK(rouge_tokenize("  tabs\tand\nnewlines  ") == std::vector<std::string>{"tabs", "and", "newlines"});
  // Non-ASCII bytes are separators, as in rouge_score ("café" -> "caf").
  CHECK(rouge_tokenize("caf\xC3\xA9 au lait") == std::vector<std::string>{"caf", "au", "lait"});
  CHECK(rouge_tokenize("?!...").empty());
}

TEST_CASE("identical strings score 1, disjoint and empty ones 0") {
  RougeScores same = rouge_scores("The cat sat on the mat.", "the cat sat on the mat");
  CHECK(same.rouge1 == 1.0);
  CHECK(same.rouge2 == 1.0);
  CHECK(same.rougeL == 1.0);
  RougeScores disjoint = rouge_scores("alpha beta gamma", "delta epsilon");
  CHECK(disjoint.rouge1 == 0.0);
  CHECK(disjoint.rouge2 == 0.0);
  CHECK(disjoint.rougeL == 0.0);
  RougeScores empty = rouge_scores("", "");
  CHECK(empty.rouge1 == 0.0);
  CHECK(empty.rougeL == 0.0);
  // A single token has no bigram: ROUGE-2 is 0 even for a perfect match.
  CHECK(rouge_scores("yes", "yes").rouge2 == 0.0);
}

TEST_CASE("worked example: target 'the cat sat on the mat', prediction 'the cat is on the mat'") {
  // Both have 6 tokens. Unigrams: the x2, cat, on, mat match -> overlap 5:
  //   P = R = 5/6, F1 = 5/6.
  // Bigrams (5 each): target {the cat, cat sat, sat on, on the, the mat},
  //   prediction {the cat, cat is, is on, on the, the mat} -> overlap 3: F1 = 3/5.
  // LCS = "the cat on the mat" = 5 tokens: P = R = 5/6, F1 = 5/6.
  RougeScores s = rouge_scores("the cat sat on the mat", "the cat is on the mat");
  CHECK(s.rouge1 == doctest::Approx(5.0 / 6.0).epsilon(1e-12));
  CHECK(s.rouge2 == doctest::Approx(3.0 / 5.0).epsilon(1e-12));
  CHECK(s.rougeL == doctest::Approx(5.0 / 6.0).epsilon(1e-12));
}

TEST_CASE("worked example with unequal lengths and clipped counts") {
  // Target a b c d, prediction a c. ROUGE-1: overlap 2, P = 2/2, R = 2/4,
  //   F1 = 2 * 1 * 0.5 / 1.5 = 2/3. ROUGE-2: {ab, bc, cd} vs {ac}: 0.
  //   ROUGE-L: LCS "a c" = 2 -> the same 2/3.
  RougeScores s = rouge_scores("a b c d", "a c");
  CHECK(s.rouge1 == doctest::Approx(2.0 / 3.0).epsilon(1e-12));
  CHECK(s.rouge2 == 0.0);
  CHECK(s.rougeL == doctest::Approx(2.0 / 3.0).epsilon(1e-12));
  // Clipping: "the" x4 vs x2 overlaps min(4, 2) = 2 -> P = 1, R = 1/2, F1 = 2/3.
  //   Bigrams "the the" x3 vs x1 -> P = 1, R = 1/3, F1 = 1/2.
  RougeScores clipped = rouge_scores("the the the the", "the the");
  CHECK(clipped.rouge1 == doctest::Approx(2.0 / 3.0).epsilon(1e-12));
  CHECK(clipped.rouge2 == doctest::Approx(0.5).epsilon(1e-12));
  // Word order: all unigrams match, but the LCS of these 9-token sentences is
  // "the quick brown fox" = 4 tokens -> F1 = 4/9.
  RougeScores reordered =
      rouge_scores("the quick brown fox jumps over the lazy dog", "the lazy dog jumps over the quick brown fox");
  CHECK(reordered.rouge1 == 1.0);
  CHECK(reordered.rougeL == doctest::Approx(4.0 / 9.0).epsilon(1e-12));
}

TEST_CASE("matches rouge_score 0.1.2 (use_stemmer=False)") {
  // Reference F-measures printed by rouge_score 0.1.2:
  //   RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False).score(target, prediction)
  struct Reference {
    const char* target;
    const char* prediction;
    double rouge1, rouge2, rougeL;
  };
  const Reference references[] = {
      {"The cat sat on the mat.", "The cat is on the mat", 0.83333333333333337, 0.59999999999999998,
       0.83333333333333337},
      {"Alice met Bob in Paris on day 12.", "bob and alice met in paris, day 12", 0.875, 0.42857142857142855, 0.75},
      {"the quick brown fox jumps over the lazy dog", "the lazy dog jumps over the quick brown fox", 1.0, 0.875,
       0.44444444444444442},
      {"Running runners ran; they're RUNNING!", "runs running ran they re running", 0.83333333333333337,
       0.59999999999999998, 0.83333333333333337},
      {"caf\xC3\xA9 au lait, s'il vous pla\xC3\xAEt", "cafe au lait sil vous plait", 0.42857142857142855,
       0.16666666666666666, 0.42857142857142855},
      {"the the the the", "the the", 0.66666666666666663, 0.5, 0.66666666666666663},
      // Python's lower(): U+0130 becomes "i" and a combining dot, the Kelvin sign "k".
      {"\xC4\xB0stanbul is big", "istanbul is big", 0.5714285714285715, 0.4, 0.5714285714285715},
      {"273 \xE2\x84\xAA is cold", "273 K is cold", 1.0, 1.0, 1.0},
  };
  for (const Reference& r : references) {
    CAPTURE(r.target);
    RougeScores s = rouge_scores(r.target, r.prediction);
    CHECK(s.rouge1 == doctest::Approx(r.rouge1).epsilon(1e-12));
    CHECK(s.rouge2 == doctest::Approx(r.rouge2).epsilon(1e-12));
    CHECK(s.rougeL == doctest::Approx(r.rougeL).epsilon(1e-12));
  }
}

TEST_CASE("corpus score is the mean of per-example F-measures") {
  RougeScores corpus =
      rouge_corpus({"the cat sat on the mat", "alpha beta", "a b c d"}, {"the cat is on the mat", "gamma", "a c"});
  CHECK(corpus.rouge1 == doctest::Approx((5.0 / 6.0 + 0.0 + 2.0 / 3.0) / 3.0).epsilon(1e-12));
  CHECK(corpus.rouge2 == doctest::Approx((3.0 / 5.0 + 0.0 + 0.0) / 3.0).epsilon(1e-12));
  CHECK(corpus.rougeL == doctest::Approx((5.0 / 6.0 + 0.0 + 2.0 / 3.0) / 3.0).epsilon(1e-12));
  CHECK_THROWS_WITH_AS(rouge_corpus({"a", "b"}, {"a"}), "rouge_corpus: 2 targets but 1 predictions", Error);
  CHECK_THROWS_AS(rouge_corpus({}, {}), Error);
}

TEST_CASE("ROUGE-Lsum matches rouge_score 0.1.2: union LCS over newline-separated sentences") {
  // Printed by rouge_score 0.1.2:
  //   RougeScorer(["rougeL", "rougeLsum"], use_stemmer=False).score(target, prediction)
  struct Reference {
    const char* target;
    const char* prediction;
    double rougeL, rougeLsum;
  };
  const Reference references[] = {
      {"the cat sat on the mat\nthe dog ran in the park", "the dog sat in the park\nthe cat ran on the mat", 0.5, 1.0},
      {"a b c d\ne f a b", "a c e\nb d f a", 0.6666666666666666, 0.9333333333333333},
      {"#Person1# books a room.\n#Person2# pays 60 dollars.", "#Person2# books a room for 60 dollars.",
       0.6666666666666666, 0.7999999999999999},
      {"one line only here", "only one line here", 0.75, 0.75},
      {"x y z\n\nx y", "x x y y z", 0.6, 1.0},
  };
  for (const Reference& r : references) {
    CAPTURE(r.target);
    const RougeScores s = rouge_scores(r.target, r.prediction);
    CHECK(s.rougeL == doctest::Approx(r.rougeL).epsilon(1e-12));
    CHECK(s.rougeLsum == doctest::Approx(r.rougeLsum).epsilon(1e-12));
  }
  const RougeScores mean = rouge_corpus({references[0].target, references[3].target},
                                        {references[0].prediction, references[3].prediction});
  CHECK(mean.rougeLsum == doctest::Approx((1.0 + 0.75) / 2).epsilon(1e-12));
}
