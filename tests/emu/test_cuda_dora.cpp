// DoRA's CUDA ops (row_sum_squares, dora_scale_forward, dora_scale_backward)
// under the emulator against the CPU backend: odd sizes, f32 and bf16 with
// mixed-dtype vectors, with and without bias, dz aliasing dout, a frozen
// magnitude. Results must be bit-identical across thread schedules.
//
// dora_scale_* equal the CPU's bit for bit: the same IEEE division and square
// root, one explicit fma a term, and the magnitude gradient reduced in the
// same row groups and order (kernels/cpu/dora.cpp). row_sum_squares sums a
// row in a block reduction, the CPU in column order: kF32's 1e-5 relative
// (sums of squares do not cancel).

#include <doctest/doctest.h>

#include "tests/emu/cuda_test_util.h"

using namespace cuda_test;

namespace {

struct Case {
  int64_t rows, columns;
  DType out, vectors;
};
// 300 rows > 256 row groups: some groups sum two rows; 1043 columns: five
// column tiles, the last partial.
const Case kCases[] = {{5, 1, DType::f32, DType::f32},
                       {37, 29, DType::bf16, DType::f32},
                       {300, 7, DType::f32, DType::bf16},
                       {3, 1043, DType::bf16, DType::bf16}};

// Positive squared norms, as row_sum_squares of a weight gives.
Tensor host_sum_squares(int64_t columns, unsigned seed) {
  return host_random({columns}, DType::f32, seed, 0.25f, 4.0f);
}

}  // namespace

TEST_CASE("cuda: row_sum_squares, 2-D and 3-D, f32 and bf16, overwritten and accumulated") {
  for (const Shape& shape : {Shape{5, 1}, Shape{29, 53}, Shape{7, 300}, Shape{2, 3, 1043}})
    for (DType dtype : {DType::f32, DType::bf16})
      for (bool accumulate : {false, true}) {
        CAPTURE(shape_string(shape));
        CAPTURE(dtype_name(dtype));
        CAPTURE(accumulate);
        Tensor x = host_random(shape, dtype, 50);
        Tensor sums0 = host_random({x.rows()}, DType::f32, 51, 0.0f, 2.0f), want = host_copy(sums0);
        cpu.row_sum_squares(want, x, accumulate);
        std::vector<float> got = emu_test::same_under_schedules([&] {
          Tensor sums = to_device(sums0);
          gpu.row_sum_squares(sums, to_device(x), accumulate);
          return values({&sums});
        });
        check_close(got, values(want), kF32);  // another summation order than the CPU's
      }
}

TEST_CASE("cuda: dora_scale_forward equals the CPU's bit for bit, mixed dtypes, bias or none, z apart or out") {
  for (const Case& c : kCases)
    for (bool with_bias : {false, true})
      for (bool in_place : {false, true}) {
        CAPTURE(c.rows);
        CAPTURE(c.columns);
        CAPTURE(dtype_name(c.out));
        CAPTURE(with_bias);
        CAPTURE(in_place);
        Tensor out0 = host_random({c.rows, c.columns}, c.out, 52), z = host_random({c.rows, c.columns}, c.out, 62);
        Tensor magnitude = host_random({c.columns}, c.vectors, 53, 0.5f, 2.0f);
        Tensor bias = host_random({c.columns}, c.vectors, 54), sum_squares = host_sum_squares(c.columns, 55);
        Tensor want = host_copy(out0);
        cpu.dora_scale_forward(want, in_place ? want : z, magnitude, sum_squares, with_bias ? &bias : nullptr);
        std::vector<float> got = emu_test::same_under_schedules([&] {
          Tensor out = to_device(out0), device_z = to_device(z), device_bias = to_device(bias);
          gpu.dora_scale_forward(out, in_place ? out : device_z, to_device(magnitude), to_device(sum_squares),
                                 with_bias ? &device_bias : nullptr);
          return values({&out});
        });
        CHECK(got == values(want));
      }
}

TEST_CASE("cuda: dora_scale_backward equals the CPU's bit for bit, dz in place or with dbase, dmagnitude accumulated "
          "or frozen") {
  for (const Case& c : kCases)
    for (bool with_bias : {false, true})
      for (bool in_place : {false, true})
        for (bool frozen : {false, true}) {
          CAPTURE(c.rows);
          CAPTURE(c.columns);
          CAPTURE(dtype_name(c.out));
          CAPTURE(with_bias);
          CAPTURE(in_place);
          CAPTURE(frozen);
          const Shape shape = {c.rows, c.columns};
          Tensor dout = host_random(shape, c.out, 56), z = host_random(shape, c.out, 57);
          Tensor magnitude = host_random({c.columns}, c.vectors, 58, 0.5f, 2.0f);
          Tensor bias = host_random({c.columns}, c.vectors, 59), sum_squares = host_sum_squares(c.columns, 60);
          Tensor dmagnitude0 = host_random({c.columns}, DType::f32, 61);
          Tensor want_dz = host_copy(dout), want_dm = host_copy(dmagnitude0), want_dbase = host_copy(dout);
          // dbase beside a separate dz only (in place, dz overwrites the dout both come from).
          cpu.dora_scale_backward(want_dz, in_place ? nullptr : &want_dbase, frozen ? nullptr : &want_dm, dout, z,
                                  magnitude, sum_squares, with_bias ? &bias : nullptr);
          std::vector<float> got = emu_test::same_under_schedules([&] {
            Tensor device_dout = to_device(dout), separate = device_empty(shape, c.out);
            Tensor dbase = device_empty(shape, c.out);
            Tensor dm = to_device(dmagnitude0), device_bias = to_device(bias);
            Tensor& dz = in_place ? device_dout : separate;
            gpu.dora_scale_backward(dz, in_place ? nullptr : &dbase, frozen ? nullptr : &dm, device_dout,
                                    to_device(z), to_device(magnitude), to_device(sum_squares),
                                    with_bias ? &device_bias : nullptr);
            return in_place ? values({&dz, &dm}) : values({&dz, &dbase, &dm});
          });
          CHECK(got == (in_place ? values({&want_dz, &want_dm}) : values({&want_dz, &want_dbase, &want_dm})));
        }
}
