// Replays files through a harness's LLVMFuzzerTestOneInput without libFuzzer,
// so the ordinary build runs the seed corpus and every kept crash input as a
// test. Arguments: CORPUS [FILE_OR_FOLDER...]: the seed corpus folder must
// hold at least one input (a replay of nothing would pass while testing
// nothing); the others (kept crash inputs) may be missing. Folders are read
// recursively. Prints how many inputs ran.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace fs = std::filesystem;

static void replay(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::printf("replaying %s (%zu bytes)\n", path.c_str(), bytes.size());
  std::fflush(stdout);
  LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
}

// Inputs under a folder: its files but README.md, recursively.
static std::vector<fs::path> inputs_in(const fs::path& root) {
  std::vector<fs::path> inputs;
  if (fs::is_regular_file(root)) return {root};
  if (fs::is_directory(root))
    for (const auto& entry : fs::recursive_directory_iterator(root))
      if (entry.is_regular_file() && entry.path().filename() != "README.md") inputs.push_back(entry.path());
  return inputs;
}

int main(int argc, char** argv) {
  if (argc < 2 || inputs_in(argv[1]).empty()) {
    std::fprintf(stderr, "error: %s: the seed corpus holds no input (expected a folder of files)\n",
                 argc < 2 ? "(none given)" : argv[1]);
    return 1;
  }
  int count = 0;
  for (int i = 1; i < argc; ++i)
    for (const fs::path& input : inputs_in(argv[i])) replay(input), ++count;
  std::printf("%d inputs replayed without a crash\n", count);
  return 0;
}
