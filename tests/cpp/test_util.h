// Helpers every test file uses.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
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

// torchdefer::trunc_normal_, PyTorch 2.13's truncated-normal rejection sampler as one operator,
// called the way torch.nn.init.trunc_normal_ reaches it from Python: through the dispatcher.
inline at::Tensor& trunc_normal_(at::Tensor& t, double mean, double std, double a, double b,
                                 std::optional<at::Generator> generator = std::nullopt) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("torchdefer::trunc_normal_", "")
                             .typed<at::Tensor&(at::Tensor&, double, double, double, double,
                                                std::optional<at::Generator>)>();
  return op.call(t, mean, std, a, b, std::move(generator));
}

}  // namespace torchdefer::testing
