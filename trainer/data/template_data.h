// Data files with named fields, such as DialogSum (id, dialogue, summary,
// topic) as JSONL or CSV, made into prompt/completion examples by a template
// (data.template in the config): "{dialogue}" in a pattern is the row's
// field `dialogue`. CSV is RFC 4180: a header line names the columns, fields
// are separated by commas, and a quoted field may hold commas, line breaks
// and doubled quotes ("").
#pragma once
#include <cstdint>
#include <istream>
#include <map>
#include <string>
#include <vector>

#include "trainer/data/data.h"

namespace ft {

struct RowTemplate {
  std::string prompt, completion;  // empty: no template (rows hold prompt/completion themselves)
  bool empty() const { return prompt.empty() && completion.empty(); }
};

// One record of a file: its fields by name and the line it starts on.
struct NamedRow {
  int64_t line = 0;
  std::map<std::string, std::string> fields;
  // A JSONL field whose value cannot fill a template ("an object", "a list",
  // "null"), so naming it is refused for what it is rather than as missing.
  std::map<std::string, std::string> unusable;
};

// Every record of a CSV file after its header; errors name path and line
// (an unclosed quote, a record with more or fewer fields than the header, a
// duplicate or empty column name).
std::vector<NamedRow> read_csv(std::istream& input, const std::string& path);

// pattern with each "{name}" replaced by fields[name]; "{{" and "}}" are
// literal braces. A name the row lacks or holds as an unusable value, or an
// unclosed brace, is an Error
// naming `where` and the template (what).
std::string fill_template(const std::string& pattern, const NamedRow& row, const std::string& where,
                          const char* what);

// path's rows (.csv: CSV with a header; otherwise JSONL objects whose fields
// the template names must be strings, numbers or booleans) as prompt/completion examples.
Dataset load_templated(const std::string& path, const RowTemplate& row_template);

}  // namespace ft
