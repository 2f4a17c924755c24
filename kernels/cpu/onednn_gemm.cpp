// oneDNN matmul primitives for CpuBackend (see onednn_gemm.h). Compiled to
// "not available" answers when the build has no oneDNN (FT_HAVE_ONEDNN unset).
#include "kernels/cpu/onednn_gemm.h"

#include "kernels/error.h"

#ifdef FT_HAVE_ONEDNN
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <optional>
#include <string>
#include <tuple>

namespace ft {

namespace {

using dnnl::memory;

// One cached primitive: M, N, K and the transposes of a and b (which fix
// every stride), the dtypes of a, b and out, and alpha and beta (baked into
// the primitive as its output scale and sum post-op).
using MatmulKey = std::tuple<int64_t, int64_t, int64_t, bool, bool, int, int, int, uint32_t, uint32_t>;

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

memory::data_type onednn_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return memory::data_type::f32;
    case DType::bf16: return memory::data_type::bf16;
    case DType::i8: return memory::data_type::s8;
    case DType::i32: return memory::data_type::s32;
    default: return memory::data_type::undef;
  }
}

// A row-major [rows, cols] operand read as its transpose when asked:
// oneDNN's dims {rows, cols} of op(x) with the strides of x's storage.
memory::desc operand_desc(int64_t rows, int64_t cols, DType dtype, bool transposed) {
  memory::dims strides = transposed ? memory::dims{1, rows} : memory::dims{cols, 1};
  return memory::desc({rows, cols}, onednn_type(dtype), strides);
}

// Whether the ISA oneDNN dispatches to (the CPU's, capped by
// ONEDNN_MAX_CPU_ISA) is isa or above: its values are bit sets, each
// including the ISAs below it. Asked for:
//   avx512_core_vnni: its s8 x s8 -> s32 product is exact (vpdpbusd, or AMX's
//     tdpbssd, accumulate in int32; older ISAs pair products in saturating
//     int16, vpmaddubsw);
//   avx512_core: its f32 and bf16 matmuls are brgemm kernels
//     (OnednnGemm::rows_independent);
//   avx512_core_bf16: native bf16 dot products (vdpbf16ps, or AMX).
bool dispatches_to(dnnl::cpu_isa isa) {
  return (unsigned(dnnl::get_effective_cpu_isa()) & unsigned(isa)) == unsigned(isa);
}

// The name oneDNN's verbose mode gives the ISA it dispatches to.
const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other isa";
  }
}

// The kernel oneDNN implements a primitive with: its implementation info
// ("brg:avx512_core_bf16"), with the dispatched ISA added where the info
// names none ("gemm:jit").
std::string kernel_name(const dnnl::primitive_desc& desc) {
  std::string info = desc.impl_info_str();
  const bool names_isa = info.find("avx") != std::string::npos || info.find("amx") != std::string::npos ||
                         info.find("sse") != std::string::npos;
  return names_isa ? info : info + " " + isa_name(dnnl::get_effective_cpu_isa());
}

// A cached primitive and its kernel_name.
struct Matmul {
  dnnl::matmul primitive;
  std::string kernel;
};

}  // namespace

struct OnednnGemm::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<MatmulKey, std::optional<Matmul>> matmuls;  // nullopt: oneDNN has no kernel for it
  bool int8_exact = dispatches_to(dnnl::cpu_isa::avx512_core_vnni);
  bool rows_independent = dispatches_to(dnnl::cpu_isa::avx512_core);
  bool bf16_native = dispatches_to(dnnl::cpu_isa::avx512_core_bf16);
  const char* last_kernel = "";

  // The cached primitive for out = alpha * op(a) @ op(b) + beta * out, null
  // where oneDNN implements none.
  const Matmul* primitive(const MatmulKey& key, const memory::desc& a, const memory::desc& b, const memory::desc& out,
                          float alpha, float beta) {
    auto found = matmuls.find(key);
    if (found == matmuls.end()) found = matmuls.emplace(key, create(a, b, out, alpha, beta)).first;
    return found->second ? &*found->second : nullptr;
  }

  std::optional<Matmul> create(const memory::desc& a, const memory::desc& b, const memory::desc& out,
                                     float alpha, float beta) {
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops post;
      post.append_sum(beta);
      attr.set_post_ops(post);
    }
    try {
      const dnnl::matmul::primitive_desc desc(dnnl::matmul::desc(a, b, out), attr, engine);
      return Matmul{dnnl::matmul(desc), kernel_name(desc)};
    } catch (const dnnl::error& e) {
      if (e.status == dnnl_unimplemented) return std::nullopt;
      throw;
    }
  }

  void execute(const Matmul& p, const memory::desc& a_desc, const void* a, const memory::desc& b_desc, const void* b,
               const memory::desc& out_desc, void* out) {
    memory a_mem(a_desc, engine, const_cast<void*>(a));
    memory b_mem(b_desc, engine, const_cast<void*>(b));
    memory out_mem(out_desc, engine, out);
    p.primitive.execute(stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, out_mem}});
    stream.wait();
    last_kernel = p.kernel.c_str();
  }
};

