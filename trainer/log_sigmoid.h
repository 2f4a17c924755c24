// -log sigmoid(z), the pairwise preference loss of DPO and of reward models.
#pragma once
#include <cmath>

namespace ft {

// -log sigmoid(z) = log(1 + exp(-z)), without overflow for either sign.
inline double softplus_of_minus(double z) { return z >= 0 ? std::log1p(std::exp(-z)) : -z + std::log1p(std::exp(z)); }

}  // namespace ft
