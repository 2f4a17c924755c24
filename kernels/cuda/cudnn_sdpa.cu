// cuDNN's fused SDPA (flash attention) as the CUDA backend's library
// attention engine (attention_engine.h): bf16 q, k, v, out, dout; causal;
// grouped-query heads (cuDNN maps query head h to kv head h / (Hq / Hkv), as
// kernels/backend.h does); f32 accumulation; its `Stats` output is our lse
// (the natural log-sum-exp of the scaled scores of each query row, [B, Hq, T]).
// Our [B, T, H, D] head views (pitch P between head rows: D where contiguous,
// 3 D inside GPT-NeoX's fused qkv rows) are cuDNN's [B, H, T, D] dims with
// strides {T H P, P, H P, 1}, read and written in place.
//
// Built into the GPU backend with the cudnn-frontend headers
// (FT_HAVE_CUDNN_FRONTEND, kernels/CMakeLists.txt; scripts/deps fetches
// them), as host C++: it holds no kernel. Elsewhere, the emulator included,
// there is no engine and our kernels (attention.cu) run.
//
// One cuDNN graph per problem (shape, scale, direction), built on first use
// and cached. A problem cuDNN has no engine for (f32 operands, a head size or
// GPU it does not support, a workspace over sdpa_workspace_budget_bytes) is
// remembered as such and reported once; our kernel runs it. Each call takes
// exactly the workspace budget from the allocator, so the memory planner's
// charge (kernels/meta/) is what a step holds.
#include "kernels/cuda/attention_engine.h"

#include <string>

#include "kernels/cuda/library_choice.h"
#include "kernels/error.h"

namespace ft::cuda {

// FT_ATTENTION_ENGINE=ours keeps cuDNN out of a run. compute-sanitizer's
// racecheck and synccheck cannot follow cuDNN's Hopper kernels (on an H100
// they report hazards and overflow their barrier table inside cuDNN's own
// code), so scripts/gpu_check checks our kernels with it.
bool library_attention_wanted() {
  return library_engine_wanted("FT_ATTENTION_ENGINE", "cuDNN SDPA where built, else ours");
}

}  // namespace ft::cuda

#if defined(FT_HAVE_CUDNN_FRONTEND)

#include <cudnn_frontend.h>

#include <cstdio>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/scratch.h"
#include "kernels/op_checks.h"

namespace ft::cuda {
namespace {

namespace fe = cudnn_frontend;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct Problem {
  int64_t batch, seq, q_heads, kv_heads, head_dim;
  float scale;
  bool backward;
  int64_t q_pitch, k_pitch, v_pitch, dq_pitch, dk_pitch, dv_pitch;  // the gradients' 0 forward
  auto tie() const {
    return std::tie(batch, seq, q_heads, kv_heads, head_dim, scale, backward, q_pitch, k_pitch, v_pitch, dq_pitch,
                    dk_pitch, dv_pitch);
  }
  bool operator<(const Problem& other) const { return tie() < other.tie(); }
};

// [B, T, H, D] heads, head rows pitch elements apart, as cuDNN's [B, H, T, D].
std::vector<int64_t> bthd_strides(const Problem& p, int64_t heads, int64_t pitch) {
  return {p.seq * heads * pitch, pitch, heads * pitch, 1};
}
TensorAttr bthd(fe::graph::Graph& graph, const char* name, Uid uid, const Problem& p, int64_t heads,
                int64_t pitch) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({p.batch, heads, p.seq, p.head_dim})
                          .set_stride(bthd_strides(p, heads, pitch)));
}
void set_bthd_output(const TensorAttr& t, Uid uid, const Problem& p, int64_t heads, int64_t pitch) {
  t->set_output(true).set_uid(uid).set_dim({p.batch, heads, p.seq, p.head_dim});
  t->set_stride(bthd_strides(p, heads, pitch));
}
// lse f32 [B, Hq, T] as cuDNN's Stats [B, Hq, T, 1].
void describe_stats(fe::graph::Tensor_attributes& t, const Problem& p) {
  t.set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim({p.batch, p.q_heads, p.seq, 1});
  t.set_stride({p.q_heads * p.seq, p.seq, 1, 1});
}

