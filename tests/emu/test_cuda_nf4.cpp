// NF4 on the CUDA backend under the emulator, against CpuBackend: the
// dequantised tile (double-quantised and plain absmax, f32 and bf16 tiles,
// tiles at offsets whose blocks straddle rows) and nf4_linear_forward /
// nf4_linear_backward, each under the emulator's shuffled schedules.
//
// Tolerances: the tile is bit-identical (the same f32 ops in the same order,
// __fmul_rn/__fadd_rn on the device); the linear ops run the CUDA GEMM on the
// same tile, so only the GEMM's summation order differs from the CPU's: 1e-5
// relative plus 1e-6 for f32, one bf16 ulp for bf16 activations.
#include <doctest/doctest.h>

#include <vector>

#include "kernels/nf4.h"
#include "tests/emu/cuda_test_util.h"

using namespace cuda_test;

namespace {

// A host NF4 weight [O, K] quantised from uniform values, as the device gets it.
struct HostNf4 {
  Tensor codes, absmax, nested_absmax, nested_map;
  float offset = 0.0f;
  int64_t O, K;

  Nf4Weight weight() const {
    Nf4Weight w{&codes, &absmax, nullptr, nullptr, offset, O, K};
    if (nested_map.defined()) w.nested_absmax = &nested_absmax, w.nested_map = &nested_map;
    return w;
  }
};

HostNf4 host_nf4(int64_t O, int64_t K, bool double_quant, unsigned seed) {
  HostNf4 w;
  w.O = O, w.K = K;
  const int64_t n = O * K, blocks = nf4_blocks(n);
  Tensor x = host_random({n}, DType::f32, seed);
  w.codes = cpu.empty({nf4_packed_bytes(n)}, DType::u8, MemCategory::weights);
  Tensor absmax = cpu.empty({blocks}, DType::f32, MemCategory::weights);
  nf4_quantize(x.ptr<const float>(), n, w.codes.ptr<uint8_t>(), absmax.ptr<float>());
  if (!double_quant) {
    w.absmax = absmax;
    return w;
  }
  const std::vector<float> map = dynamic_map_8bit();
  Nf4DoubleQuant q = nf4_double_quantize(absmax.ptr<const float>(), blocks, map);
  w.absmax = cpu.empty({blocks}, DType::u8, MemCategory::weights);
  std::copy(q.codes.begin(), q.codes.end(), w.absmax.ptr<uint8_t>());
  w.nested_absmax = cpu.empty({int64_t(q.nested_absmax.size())}, DType::f32, MemCategory::weights);
  std::copy(q.nested_absmax.begin(), q.nested_absmax.end(), w.nested_absmax.ptr<float>());
  w.nested_map = cpu.empty({256}, DType::f32, MemCategory::weights);
  std::copy(map.begin(), map.end(), w.nested_map.ptr<float>());
  w.offset = q.offset;
  return w;
}

HostNf4 on_device(const HostNf4& h) {
  HostNf4 d = h;
  d.codes = to_device(h.codes);
  d.absmax = to_device(h.absmax);
  if (h.nested_map.defined()) d.nested_absmax = to_device(h.nested_absmax), d.nested_map = to_device(h.nested_map);
  return d;
}

}  // namespace

TEST_CASE("cuda: nf4_dequantize is bit-identical to the CPU's") {
  for (bool double_quant : {true, false})
    for (DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(double_quant);
      CAPTURE(dtype_name(dtype));
      // K = 100: blocks of 64 straddle rows; 300 blocks: two nested blocks.
      const HostNf4 host = host_nf4(193, 100, double_quant, 3);
      const HostNf4 dev = on_device(host);
      for (const auto& tile_at : {std::array<int64_t, 4>{0, 0, 193, 100}, {7, 33, 50, 41}}) {
        // Not a structured binding: the lambda below cannot capture one (clang, OpenMP).
        const int64_t row0 = tile_at[0], col0 = tile_at[1], R = tile_at[2], C = tile_at[3];
        Tensor want = cpu.empty({R, C}, dtype, MemCategory::activations);
        cpu.nf4_dequantize(want, host.weight(), row0, col0);
        std::vector<float> got = emu_test::same_under_schedules([&] {
          Tensor tile = device_empty({R, C}, dtype);
          gpu.nf4_dequantize(tile, dev.weight(), row0, col0);
          return values(tile);
        });
        CHECK(emu_test::bit_identical(got, values(want)));
      }
    }
}

TEST_CASE("cuda: nf4_linear_forward / nf4_linear_backward match the CPU ops") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    const int64_t N = 5, K = 96, O = 70;
    const HostNf4 host = host_nf4(O, K, true, 11);
    const HostNf4 dev = on_device(host);
    Tensor x = host_random({N, K}, dtype, 12), dout = host_random({N, O}, dtype, 13);
    Tensor dx0 = host_random({N, K}, dtype, 14);
    Tensor want_out = cpu.empty({N, O}, dtype, MemCategory::activations);
    cpu.nf4_linear_forward(want_out, x, host.weight());
    Tensor want_dx = host_copy(dx0);
    cpu.nf4_linear_backward(want_dx, dout, host.weight(), true);
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor out = device_empty({N, O}, dtype);
      gpu.nf4_linear_forward(out, to_device(x), dev.weight());
      Tensor dx = to_device(dx0);
      gpu.nf4_linear_backward(dx, to_device(dout), dev.weight(), true);
      return values({&out, &dx});
    });
    check_close(got, values({&want_out, &want_dx}), tolerance_for(dtype));
  }
}
