// The counter fill on CUDA (Note [CUDA counter fill build]): one kernel per dtype, the values
// computed by counter_math.h, the header the CPU fill uses, compiled with -fmad=false, so that
// every element has the CPU fill's bits. Only the elements of the region are computed and
// written.
#include "counter_fill_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>

namespace torchdefer::counter_cuda {
namespace {

namespace math = counter_math;

// Consecutive elements per thread: four 32-bit draws share a Philox block, and the two
// elements of a Box–Muller pair share its logarithm and sincos (math::Draws keeps both).
constexpr int kPerThread = 4;
constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

template <typename T>
__global__ void counter_fill_kernel(T* out, Layout layout, int64_t numel,
                                    math::ElementParams params) {
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t first = thread * kPerThread; first < numel; first += threads * kPerThread) {
    math::Draws draws(params);
    const int64_t last = first + kPerThread < numel ? first + kPerThread : numel;
    for (int64_t k = first; k < last; ++k) {
      int64_t rest = k;
      int64_t offset = 0;
      int64_t global = 0;
      for (int d = layout.dims - 1; d >= 0; --d) {
        const int64_t i = rest % layout.sizes[d];
        rest /= layout.sizes[d];
        offset += i * layout.strides[d];
        global += (layout.start[d] + i) * layout.global_strides[d];
      }
      out[offset] = math::element<T>(params, draws, static_cast<uint64_t>(global));
    }
  }
}

template <typename T>
const char* launch(void* out, const Layout& layout, int64_t numel,
                   const math::ElementParams& params, cudaStream_t stream) {
  const int64_t work = (numel + kPerThread - 1) / kPerThread;
  const int64_t blocks =
      std::min<int64_t>(kMaxBlocks, (work + kThreadsPerBlock - 1) / kThreadsPerBlock);
  counter_fill_kernel<T><<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
      static_cast<T*>(out), layout, numel, math::for_dtype<T>(params));
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
