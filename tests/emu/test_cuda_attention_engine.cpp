// The library attention engine (cuDNN SDPA, kernels/cuda/attention_engine.h)
// against our attention kernels on the same device: bf16, causal, grouped-query
// heads, head sizes 64, 96 and 128, ragged sequence lengths. Only a GPU build
// with the cudnn-frontend headers has the engine (`ctest -L gpu`); the
// emulator build checks that it has none, so our kernels run there.
//
// Tolerances: both sides accumulate in f32 and round to bf16 once, in
// different orders (cuDNN's tiles are not ours): out and the gradients within
// 2 bf16 ulps (2^-6 relative) plus 2^-8 of the tensor's largest magnitude
// (gradients are sums over T terms of mixed sign); lse (f32) within 1e-3.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "kernels/cuda/attention_engine.h"
#include "tests/emu/cuda_test_util.h"

using namespace cuda_test;

#if !defined(__CUDACC__)
// The emulator has no cuDNN: the engine must be absent so that ours run (the
// comparison below exists in the real-GPU build only).
TEST_CASE("cuda: the emulator build has no library attention engine, so our kernels run") {
  CHECK(!cuda::library_attention_built());
  CHECK(cuda::make_library_attention(device_allocator) == nullptr);
}
#else
namespace {

void check_near_ours(const Tensor& got, const Tensor& want, double rtol) {
  const std::vector<float> g = values(got), w = values(want);
  double largest = 0.0;
  for (float x : w) largest = std::max(largest, double(std::abs(x)));
  check_close(g, w, {largest / 256.0, rtol});
}

}  // namespace

TEST_CASE("cuda: cuDNN SDPA matches our attention kernels (bf16, causal, GQA)") {
  std::unique_ptr<cuda::AttentionEngine> engine = cuda::make_library_attention(device_allocator);
  REQUIRE((engine != nullptr) == cuda::library_attention_built());
  // On a real GPU this test exists to compare cuDNN with ours: a build without
  // the engine has nothing to compare, and says so as a skip, which
  // scripts/gpu_check counts as a failure on a machine with a GPU.
  if (!engine) {
    std::printf("skipped: this GPU build has no library attention engine (no cudnn-frontend headers: run "
                "scripts/deps and rebuild)\n");
    std::fflush(stdout);
    std::exit(kSkipReturnCode);
  }
  CudaBackend ours(device_allocator, cuda::default_gemm_kind(), /*library_attention=*/false);
  struct Case {
    int64_t B, T, Hq, Hkv, D;
  };
  unsigned seed = 300;
  for (const Case& c : {Case{2, 77, 8, 2, 64}, Case{1, 256, 4, 4, 128}, Case{1, 130, 6, 3, 96}}) {
    CAPTURE(c.T);
    CAPTURE(c.Hq);
    CAPTURE(c.Hkv);
    CAPTURE(c.D);
    const DType bf = DType::bf16;
    const float scale = 1.0f / std::sqrt(float(c.D));
    Tensor q = to_device(host_random({c.B, c.T, c.Hq, c.D}, bf, seed++, -2.0f, 2.0f));
    Tensor k = to_device(host_random({c.B, c.T, c.Hkv, c.D}, bf, seed++, -2.0f, 2.0f));
    Tensor v = to_device(host_random({c.B, c.T, c.Hkv, c.D}, bf, seed++));
    Tensor dout = to_device(host_random({c.B, c.T, c.Hq, c.D}, bf, seed++));
    Tensor out = device_empty(q.shape, bf), lse = device_empty({c.B, c.Hq, c.T}, DType::f32);
    ours.attention_forward(out, lse, q, k, v, scale, 0);
    Tensor got_out = device_empty(q.shape, bf), got_lse = device_empty(lse.shape, DType::f32);
    REQUIRE(engine->forward(got_out, got_lse, q, k, v, scale, nullptr));
    check_near_ours(got_out, out, 1.0 / 64);
    check_close(values(got_lse), values(lse), {1e-3, 1e-4});

    Tensor dq = device_empty(q.shape, bf), dk = device_empty(k.shape, bf), dv = device_empty(v.shape, bf);
    ours.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, 0);
    Tensor got_dq = device_empty(q.shape, bf), got_dk = device_empty(k.shape, bf);
    Tensor got_dv = device_empty(v.shape, bf);
    REQUIRE(engine->backward(got_dq, got_dk, got_dv, dout, q, k, v, out, lse, scale, nullptr));
    check_near_ours(got_dq, dq, 1.0 / 64);
    check_near_ours(got_dk, dk, 1.0 / 64);
    check_near_ours(got_dv, dv, 1.0 / 64);
  }
  // f32 operands have no cuDNN engine: the backend's own kernels take them.
  Tensor q = to_device(host_random({1, 8, 2, 64}, DType::f32, 9)), out = device_empty(q.shape, DType::f32);
  Tensor lse = device_empty({1, 2, 8}, DType::f32);
  CHECK_FALSE(engine->forward(out, lse, q, q, q, 0.125f, nullptr));
}
#endif
