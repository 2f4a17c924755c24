// The CPU backend: the reference every other backend is checked against, and
// a real way to fine-tune small models. OpenMP across rows/heads; f32
// accumulation everywhere. One file per op family in this folder.
#pragma once
#include "kernels/backend.h"

namespace ft {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(Allocator& allocator) : allocator_(allocator) {}
  const char* name() const override { return "cpu"; }
  Allocator& allocator() override { return allocator_; }

 private:
  FT_BACKEND_OP_IMPLS(, override)

  Allocator& allocator_;
};

}  // namespace ft
