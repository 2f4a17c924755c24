// Replays files through a harness's LLVMFuzzerTestOneInput without libFuzzer,
// so the ordinary build runs the seed corpus and every kept crash input as a
// test. Arguments: files or folders (folders are read recursively; a missing
// folder holds nothing). Prints how many inputs ran.
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

int main(int argc, char** argv) {
  int count = 0;
  for (int i = 1; i < argc; ++i) {
    const fs::path root = argv[i];
    if (fs::is_regular_file(root)) {
      replay(root);
      ++count;
    } else if (fs::is_directory(root)) {
      for (const auto& entry : fs::recursive_directory_iterator(root))
        if (entry.is_regular_file() && entry.path().filename() != "README.md") replay(entry.path()), ++count;
    }
  }
  std::printf("%d inputs replayed without a crash\n", count);
  return 0;
}
