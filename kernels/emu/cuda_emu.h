// CUDA emulator: runs our own kernels (the same .cuh sources nvcc compiles) on
// the CPU, so kernel tests run on GPU-less machines. Include kernels/launch.h,
// not this file; it is only for host compilers (never define __CUDACC__).
//
// Model: the blocks of a launch run one after another on the calling OS
// thread, and each CUDA thread of a block is a fiber. A __shared__ variable is
// a function-local static (one copy suffices because blocks never overlap).
// The emulator finds a kernel's statics in the executable's symbol table and
// poisons them before every block; that covers __shared__ declared in the
// kernel itself, not in __device__ helpers it calls, and needs an unstripped
// executable. (g++ ignores section attributes on statics of templates, so a
// dedicated section cannot collect them.) Kernel bugs the emulator detects are
// thrown as cuda_emu::Error naming the kernel and the file:line involved.
#pragma once
#if defined(__CUDACC__)
#error "cuda_emu.h is for host compilers; nvcc builds use the real CUDA runtime"
#endif

// The CUDA headers define these only when undefined, so ours must come first.
#define __shared__ static __attribute__((aligned(16)))
#define __launch_bounds__(...)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// Built-in variables. The scheduler rewrites them before resuming each fiber,
// so a fiber always sees its own values even if the compiler caches them.
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
constexpr int warpSize = 32;

namespace cuda_emu {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Thread order between synchronisation points. The default comes from
// FT_EMU_SCHEDULE=inorder|reverse|random:SEED, else inorder.
enum class Order { inorder, reverse, random };
struct Schedule {
  Order order = Order::inorder;
  uint64_t seed = 0;
};
Schedule parse_schedule(const std::string& text);
std::string to_string(Schedule schedule);
void set_schedule(Schedule schedule);  // also restarts the random sequence
Schedule schedule();
// inorder, reverse and three random seeds: what tests compare across.
std::vector<Schedule> standard_schedules();

// A warp collective: each lane posts a WarpLane, and once every lane named in
// the mask waits at the same call site, fn runs once over the warp's 32 records
// (index = lane) and fills each `out`. fn == nullptr is a pure rendezvous.
struct WarpLane {
  uint64_t in = 0, out = 0;
  int arg = 0, width = 0;
  const void* ptr = nullptr;
};
using WarpFn = void (*)(WarpLane* lanes, unsigned mask);
uint64_t warp_collective(const char* op, unsigned mask, WarpFn fn, WarpLane lane, const char* file, int line);
void shfl_idx(WarpLane* lanes, unsigned mask);
void shfl_up(WarpLane* lanes, unsigned mask);
void shfl_down(WarpLane* lanes, unsigned mask);
void shfl_xor(WarpLane* lanes, unsigned mask);
void vote_ballot(WarpLane* lanes, unsigned mask);
// wmma::load_matrix_sync / store_matrix_sync: the lanes' ptr and arg (ldm)
// must agree, ptr be 256-bit aligned and ldm (in elements of `width` bytes)
// a multiple of 16 bytes, as CUDA requires; else the kernel fails.
void wmma_operand(WarpLane* lanes, unsigned mask);
// __activemask: the caller's warp lanes that had not exited at the caller's
// last barrier or warp collective (schedule independent, unlike "right now").
unsigned live_lanes();
void barrier(const char* file, int line);
void* dynamic_shared();

// Runs body(params) as every thread of every block; throws Error on a bug.
void run(const char* name, const void* kernel, dim3 grid, dim3 block, size_t smem_bytes, void (*body)(void*),
         void* params);

// "block_sum<256>" from the template argument, for error messages. gcc
// writes "Kernel = block_sum<256>"; clang writes "Kernel = &block_sum",
// without the template's own arguments.
template <auto Kernel>
const char* kernel_name() {
  static const std::string name = [](std::string s) {
    size_t begin = s.find("Kernel = ") + 9;
    if (s[begin] == '&') ++begin;
    return s.substr(begin, s.rfind(']') - begin);
  }(__PRETTY_FUNCTION__);
  return name.c_str();
}

// Arguments convert to the kernel's parameter types once, as with <<<>>>;
// every thread then gets its own by-value copy.
template <auto Kernel, class... P, class... Args>
void launch_with(void (*)(P...), dim3 grid, dim3 block, size_t smem_bytes, Args&&... args) {
  using Params = std::tuple<std::decay_t<P>...>;
  Params params(std::forward<Args>(args)...);
  run(kernel_name<Kernel>(), reinterpret_cast<const void*>(Kernel), grid, block, smem_bytes,
      [](void* p) { std::apply(Kernel, *static_cast<Params*>(p)); }, &params);
}

inline int lane_id() {
  return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % warpSize;
}

template <class T>
T exchange(const char* op, WarpFn fn, unsigned mask, T value, int arg, int width, const char* file, int line) {
  // Bytes, not objects: __half2 and friends have user-provided assignment.
  static_assert(sizeof(T) <= 8 && std::is_trivially_destructible_v<T>, "warp shuffles move values of up to 8 bytes");
  WarpLane lane;
  std::memcpy(&lane.in, static_cast<const void*>(&value), sizeof(T));
  lane.arg = arg;
  lane.width = width;
  uint64_t out = warp_collective(op, mask, fn, lane, file, line);
  T result;
  std::memcpy(static_cast<void*>(&result), &out, sizeof(T));
  return result;
}

}  // namespace cuda_emu

