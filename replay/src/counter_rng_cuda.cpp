// The counter fill's CUDA dispatch (Note [Counter fill on other devices]): a CUDA tensor to the
// torch-free kernel interface of cuda/counter_fill_cuda.h. Built only when torch has CUDA.
#include "counter_rng_device.h"
#include "cuda/counter_fill_cuda.h"

#include <c10/core/ScalarType.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <optional>

namespace torchdefer {
namespace {

std::optional<counter_cuda::Dtype> kernel_dtype(c10::ScalarType type) {
  switch (type) {
    case c10::kBool:
      return counter_cuda::Dtype::kBool;
    case c10::kByte:
      return counter_cuda::Dtype::kUInt8;
    case c10::kChar:
      return counter_cuda::Dtype::kInt8;
    case c10::kShort:
      return counter_cuda::Dtype::kInt16;
    case c10::kInt:
      return counter_cuda::Dtype::kInt32;
    case c10::kLong:
      return counter_cuda::Dtype::kInt64;
    case c10::kFloat:
      return counter_cuda::Dtype::kFloat;
    case c10::kDouble:
      return counter_cuda::Dtype::kDouble;
    case c10::kHalf:
      return counter_cuda::Dtype::kHalf;
    case c10::kBFloat16:
      return counter_cuda::Dtype::kBFloat16;
    default:
      return std::nullopt;
  }
}

}  // namespace

bool counter_fill_cuda(const at::Tensor& out, const counter_math::ElementParams& params,
                       const CounterLayout& layout) {
  const std::optional<counter_cuda::Dtype> dtype = kernel_dtype(out.scalar_type());
  TORCH_CHECK(dtype, "torchdefer: counter_fill: no counter distribution fills dtype ",
              out.scalar_type(), ".");
  if (layout.sizes.size() > static_cast<size_t>(counter_cuda::kMaxDims)) {
    return false;
  }
  counter_cuda::Layout kernel_layout;
  kernel_layout.dims = static_cast<int>(layout.sizes.size());
  for (size_t d = 0; d < layout.sizes.size(); ++d) {
    kernel_layout.sizes[d] = layout.sizes[d];
    kernel_layout.strides[d] = layout.strides[d];
    kernel_layout.start[d] = layout.start[d];
    kernel_layout.global_strides[d] = layout.global_strides[d];
  }
  const c10::cuda::CUDAGuard guard(out.device());
  const char* error = counter_cuda::launch_counter_fill(
      static_cast<char*>(out.data_ptr()), *dtype, kernel_layout, out.numel(), params,
      c10::cuda::getCurrentCUDAStream(out.device().index()).stream());
  TORCH_CHECK(error == nullptr, "torchdefer: counter_fill: the CUDA kernel did not launch on ",
              out.device(), ": ", error);
  return true;
}

}  // namespace torchdefer
