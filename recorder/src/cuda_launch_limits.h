// The launch limits of a CUDA device that ATen's distribution kernels size their grid by (Note
// [Torch-mode draws on CUDA]). Defined only when torch has CUDA (TORCHDEFER_WITH_CUDA).
#pragma once

#include <torchdefer/cuda_draws.h>

#include <c10/core/Device.h>

namespace torchdefer::detail {

// Reads them with the CUDA runtime's device attributes, which create no context.
CudaLaunchLimits cuda_launch_limits(c10::DeviceIndex device);

}  // namespace torchdefer::detail