std::shared_ptr<fe::graph::Graph> describe(const Problem& p) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  TensorAttr q = bthd(*graph, "q", kQ, p, p.q_heads, p.q_pitch), k = bthd(*graph, "k", kK, p, p.kv_heads, p.k_pitch);
  TensorAttr v = bthd(*graph, "v", kV, p, p.kv_heads, p.v_pitch);
  if (!p.backward) {
    auto options = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_causal_mask(true);
    auto [o, stats] = graph->sdpa(q, k, v, options.set_attn_scale(p.scale));
    set_bthd_output(o, kO, p, p.q_heads, p.head_dim);
    stats->set_output(true);
    describe_stats(*stats, p);
    return graph;
  }
  TensorAttr o = bthd(*graph, "o", kO, p, p.q_heads, p.head_dim);
  TensorAttr dout = bthd(*graph, "dout", kDO, p, p.q_heads, p.head_dim);
  fe::graph::Tensor_attributes stats_attributes;
  describe_stats(stats_attributes.set_name("stats"), p);
  TensorAttr stats = graph->tensor(stats_attributes);
  auto options = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_causal_mask(true);
  auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, o, dout, stats, options.set_attn_scale(p.scale));
  set_bthd_output(dq, kDQ, p, p.q_heads, p.dq_pitch);
  set_bthd_output(dk, kDK, p, p.kv_heads, p.dk_pitch);
  set_bthd_output(dv, kDV, p, p.kv_heads, p.dv_pitch);
  return graph;
}

// cuDNN's steps from a described graph to a runnable plan and its workspace.
fe::error_t build(fe::graph::Graph& graph, cudnnHandle_t handle, int64_t& workspace_bytes) {
  if (fe::error_t e = graph.validate(); !e.is_good()) return e;
  if (fe::error_t e = graph.build_operation_graph(handle); !e.is_good()) return e;
  if (fe::error_t e = graph.create_execution_plans({fe::HeurMode_t::A}); !e.is_good()) return e;
  if (fe::error_t e = graph.check_support(); !e.is_good()) return e;
  if (fe::error_t e = graph.build_plans(); !e.is_good()) return e;
  return graph.get_workspace_size(workspace_bytes);
}

class CudnnSdpa final : public AttentionEngine {
 public:
  // Takes ownership of handle.
  CudnnSdpa(Allocator& allocator, cudnnHandle_t handle) : allocator_(allocator), handle_(handle) {}
  ~CudnnSdpa() override { cudnnDestroy(handle_); }

  bool forward(Tensor& out, Tensor& lse, const HeadsView& q, const HeadsView& k, const HeadsView& v, float scale,
               CUstream_st* stream) override {
    if (!usable({out, q, k, v})) return false;
    Problem p = problem(q, k, v, scale, false);
    return run(p, {{kQ, q.data()}, {kK, k.data()}, {kV, v.data()}, {kO, out.data}, {kStats, lse.data}}, stream);
  }

  bool backward(const HeadsView& dq, const HeadsView& dk, const HeadsView& dv, const Tensor& dout,
                const HeadsView& q, const HeadsView& k, const HeadsView& v, const Tensor& out, const Tensor& lse,
                float scale, CUstream_st* stream) override {
    if (!usable({dq, dk, dv, dout, q, k, v, out})) return false;
    Problem p = problem(q, k, v, scale, true);
    p.dq_pitch = dq.pitch();
    p.dk_pitch = dk.pitch();
    p.dv_pitch = dv.pitch();
    return run(p,
               {{kQ, q.data()}, {kK, k.data()}, {kV, v.data()}, {kO, out.data}, {kStats, lse.data},
                {kDO, dout.data}, {kDQ, dq.data()}, {kDK, dk.data()}, {kDV, dv.data()}},
               stream);
  }

 private:
  // bf16 operands whose heads start on 16-byte boundaries, as cuDNN's
  // kernels load them (a view's first column and pitch move the start).
  static bool usable(std::initializer_list<HeadsView> operands) {
    for (const HeadsView& x : operands) {
      const bool aligned = reinterpret_cast<uintptr_t>(x.data()) % 16 == 0 && x.pitch() * 2 % 16 == 0;
      if (x.dtype() != DType::bf16 || !aligned) return false;
    }
    return true;
  }
  static Problem problem(const HeadsView& q, const HeadsView& k, const HeadsView& v, float scale, bool backward) {
    const checks::AttentionShape s = checks::attention_shape(q, k);
    return {s.batch, s.seq, s.q_heads, s.kv_heads, s.head_dim, scale, backward, q.pitch(), k.pitch(), v.pitch(),
            0, 0, 0};
  }

