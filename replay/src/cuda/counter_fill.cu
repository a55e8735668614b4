// The counter fill on CUDA (Note [CUDA counter fill build]): one kernel per dtype, the values
// computed by counter_math.h, the header the CPU fill uses, compiled with -fmad=false, so that
// every element has the CPU fill's bits. Only the elements of the region are computed and
// written, each thread its tiles of counter_fill_plan.h (Note [CUDA counter fill tiles]).
#include "counter_fill_cuda.h"
#include "counter_fill_plan.h"

#include <cuda_runtime.h>

namespace torchdefer::counter_cuda {
namespace {

namespace math = counter_math;

template <typename T>
__global__ void counter_fill_kernel(T* out, FillPlan plan, math::ElementParams params) {
  fill_thread<T>(out, plan, params, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                 static_cast<int64_t>(gridDim.x) * blockDim.x);
}

template <typename T>
const char* launch(void* out, const Layout& layout, int64_t numel,
                   const math::ElementParams& params, cudaStream_t stream) {
  if (numel == 0) {
    return nullptr;  // an empty grid is not a launch configuration CUDA accepts
  }
  const FillPlan plan = make_plan(layout, out, static_cast<int>(sizeof(T)));
  counter_fill_kernel<T>
      <<<static_cast<unsigned>(launch_blocks(plan)), kThreadsPerBlock, 0, stream>>>(
          static_cast<T*>(out), plan, math::for_dtype<T>(params));
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

}  // namespace

const char* launch_counter_fill(void* out, Dtype dtype, const Layout& layout, int64_t numel,
                                const counter_math::ElementParams& params, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case Dtype::kBool:
      return launch<bool>(out, layout, numel, params, s);
    case Dtype::kUInt8:
      return launch<uint8_t>(out, layout, numel, params, s);
    case Dtype::kInt8:
      return launch<int8_t>(out, layout, numel, params, s);
    case Dtype::kInt16:
      return launch<int16_t>(out, layout, numel, params, s);
    case Dtype::kInt32:
      return launch<int32_t>(out, layout, numel, params, s);
    case Dtype::kInt64:
      return launch<int64_t>(out, layout, numel, params, s);
    case Dtype::kFloat:
      return launch<float>(out, layout, numel, params, s);
    case Dtype::kDouble:
      return launch<double>(out, layout, numel, params, s);
    case Dtype::kHalf:
      return launch<math::HalfBits>(out, layout, numel, params, s);
    case Dtype::kBFloat16:
      return launch<math::BFloat16Bits>(out, layout, numel, params, s);
  }
  return "torchdefer: launch_counter_fill: unknown dtype";
}

}  // namespace torchdefer::counter_cuda
