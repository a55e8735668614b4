// Helpers every test file uses.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/torch.h>

#include <exception>
#include <string>

namespace torchdefer::testing {

// The message `f()` throws, or "<no error>".
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}

// Equal dtype, shape and bits (NaNs and signed zeros included).
inline bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         torch::equal(a.contiguous().reshape({-1}).view(at::kByte),
                      b.contiguous().reshape({-1}).view(at::kByte));
}

}  // namespace torchdefer::testing