  // The cached graph, or null where cuDNN has no engine for p.
  fe::graph::Graph* graph(const Problem& p) {
    auto found = graphs_.find(p);
    if (found != graphs_.end()) return found->second.get();
    std::shared_ptr<fe::graph::Graph> g = describe(p);
    int64_t workspace_bytes = 0;
    fe::error_t status = build(*g, handle_, workspace_bytes);
    const size_t budget = sdpa_workspace_budget_bytes(p.batch, p.q_heads, p.kv_heads, p.seq, p.head_dim, p.backward);
    std::string why = status.is_good() ? "" : status.get_message();
    if (status.is_good() && size_t(workspace_bytes) > budget)
      why = "workspace " + std::to_string(workspace_bytes) + " bytes over the budget " + std::to_string(budget);
    if (!why.empty()) {
      report_fallback_once(p, why);
      g = nullptr;
    }
    return graphs_.emplace(p, g).first->second.get();
  }

  bool run(const Problem& p, std::unordered_map<int64_t, void*> pointers, CUstream_st* stream) {
    if (p.batch == 0 || p.seq == 0 || p.q_heads == 0) return false;
    fe::graph::Graph* g = graph(p);
    if (!g) return false;
    const ScratchTensor sizes = sdpa_workspace_scratch(p.batch, p.q_heads, p.kv_heads, p.seq, p.head_dim, p.backward);
    Tensor workspace = Tensor::empty(sizes.shape, sizes.dtype, allocator_, MemCategory::workspace);
    const cudnnStatus_t stream_status = cudnnSetStream(handle_, stream);
    FT_CHECK(stream_status == CUDNN_STATUS_SUCCESS, "cuDNN: cudnnSetStream failed: ",
             cudnnGetErrorString(stream_status));
    fe::error_t status = g->execute(handle_, pointers, workspace.data);
    FT_CHECK(status.is_good(), "cuDNN SDPA ", p.backward ? "backward" : "forward", " failed: ", status.get_message());
    return true;
  }

  // Our kernels are slower: say so once, naming the first problem.
  void report_fallback_once(const Problem& p, const std::string& why) {
    if (reported_fallback_) return;
    reported_fallback_ = true;
    std::fprintf(stderr,
                 "warning: cuDNN SDPA has no engine for attention %s B=%lld T=%lld Hq=%lld Hkv=%lld D=%lld (%s); our "
                 "attention kernels run instead; further such problems are not reported\n",
                 p.backward ? "backward" : "forward", static_cast<long long>(p.batch), static_cast<long long>(p.seq),
                 static_cast<long long>(p.q_heads), static_cast<long long>(p.kv_heads),
                 static_cast<long long>(p.head_dim), why.c_str());
  }

  Allocator& allocator_;
  cudnnHandle_t handle_ = nullptr;
  std::map<Problem, std::shared_ptr<fe::graph::Graph>> graphs_;
  bool reported_fallback_ = false;
};

}  // namespace

// A cuDNN that cannot start (library missing or too old for the driver)
// leaves our kernels running, with a warning rather than a failed backend.
std::unique_ptr<AttentionEngine> make_library_attention(Allocator& allocator) {
  if (!library_attention_wanted()) return nullptr;
  cudnnHandle_t handle = nullptr;
  const cudnnStatus_t status = cudnnCreate(&handle);
  if (status != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "warning: cuDNN could not start (cudnnCreate: %s); our attention kernels run instead\n",
                 cudnnGetErrorString(status));
    return nullptr;
  }
  return std::make_unique<CudnnSdpa>(allocator, handle);
}
bool library_attention_built() { return true; }

}  // namespace ft::cuda

#else  // the emulator, or a GPU build without the cudnn-frontend headers

namespace ft::cuda {

std::unique_ptr<AttentionEngine> make_library_attention(Allocator&) {
  library_attention_wanted();  // a misspelt FT_ATTENTION_ENGINE is refused in every build
  return nullptr;
}
bool library_attention_built() { return false; }

}  // namespace ft::cuda

#endif
