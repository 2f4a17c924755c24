// The one overflow-checked product of sizes: shape element counts, byte
// sizes of allocations and the training config's token counts all go through
// it, so a huge extent is an error instead of a wrapped, too-small allocation.
#pragma once
#include <cstdint>

namespace ft {

// a * b, or an ft::Error when a factor is negative or the product leaves int64_t.
int64_t checked_mul(int64_t a, int64_t b);

}  // namespace ft
