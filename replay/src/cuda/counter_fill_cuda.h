// The CUDA counter fill's interface: raw pointers and sizes, no torch types, so that the kernel
// compiles with nvcc whether or not torch was built with CUDA (Note [CUDA counter fill build]).
#pragma once

#include "../counter_math.h"

#include <cstdint>

namespace torchdefer::counter_cuda {

enum class Dtype {
  kBool,
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat,
  kDouble,
  kHalf,
  kBFloat16
};

// The most dimensions a layout may have after merging (Note [Merged rows]); a tensor with more
// is filled through the host.
constexpr int kMaxDims = 8;

// Where the elements to fill are: `out`'s sizes and strides (in elements), and for each dimension
// the region's start and the row-major stride of the op's global shape.
struct Layout {
  int dims = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  int64_t start[kMaxDims] = {};
  int64_t global_strides[kMaxDims] = {};
};

// Enqueues the fill of the `numel` elements `layout` places at device pointer `out`, of dtype
// `dtype`, with the values of Note [Counter RNG], on CUDA stream `stream` (a cudaStream_t).
// Returns nullptr, or the CUDA error's description if the launch failed.
const char* launch_counter_fill(void* out, Dtype dtype, const Layout& layout, int64_t numel,
                                const counter_math::ElementParams& params, void* stream);

}  // namespace torchdefer::counter_cuda
