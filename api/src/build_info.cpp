// The build's capabilities, asked of the layer that has them (the replay layer's counter fill).
#include <torchdefer/build_info.h>
#include <torchdefer/counter_rng.h>

namespace torchdefer {

std::string counter_fill_cpu_capability() { return counter_fill_isa(); }

int counter_scheme_version() { return kCounterSchemeVersion; }

bool has_cuda_kernels() { return counter_fill_has_cuda_kernel(); }

}  // namespace torchdefer
