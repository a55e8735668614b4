// Operators whose results depend on tensor values rather than on shapes and dtypes: the Fake layer
// refuses them, and the recorder answers them by reading values (Note [Reading values while
// recording]). One table, so that both agree on which ops read values.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <optional>

#include <string_view>

namespace torchdefer {

// How users call `op` (a schema name such as "aten::nonzero") if it reads tensor values to decide
// its output's shape or a host value, or nullptr if it does not.
const char* data_dependent_api(std::string_view op);

// The result of data-dependent `op` on `tensors` (its tensor arguments, in order) when it is known
// without data, else nullopt: torch::equal(a, b) of the same view of one fake storage is true.
// ATen's kernels take the same shortcut, and the C++ MultiheadAttention asks equal(query, key)
// to detect self-attention.
std::optional<c10::IValue> answer_without_values(std::string_view op,
                                                 c10::ArrayRef<at::Tensor> tensors);

}  // namespace torchdefer
