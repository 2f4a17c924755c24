// Tensor parallelism without MPI, for tests: the ranks of a tensor group are
// threads of one process, and a sum (max) copies every rank's tensor out,
// waits for all of them, then each rank adds them up (takes their maximum) in
// rank order (the same bits on every rank, as an all-reduce gives).
#pragma once
#include <algorithm>
#include <barrier>
#include <cstdint>
#include <vector>

#include "model/tensor_parallel.h"
#include "tests/host_tensors.h"

namespace ft::testing {

class ThreadGroup {
 public:
  explicit ThreadGroup(int64_t ranks) : ranks_(ranks), slots_(static_cast<size_t>(ranks)), arrive_(ranks) {}

  // One rank's view of the group, used by its thread only.
  class Member final : public TensorParallelGroup {
   public:
    Member(ThreadGroup& group, int64_t rank) : group_(group), rank_(rank) {}
    int64_t rank() const override { return rank_; }
    int64_t ranks() const override { return group_.ranks_; }

   private:
    void sum_f32(Backend&, Tensor& t) override {
      reduce(t, [](float a, float b) { return a + b; });
    }
    void max_f32(Backend&, Tensor& t) override {
      reduce(t, [](float a, float b) { return std::max(a, b); });
    }
    void reduce(Tensor& t, float (*combine)(float, float)) {
      group_.slots_[size_t(rank_)] = read(t);
      group_.arrive_.arrive_and_wait();
      std::vector<float> total = group_.slots_[0];
      for (int64_t r = 1; r < group_.ranks_; ++r)
        for (size_t i = 0; i < total.size(); ++i) total[i] = combine(total[i], group_.slots_[size_t(r)][i]);
      group_.arrive_.arrive_and_wait();  // every rank has read every slot
      for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = total[size_t(i)];
    }
    ThreadGroup& group_;
    int64_t rank_;
  };

 private:
  int64_t ranks_;
  std::vector<std::vector<float>> slots_;
  std::barrier<> arrive_;
};

}  // namespace ft::testing
