// The safetensors reader: header length, JSON header, dtypes, shapes, offsets,
// overlaps, and the NaN/Inf scan of every tensor a loader views.
#include "model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ft::fuzz::write_scratch_file("input.safetensors", data, size);
  ft::fuzz::expect_success_or_error([&] {
    ft::Checkpoint checkpoint(path);
    size_t viewed_bytes = 0;
    for (const std::string& name : checkpoint.names()) viewed_bytes += checkpoint.view(name).size_bytes();
    if (viewed_bytes != checkpoint.total_bytes()) std::abort();
  });
  return 0;
}
