// The distributions counter mode draws from: one enum shared by the op table's counter samplers,
// the CPU fill and the CUDA kernel. No includes, so nvcc and every layer above replay can use it.
#pragma once

namespace torchdefer {

enum class CounterDistribution {
  kUniform,          // a = from, b = to
  kNormal,           // a = mean, b = std
  kBernoulli,        // a = p
  kRandom,           // from = from, range = to − from (0: the dtype's default random_() range)
  kExponential,      // a = lambda
  kLogNormal,        // a = mean, b = std (of the underlying normal)
  kCauchy,           // a = median, b = sigma
  kGeometric,        // a = p
  kTruncatedNormal,  // a = mean, b = std, low and high the bounds
};

}  // namespace torchdefer