bool onednn_built() { return true; }

OnednnGemm::OnednnGemm() : impl_(std::make_unique<Impl>()) {}
OnednnGemm::~OnednnGemm() = default;

bool OnednnGemm::matmul(Tensor& out, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, float alpha,
                        float beta) {
  const bool supported_inputs = (a.dtype == DType::f32 && b.dtype == DType::f32) ||
                                (a.dtype == DType::bf16 && b.dtype == DType::bf16);
  const bool supported_out = out.dtype == DType::f32 || out.dtype == DType::bf16;
  const int64_t M = out.rows(), N = out.cols(), K = transpose_a ? a.rows() : a.cols();
  if (!supported_inputs || !supported_out || M == 0 || N == 0 || K == 0) return false;
  // op(a) [M, K] from a [M, K] or [K, M]; op(b) [K, N] from b [K, N] or [N, K].
  memory::desc a_desc = operand_desc(M, K, a.dtype, transpose_a);
  memory::desc b_desc = operand_desc(K, N, b.dtype, transpose_b);
  memory::desc out_desc = operand_desc(M, N, out.dtype, false);
  MatmulKey key{M, N, K, transpose_a, transpose_b, int(a.dtype), int(b.dtype), int(out.dtype), bits_of(alpha),
                bits_of(beta)};
  const Matmul* p = impl_->primitive(key, a_desc, b_desc, out_desc, alpha, beta);
  if (!p) return false;
  impl_->execute(*p, a_desc, a.data, b_desc, b.data, out_desc, out.data);
  return true;
}

bool OnednnGemm::int8_exact() const { return impl_->int8_exact; }

bool OnednnGemm::rows_independent() const { return impl_->rows_independent; }

bool OnednnGemm::bf16_native() const { return impl_->bf16_native; }

const char* OnednnGemm::last_kernel() const { return impl_->last_kernel; }

void OnednnGemm::int8_product(int32_t* product, const int8_t* xq, const int8_t* wq, int64_t N, int64_t K, int64_t O) {
  FT_CHECK(impl_->int8_exact && N > 0 && K > 0 && O > 0, "int8_product: needs VNNI and a non-empty product");
  memory::desc x_desc = operand_desc(N, K, DType::i8, false);
  memory::desc w_desc = operand_desc(K, O, DType::i8, true);  // wq [O, K] read as [K, O]
  memory::desc out_desc = operand_desc(N, O, DType::i32, false);
  MatmulKey key{N, O, K, false, true, int(DType::i8), int(DType::i8), int(DType::i32), bits_of(1.0f), bits_of(0.0f)};
  const Matmul* p = impl_->primitive(key, x_desc, w_desc, out_desc, 1.0f, 0.0f);
  FT_CHECK(p, "int8_product: oneDNN has no s8 x s8 -> s32 matmul on this CPU");
  impl_->execute(*p, x_desc, xq, w_desc, wq, out_desc, product);
}

}  // namespace ft

#else  // built without oneDNN: CpuBackend refuses CpuGemm::onednn, so these never run.

namespace ft {

struct OnednnGemm::Impl {};

bool onednn_built() { return false; }

OnednnGemm::OnednnGemm() = default;
OnednnGemm::~OnednnGemm() = default;

bool OnednnGemm::matmul(Tensor&, const Tensor&, const Tensor&, bool, bool, float, float) { return false; }

bool OnednnGemm::int8_exact() const { return false; }

bool OnednnGemm::rows_independent() const { return false; }

bool OnednnGemm::bf16_native() const { return false; }

const char* OnednnGemm::last_kernel() const { return ""; }

void OnednnGemm::int8_product(int32_t*, const int8_t*, const int8_t*, int64_t, int64_t, int64_t) {}

}  // namespace ft

#endif
