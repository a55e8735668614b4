// Data-dependent operators (value_reading_api() in op_table.h says which) whose result is known
// without values in special cases: the Fake layer answers those instead of refusing.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <optional>

#include <string_view>

namespace torchdefer {

// The result of data-dependent `op` on `tensors` (its tensor arguments, in order) when it is known
// without data, else nullopt: torch::equal(a, b) of the same view of one fake storage is true.
// ATen's kernels take the same shortcut, and the C++ MultiheadAttention asks equal(query, key)
// to detect self-attention.
std::optional<c10::IValue> answer_without_values(std::string_view op,
                                                 c10::ArrayRef<at::Tensor> tensors);

}  // namespace torchdefer
