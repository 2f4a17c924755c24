// The product folders' structure. Their include graph: data flows trainer ->
// model -> kernels (tokenizer beside model, on kernels alone), and no two
// units of code depend on each other, directly or through others. A unit is
// a header with its sources (trainer/plan.h, plan.cpp): a .cpp calling into
// another unit depends on it as much as its header does. And model families
// are told apart in one place: the family table (model/families.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/families.h"

namespace fs = std::filesystem;
using Graph = std::map<std::string, std::set<std::string>>;
using ft::model_families;
using ft::ModelFamily;

namespace {

const std::vector<std::string> kProductFolders = {"kernels", "model", "tokenizer", "trainer"};

// Every source and header of the product folders, as paths relative to root.
std::vector<std::string> product_files(const fs::path& root) {
  const std::set<std::string> code = {".h", ".cpp", ".cu", ".cuh", ".inc"};
  std::vector<std::string> files;
  for (const std::string& folder : kProductFolders)
    for (const auto& entry : fs::recursive_directory_iterator(root / folder))
      if (entry.is_regular_file() && code.count(entry.path().extension().string()))
        files.push_back(fs::relative(entry.path(), root).generic_string());
  std::sort(files.begin(), files.end());
  return files;
}

std::string file_text(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// "trainer/plan.cpp" -> "trainer/plan": the unit a file belongs to.
std::string unit_of(const std::string& path) { return path.substr(0, path.rfind('.')); }

// Every `#include "folder/..."` of the product's files, as unit -> units.
Graph include_graph(const fs::path& root) {
  Graph graph;
  for (const std::string& file : product_files(root)) {
    const std::string from = unit_of(file);
    graph[from];
    std::ifstream in(root / file);
    for (std::string line; std::getline(in, line);) {
      const std::string prefix = "#include \"";
      if (line.rfind(prefix, 0) != 0) continue;
      const std::string target = line.substr(prefix.size(), line.find('"', prefix.size()) - prefix.size());
      const std::string to = unit_of(target);
      if (to != from && fs::exists(root / target)) graph[from].insert(to);
    }
  }
  return graph;
}
// One cycle of the graph as "a -> b -> a", or "" when it has none.
std::string find_cycle(const Graph& graph) {
  std::map<std::string, int> state;  // 0 unseen, 1 on the current path, 2 done
  std::vector<std::string> path;
  std::string cycle;
  auto visit = [&](auto&& self, const std::string& unit) -> bool {
    state[unit] = 1;
    path.push_back(unit);
    auto edges = graph.find(unit);
    if (edges != graph.end())
      for (const std::string& next : edges->second) {
        if (state[next] == 1) {
          for (auto it = std::find(path.begin(), path.end(), next); it != path.end(); ++it) cycle += *it + " -> ";
          cycle += next;
          return true;
        }
        if (state[next] == 0 && self(self, next)) return true;
      }
    path.pop_back();
    state[unit] = 2;
    return false;
  };
  for (const auto& [unit, edges] : graph)
    if (state[unit] == 0 && visit(visit, unit)) return cycle;
  return "";
}

std::string folder_of(const std::string& unit) { return unit.substr(0, unit.find('/')); }

// The folders each folder may include besides itself.
bool allowed(const std::string& from, const std::string& to) {
  static const std::map<std::string, std::set<std::string>> may = {
      {"kernels", {}},
      {"tokenizer", {"kernels"}},
      {"model", {"kernels"}},
      {"trainer", {"model", "tokenizer", "kernels"}},
  };
  return from == to || may.at(from).count(to) > 0;
}

}  // namespace

TEST_CASE("the cycle finder finds a cycle through several units, and none in a chain") {
  Graph chain = {{"a/x", {"a/y"}}, {"a/y", {"b/z"}}, {"b/z", {}}};
  CHECK(find_cycle(chain).empty());
  Graph loop = chain;
  loop["b/z"].insert("a/x");
  CHECK(find_cycle(loop) == "a/x -> a/y -> b/z -> a/x");
}

TEST_CASE("the product's include graph has no cycle and flows trainer -> model -> kernels") {
  const Graph graph = include_graph(FT_SOURCE_DIR);
  REQUIRE(graph.count("trainer/trainer") == 1);  // the walk found the sources
  REQUIRE(graph.count("kernels/backend") == 1);
  const std::string cycle = find_cycle(graph);
  INFO("include cycle: ", cycle);
  CHECK(cycle.empty());
  for (const auto& [from, edges] : graph)
    for (const std::string& to : edges) {
      INFO(from, " includes ", to);
      CHECK(allowed(folder_of(from), folder_of(to)));
    }
}

TEST_CASE("model families are told apart by the family table alone, and the trainer never downcasts a model") {
  const fs::path root = FT_SOURCE_DIR;
  for (const std::string& file : product_files(root)) {
    const std::string text = file_text(root / file);
    if (file != "model/families.cpp")
      for (const ModelFamily& family : model_families()) {
        INFO(file, " spells the model_type \"", family.model_type, "\"");
        CHECK(text.find(std::string("\"") + family.model_type + "\"") == std::string::npos);
      }
    if (file.rfind("trainer/", 0) == 0) {
      INFO(file, " uses dynamic_cast");
      CHECK(text.find("dynamic_cast") == std::string::npos);
    }
  }
}
