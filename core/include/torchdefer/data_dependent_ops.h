// Operators whose results depend on tensor values rather than on shapes and dtypes: the Fake layer
// refuses them, and the recorder answers them by reading values (Note [Reading values while
// recording]). One table, so that both agree on which ops read values.
#pragma once

#include <ATen/core/TensorBase.h>

#include <string_view>

namespace torchdefer {

// How users call `op` (a schema name such as "aten::nonzero") if it reads tensor values to decide
// its output's shape or a host value, or nullptr if it does not.
const char* data_dependent_api(std::string_view op);

// True when torch::equal(a, b) is known without data: a and b are the same view of one fake
// storage. ATen's kernels take the same shortcut, and the C++ MultiheadAttention asks
// equal(query, key) to detect self-attention.
bool same_fake_view(const at::TensorBase& a, const at::TensorBase& b);

}  // namespace torchdefer
