// Built only when torch has CUDA (recorder/CMakeLists.txt).
#include "cuda_launch_limits.h"

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

namespace torchdefer::detail {

CudaLaunchLimits cuda_launch_limits(c10::DeviceIndex device) {
  int multiprocessors = 0;
  int threads = 0;
  const cudaError_t first =
      cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device);
  const cudaError_t second =
      cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, device);
  TORCH_CHECK(first == cudaSuccess && second == cudaSuccess,
              "torchdefer: could not read the launch limits of cuda:", static_cast<int>(device),
              ": ", cudaGetErrorString(first != cudaSuccess ? first : second));
  return {multiprocessors, threads};
}

}  // namespace torchdefer::detail