// Dynamic shared memory: `FT_DYNAMIC_SHARED(float, buf);` declares float* buf.
#define FT_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(::cuda_emu::dynamic_shared())

// ---- synchronisation --------------------------------------------------------
// file/line default to the call site, so divergence reports point at kernels.
inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  cuda_emu::barrier(file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  cuda_emu::warp_collective("__syncwarp", mask, nullptr, {}, file, line);
}
inline unsigned __activemask() { return cuda_emu::live_lanes(); }
inline void __threadfence() {}
inline void __threadfence_block() {}

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
  return cuda_emu::exchange("__shfl_sync", cuda_emu::shfl_idx, mask, var, src_lane, width, file, line);
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
  return cuda_emu::exchange("__shfl_up_sync", cuda_emu::shfl_up, mask, var, int(delta), width, file, line);
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
  return cuda_emu::exchange("__shfl_down_sync", cuda_emu::shfl_down, mask, var, int(delta), width, file, line);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
  return cuda_emu::exchange("__shfl_xor_sync", cuda_emu::shfl_xor, mask, var, lane_mask, width, file, line);
}
inline unsigned __ballot_sync(unsigned mask, int pred, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  return cuda_emu::exchange("__ballot_sync", cuda_emu::vote_ballot, mask, unsigned(pred != 0), 0, 0, file, line);
}
inline int __any_sync(unsigned mask, int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return __ballot_sync(mask, pred, file, line) != 0;
}
inline int __all_sync(unsigned mask, int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return __ballot_sync(mask, pred, file, line) == mask;
}

// ---- atomics ------------------------------------------------------------------
// Every fiber runs on one OS thread and only switches at synchronisation
// points, so a plain read-modify-write is atomic. T is deduced from the pointer
// alone, as CUDA's overloads convert the value argument.
template <class T>
T atomicAdd(T* p, std::type_identity_t<T> v) {
  T old = *p;
  *p = old + v;
  return old;
}
template <class T>
T atomicSub(T* p, std::type_identity_t<T> v) {
  T old = *p;
  *p = old - v;
  return old;
}
template <class T>
T atomicMax(T* p, std::type_identity_t<T> v) {
  T old = *p;
  *p = old < v ? v : old;
  return old;
}
template <class T>
T atomicMin(T* p, std::type_identity_t<T> v) {
  T old = *p;
  *p = v < old ? v : old;
  return old;
}
template <class T>
T atomicExch(T* p, std::type_identity_t<T> v) {
  T old = *p;
  *p = v;
  return old;
}
template <class T>
T atomicCAS(T* p, std::type_identity_t<T> compare, std::type_identity_t<T> v) {
  T old = *p;
  if (old == compare) *p = v;
  return old;
}

// ---- loads and stores with cache hints: plain accesses on the CPU --------------
template <class T>
T __ldg(const T* p) { return *p; }
template <class T>
T __ldcs(const T* p) { return *p; }
template <class T>
T __ldcg(const T* p) { return *p; }
template <class T>
void __stcs(T* p, T v) { *p = v; }
template <class T>
void __stcg(T* p, T v) { *p = v; }

// ---- float intrinsics ------------------------------------------------------------
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / std::sqrt(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
// CUDA's global min/max accept mixed argument types.
template <class A, class B>
std::common_type_t<A, B> min(A a, B b) { return b < a ? b : a; }
template <class A, class B>
std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }

// ---- device-only half / bf16 functions (conversions and arithmetic are host-callable)
// Computed in f32 and rounded once, as the hardware's approximations are not
// reproducible bit for bit anyway.
#define FT_EMU_HALF_UNARY(name, expr)                                                                   \
  inline __half name(__half a) { float x = __half2float(a); return __float2half(expr); }                \
  inline __nv_bfloat16 name(__nv_bfloat16 a) { float x = __bfloat162float(a); return __float2bfloat16(expr); }
