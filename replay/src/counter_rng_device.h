// How the counter fill lays out a region in memory, shared by the CPU fill and the CUDA dispatch
// (Note [Merged rows], Note [Counter fill on other devices]).
#pragma once

#include "counter_math.h"

#include <torchdefer/counter_rng.h>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <vector>

namespace torchdefer {

// `out` as rows after merging (Note [Merged rows]): its sizes and strides, and for each dimension
// the region's start and the row-major stride of the op's (merged) global shape.
struct CounterLayout {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  std::vector<int64_t> start;
  std::vector<int64_t> global_strides;
};

// The element type counter_math writes for a torch dtype: the same bits, without c10 types.
template <typename T>
struct CounterElementOf {
  using type = T;
};
template <>
struct CounterElementOf<c10::Half> {
  using type = counter_math::HalfBits;
};
template <>
struct CounterElementOf<c10::BFloat16> {
  using type = counter_math::BFloat16Bits;
};
template <typename T>
using CounterElement = typename CounterElementOf<T>::type;

// What every element's value depends on besides its index, for the per-element math of
// counter_math.h (before math::for_dtype completes it for a dtype).
counter_math::ElementParams element_params(const CounterDistributionParams& p, uint64_t seed,
                                           uint64_t stream);

CounterLayout merge_rows(const at::Tensor& out, c10::IntArrayRef global,
                         const std::vector<int64_t>& start);

#ifdef TORCHDEFER_WITH_CUDA
// Fills CUDA tensor `out` in place on its current stream (counter_rng_cuda.cpp); false, touching
// nothing, for a layout the kernel does not take (the caller then fills through the host).
bool counter_fill_cuda(const at::Tensor& out, const counter_math::ElementParams& params,
                       const CounterLayout& layout);
#endif

}  // namespace torchdefer
