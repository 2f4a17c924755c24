// The training-state reader (load_train_state) against an optimizer over two
// small parameters: "w" f32 [2, 3] and "b" bf16 [3] (whose master is f32),
// and a run identity of one data file. A mutated input rarely passes the
// checksum: the seed (make_corpus.py computes its checksum) covers the rest.
#include "kernels/cpu/cpu_backend.h"
#include "tests/fuzz/fuzz_util.h"
#include "trainer/train_state.h"

namespace {

ft::AdamW& optimizer() {
  static ft::HostAllocator host;
  static ft::CpuBackend backend(host);
  static ft::Parameter w, b;
  static std::unique_ptr<ft::AdamW> adamw = [] {
    w.name = std::string("w");  // not operator=(const char*): GCC 12 warns falsely (-Wrestrict) in it
    w.value = backend.empty({2, 3}, ft::DType::f32, ft::MemCategory::weights);
    w.grad = backend.empty({2, 3}, ft::DType::f32, ft::MemCategory::gradients);
    b.name = std::string("b");
    b.value = backend.empty({3}, ft::DType::bf16, ft::MemCategory::weights);
    b.grad = backend.empty({3}, ft::DType::f32, ft::MemCategory::gradients);
    backend.fill(b.value, 0.0f);
    return std::make_unique<ft::AdamW>(backend, std::vector<ft::Parameter*>{&w, &b}, ft::AdamWOptions{});
  }();
  return *adamw;
}

const ft::RunIdentity kIdentity = {
    {"data.train", "the train data", "12 bytes, checksum 0123456789abcdef", true}};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ft::fuzz::write_scratch_file("train_state.safetensors", data, size);
  ft::fuzz::expect_success_or_error([&] { ft::load_train_state(path, optimizer(), kIdentity); });
  return 0;
}
