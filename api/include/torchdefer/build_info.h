// What this libtorchdefer was built with and what it uses on the machine it runs on, for
// diagnostics and bug reports (`python -m torchdefer` prints them).
#pragma once

#include <torchdefer/export.h>

#include <string>

namespace torchdefer {

// The instruction set counter-mode materialization fills CPU tensors with here: "avx512", "avx2"
// or "scalar", chosen from the CPU at run time and capped by TORCHDEFER_CPU_CAPABILITY.
TORCHDEFER_API std::string counter_fill_cpu_capability();

// The version of the counter scheme this build's counter mode computes (Note [Counter scheme
// versions]): the same version gives the same counter-mode weights.
TORCHDEFER_API int counter_scheme_version();

// Whether the CUDA counter fill is compiled in, so that counter mode fills CUDA tensors on the
// GPU; without it they are filled on the CPU and copied.
TORCHDEFER_API bool has_cuda_kernels();

}  // namespace torchdefer
