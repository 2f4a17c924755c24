// Tensor parallelism as the model sees it (Megatron-LM's layout): each of
// the T ranks of a tensor group holds 1/T of every decoder layer. Attention
// splits by heads: q/k/v (NeoX: query_key_value) are column-parallel, each
// rank computing its heads' outputs, and o_proj (dense) is row-parallel, each
// rank multiplying its heads' columns of the input into a partial sum of the
// whole output. The MLP splits its intermediate dimension the same way
// (gate/up or dense_h_to_4h column-parallel, down or dense_4h_to_h
// row-parallel). One sum over the group follows each row-parallel product in
// the forward, and each column-parallel input gradient in the backward;
// everything else (embedding, norms, LM head, loss) is replicated: computed
// alike on every rank.
//
// LoRA over a column-parallel base keeps A replicated and splits B by output
// rows; over a row-parallel base it splits A by input columns and keeps B
// replicated, so its partial product joins the base's in the same sum. The
// replicated factor's gradient is then each rank's share of a sum
// (Parameter::partial_grad): the trainer sums it over the group.
//
// An INT8 base quantises x per row with the row's absmax: a row-parallel
// shard takes the maximum over the group of its ranks' absmax first, so
// every rank uses the whole row's scale (model/quant/int8.h).
//
// The trainer implements the group over its collectives; the planner over
// nothing (every sum and max a no-op of the same memory).
#pragma once
#include <cstdint>
#include <string>

#include "kernels/backend.h"
#include "model/model_config.h"

namespace ft {

class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int64_t rank() const = 0;
  virtual int64_t ranks() const = 0;
  // t (on the backend) becomes its sum over the group's ranks, the same
  // values on every rank. A 16-bit t is summed through an f32 copy and
  // rounded once (Megatron-LM sums in the activation dtype, rounding at
  // every step of the reduction).
  void sum(Backend& backend, Tensor& t);
  // t (f32, on the backend) becomes its element-wise maximum over the
  // group's ranks, the same values on every rank: a row-parallel INT8
  // layer's whole-row activation scales (model/quant/int8.h). Max is exact,
  // so the order of the reduction does not matter.
  void max(Backend& backend, Tensor& t);

 protected:
  // The sum of an f32 tensor on the backend's device, in place.
  virtual void sum_f32(Backend& backend, Tensor& t) = 0;
  // The element-wise maximum of an f32 tensor on the backend's device, in place.
  virtual void max_f32(Backend& backend, Tensor& t) = 0;
};

// Refuses a split of config's layers over `ranks` that they cannot take:
// the ranks must divide the attention heads and intermediate_size, and
// divide or be a multiple of the key/value heads (more ranks than key/value
// heads: each head on ranks / heads neighbouring ranks). where starts the
// message (the config field, or the file and the field).
void check_tensor_split(const ModelConfig& config, int64_t ranks, const std::string& where);

// How a linear layer's weight [out, in] is split over a tensor group.
enum class ParallelLinear {
  replicated,  // whole on every rank (no tensor parallelism)
  column,      // each rank out / T output rows: its share of the outputs
  row,         // each rank in / T input columns: a partial sum of every output
};

// A group that never communicates, for the planner: rank `rank` of `ranks`,
// its sums allocate what a real one does, add nothing and count the bytes a
// real one would sum.
class PlannedTensorGroup final : public TensorParallelGroup {
 public:
  PlannedTensorGroup(int64_t rank, int64_t ranks) : rank_(rank), ranks_(ranks) {}
  int64_t rank() const override { return rank_; }
  int64_t ranks() const override { return ranks_; }
  size_t summed_bytes() const { return summed_bytes_; }

 private:
  void sum_f32(Backend&, Tensor& t) override { summed_bytes_ += t.size_bytes(); }
  // An INT8 row-parallel layer's row scales: [tokens] floats, not counted.
  void max_f32(Backend&, Tensor&) override {}
  int64_t rank_, ranks_;
  size_t summed_bytes_ = 0;
};

}  // namespace ft