FT_EMU_HALF_UNARY(hexp, std::exp(x))
FT_EMU_HALF_UNARY(hexp2, std::exp2(x))
FT_EMU_HALF_UNARY(hlog, std::log(x))
FT_EMU_HALF_UNARY(hlog2, std::log2(x))
FT_EMU_HALF_UNARY(hsqrt, std::sqrt(x))
FT_EMU_HALF_UNARY(hrsqrt, 1.0f / std::sqrt(x))
FT_EMU_HALF_UNARY(hrcp, 1.0f / x)
FT_EMU_HALF_UNARY(htanh, std::tanh(x))
FT_EMU_HALF_UNARY(hsin, std::sin(x))
FT_EMU_HALF_UNARY(hcos, std::cos(x))
FT_EMU_HALF_UNARY(hfloor, std::floor(x))
FT_EMU_HALF_UNARY(hceil, std::ceil(x))
FT_EMU_HALF_UNARY(htrunc, std::trunc(x))
FT_EMU_HALF_UNARY(hrint, std::nearbyint(x))
#undef FT_EMU_HALF_UNARY
inline __half __hfma(__half a, __half b, __half c) {
  return __float2half(std::fma(__half2float(a), __half2float(b), __half2float(c)));
}
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
  return __float2bfloat16(std::fma(__bfloat162float(a), __bfloat162float(b), __bfloat162float(c)));
}
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
  return __floats2half2_rn(std::fma(__low2float(a), __low2float(b), __low2float(c)),
                           std::fma(__high2float(a), __high2float(b), __high2float(c)));
}
inline __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c) {
  return __floats2bfloat162_rn(std::fma(__low2float(a), __low2float(b), __low2float(c)),
                               std::fma(__high2float(a), __high2float(b), __high2float(c)));
}

// ---- tensor-core fragments (the nvcuda::wmma subset, <mma.h> under nvcc) ------
// Only 16x16x16 tiles with half or bf16 inputs and f32 accumulators. Element e
// of lane l is tile element l * 8 + e in row-major order; hardware layouts
// differ and are opaque, so kernels must not depend on this mapping.
namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "cuda_emu supports 16x16x16 wmma tiles only");
  static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float>
                                                 : std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                "cuda_emu supports half/bf16 inputs with f32 accumulators only");
  static constexpr int num_elements = 8;
  T x[num_elements];
};

template <class Use, class T, class Layout, class V>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, const V& value) {
  for (T& x : f.x) x = T(value);
}

// The warp-wide rendezvous of a fragment load or store, with its checks.
template <class T>
void operand_sync(const char* op, const T* p, unsigned ldm, const char* file, int line) {
  cuda_emu::WarpLane lane;
  lane.ptr = p;
  lane.arg = int(ldm);
  lane.width = int(sizeof(T));
  cuda_emu::warp_collective(op, 0xffffffffu, cuda_emu::wmma_operand, lane, file, line);
}

// Element (r, c) of the lane's tile slice, in memory with leading dimension ldm.
inline size_t tile_offset(int e, unsigned ldm, bool row_major_memory) {
  int i = cuda_emu::lane_id() * 8 + e, r = i / 16, c = i % 16;
  return row_major_memory ? size_t(r) * ldm + c : size_t(c) * ldm + r;
}

template <class Use, class T, class Layout>
  requires(!std::is_same_v<Use, accumulator>)
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm,
                      const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  operand_sync("wmma::load_matrix_sync", p, ldm, file, line);
  for (int e = 0; e < 8; ++e) f.x[e] = p[tile_offset(e, ldm, std::is_same_v<Layout, row_major>)];
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  operand_sync("wmma::load_matrix_sync", p, ldm, file, line);
  for (int e = 0; e < 8; ++e) f.x[e] = p[tile_offset(e, ldm, layout == mem_row_major)];
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  operand_sync("wmma::store_matrix_sync", p, ldm, file, line);
  for (int e = 0; e < 8; ++e) p[tile_offset(e, ldm, layout == mem_row_major)] = f.x[e];
}

// Gathers the warp's a, b and c slices, multiplies with f32 accumulation and
// scatters d. Inputs are gathered before any output is written: d may alias c.
template <class T>
void mma_warp(cuda_emu::WarpLane* lanes, unsigned) {
  float a[256], b[256], c[256];
  for (int lane = 0; lane < 32; ++lane) {
    auto slices = static_cast<const void* const*>(lanes[lane].ptr);
    for (int e = 0; e < 8; ++e) {
      a[lane * 8 + e] = float(static_cast<const T*>(slices[1])[e]);
      b[lane * 8 + e] = float(static_cast<const T*>(slices[2])[e]);
      c[lane * 8 + e] = static_cast<const float*>(slices[3])[e];
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    float* d = static_cast<float*>(const_cast<void*>(static_cast<const void* const*>(lanes[lane].ptr)[0]));
    for (int e = 0; e < 8; ++e) {
      int i = lane * 8 + e, r = i / 16, col = i % 16;
      float acc = c[i];
      for (int k = 0; k < 16; ++k) acc = std::fma(a[r * 16 + k], b[k * 16 + col], acc);
      d[e] = acc;
    }
  }
}

template <class T, class LayoutA, class LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b, const fragment<accumulator, 16, 16, 16, float>& c,
              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const void* slices[4] = {d.x, a.x, b.x, c.x};
  cuda_emu::WarpLane lane;
  lane.ptr = slices;
  cuda_emu::warp_collective("wmma::mma_sync", 0xffffffffu, mma_warp<T>, lane, file, line);
}

}  // namespace nvcuda::wmma
