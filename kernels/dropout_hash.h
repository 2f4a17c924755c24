// Counter-based random numbers: uniform(seed, i) is a pure function of the
// seed and an element index, so every backend (CPU, CUDA, the emulator) draws
// the same dropout mask, and backward recomputes the mask instead of saving it;
// NEFTune's embedding noise draws from the same numbers.
//
// uniform(seed, i) is output i (counting from 0) of the splitmix64 generator
// seeded with `seed`, cut to its top 24 bits: a multiple of 2^-24 in [0, 1),
// exactly representable in f32, so the keep test is the same on every device.
#pragma once
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define FT_HOST_DEVICE __host__ __device__
#else
#define FT_HOST_DEVICE
#endif

namespace ft {

FT_HOST_DEVICE inline uint64_t splitmix64(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

FT_HOST_DEVICE inline float hash_uniform(uint64_t seed, uint64_t index) {
  return float(splitmix64(seed, index) >> 40) * (1.0f / 16777216.0f);
}

// The seed whose draws start at element `first` of seed's: uniform(
// seed_at(seed, first), i) == uniform(seed, first + i) (splitmix64 steps its
// state by a constant), so a block of rows draws its part of the whole
// tensor's mask with the unchanged kernels.
FT_HOST_DEVICE inline uint64_t seed_at(uint64_t seed, uint64_t first) { return seed + first * 0x9E3779B97F4A7C15ull; }

// Element `index` survives dropout with probability 1 - p.
FT_HOST_DEVICE inline bool dropout_keep(uint64_t seed, uint64_t index, float p) {
  return hash_uniform(seed, index) >= p;
}

// x plus element `index`'s uniform noise in [-magnitude, magnitude): 2u - 1
// is exact (a multiple of 2^-23), and the one fused multiply-add rounds once
// on every device, where a compiler left to itself may or may not contract
// x + s * magnitude.
FT_HOST_DEVICE inline float add_uniform_noise_value(float x, uint64_t seed, uint64_t index, float magnitude) {
  return fmaf(2.0f * hash_uniform(seed, index) - 1.0f, magnitude, x);
}

}  // namespace ft
