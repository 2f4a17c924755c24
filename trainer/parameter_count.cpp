#include "trainer/parameter_count.h"

#include <cstdio>
#include <deque>

namespace ft {

ParameterCount count_parameters(LanguageModel& model) {
  ParameterCount count;
  for (std::deque<Parameter>* list : {&model.parameters(), &model.adapters()})
    for (const Parameter& p : *list) {
      // A tensor-parallel shard counts as its whole tensor: every rank
      // holds a shard (or a copy) of every tensor.
      const int64_t elements = shape_numel(whole_shape(p));
      count.all += elements;
      if (p.trainable()) count.trainable += elements;
    }
  return count;
}

std::string trainable_parameters_line(const ParameterCount& count) {
  char percent[32];
  std::snprintf(percent, sizeof percent, "%.4f", 100.0 * double(count.trainable) / double(count.all));
  return "trainable params: " + with_commas(count.trainable) + " || all params: " + with_commas(count.all) +
         " || trainable%: " + percent;
}

std::string with_commas(int64_t value) {
  std::string digits = std::to_string(value), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace ft
