#include "trainer/data/template_data.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "kernels/input_file.h"
#include "tokenizer/unicode.h"

namespace ft {
namespace {

bool is_csv(const std::string& path) { return file_extension(path) == ".csv"; }

// The next record's fields, reading on over line breaks inside quotes;
// false at the end of the input. line: the line the record starts on, then
// the next record's.
bool read_record(std::istream& input, const std::string& path, int64_t& line, std::vector<std::string>& fields) {
  fields.clear();
  if (input.peek() == std::char_traits<char>::eof()) return false;
  const int64_t start = line;
  std::string field;
  bool quoted = false, was_quoted = false;
  char c = 0;
  while (input.get(c)) {
    if (quoted) {
      if (c == '"' && input.peek() == '"') field += char(input.get());
      else if (c == '"') quoted = false;
      else field += c, line += c == '\n';
    } else if (c == '"' && field.empty() && !was_quoted) {
      quoted = was_quoted = true;
    } else if (c == ',') {
      fields.push_back(field), field.clear(), was_quoted = false;
    } else if (c == '\n') {
      break;
    } else if (c != '\r') {
      FT_CHECK(!was_quoted, path, ":", line, ": text after a quoted field's closing quote");
      field += c;
    }
  }
  FT_CHECK(!quoted, path, ":", start, ": a quoted field is not closed before the end of the file");
  fields.push_back(field);
  line += 1;
  return true;
}

// Skips a UTF-8 byte order mark (Excel's "CSV UTF-8" starts with one).
void skip_bom(std::istream& input) {
  char bom[3] = {};
  input.read(bom, 3);
  if (input.gcount() == 3 && std::string(bom, 3) == "\xEF\xBB\xBF") return;
  input.clear();
  input.seekg(0);
}

}  // namespace

std::vector<NamedRow> read_csv(std::istream& input, const std::string& path) {
  skip_bom(input);
  int64_t line = 1;
  std::vector<std::string> header, fields;
  FT_CHECK(read_record(input, path, line, header), path, ": empty CSV file (expected a header line of column names)");
  for (size_t i = 0; i < header.size(); ++i) {
    FT_CHECK(!header[i].empty(), path, ":1: column ", i + 1, " has no name");
    for (size_t j = 0; j < i; ++j) FT_CHECK(header[j] != header[i], path, ":1: column \"", header[i], "\" twice");
  }
  std::vector<NamedRow> rows;
  for (int64_t start = line; read_record(input, path, line, fields); start = line) {
    if (fields.size() == 1 && fields[0].empty()) continue;  // a blank line
    FT_CHECK(fields.size() == header.size(), path, ":", start, ": ", fields.size(), " fields, but the header has ",
             header.size(), " columns");
    NamedRow row{start, {}, {}};
    for (size_t i = 0; i < header.size(); ++i) {
      // As JSONL rows are: strict UTF-8 (a Latin-1 export would train on bytes the tokenizer never meant).
      unicode::decode_utf8(fields[i], path + ":" + std::to_string(start) + ": column \"" + header[i] +
                                          "\" (a CSV file is read as UTF-8: save it as \"CSV UTF-8\")");
      row.fields[header[i]] = fields[i];
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string fill_template(const std::string& pattern, const NamedRow& row, const std::string& where,
                          const char* what) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if ((c == '{' || c == '}') && i + 1 < pattern.size() && pattern[i + 1] == c) {
      out += c, ++i;
      continue;
    }
    FT_CHECK(c != '}', what, ": a '}' without its '{' (write }} for a brace)");
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t close = pattern.find('}', i);
    FT_CHECK(close != std::string::npos, what, ": a '{' without its '}' (write {{ for a brace)");
    const std::string name = pattern.substr(i + 1, close - i - 1);
    const auto unusable = row.unusable.find(name);
    FT_CHECK(unusable == row.unusable.end(), where, ": ", what, " names the field \"", name, "\", which is ",
             unusable->second, " (expected a string, number or boolean)");
    const auto field = row.fields.find(name);
    if (field == row.fields.end()) {
      std::string names;
      for (const auto& [key, value] : row.fields) names += (names.empty() ? "\"" : ", \"") + key + "\"";
      fail(where, ": ", what, " names the field \"", name, "\", which the row lacks (it has ", names, ")");
    }
    out += field->second;
    i = close;
  }
  return out;
}

Dataset load_templated(const std::string& path, const RowTemplate& row_template) {
  std::vector<NamedRow> rows;
  if (is_csv(path)) {
    std::ifstream input = open_input_file(path, "data file", std::ios::binary);
    rows = read_csv(input, path);
  } else {
    read_jsonl_rows(path, "data file", "the fields data.template names",
                    [&](const nlohmann::json& object, const std::string& where) {
                      NamedRow row{std::stoll(where.substr(where.rfind(':') + 1)), {}, {}};
                      for (const auto& [key, value] : object.items())
                        // Numbers and booleans as their JSON text ("id": 5 -> "5"), as a CSV cell reads.
                        if (value.is_string()) row.fields[key] = value.get<std::string>();
                        else if (value.is_number() || value.is_boolean()) row.fields[key] = value.dump();
                        else row.unusable[key] = value.is_object() ? "an object" : value.is_array() ? "a list" : "null";
                      rows.push_back(std::move(row));
                    });
  }
  Dataset data{path, DataFormat::prompt_completion, {}};
  for (const NamedRow& row : rows) {
    const std::string where = path + ":" + std::to_string(row.line);
    data.examples.push_back({fill_template(row_template.prompt, row, where, "data.template.prompt"),
                             fill_template(row_template.completion, row, where, "data.template.completion")});
    data.examples.back().line = row.line;
  }
  FT_CHECK(!data.examples.empty(), path, ": the dataset is empty (no rows)");
  return data;
}

}  // namespace ft
