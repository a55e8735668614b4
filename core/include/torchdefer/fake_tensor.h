// Fake tensors: tensors with real metadata (shape, strides, dtype, device, autograd state) and no
// storage, so a model of any size can be built and inspected without allocating its weights.
//
//   {
//     torchdefer::FakeMode fake(at::kCUDA);   // factories now return fakes on cuda:0
//     torch::nn::Linear l(8192, 8192);        // no memory allocated, CUDA never initialized
//     auto y = l(torch::ones({2, 8192}));     // forward pass: a fake of shape [2, 8192]
//   }
#pragma once

#include <torchdefer/export.h>

#include <ATen/core/TensorBase.h>
#include <c10/core/Device.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <optional>
#include <string>

namespace torchdefer {

// True if `t` is a fake tensor: it has shape, dtype and device but no storage.
TORCHDEFER_API bool is_fake(const at::TensorBase& t) noexcept;

// A one-line description that never touches data, e.g. "fake float32[4096, 4096] on cuda:0" or
// "float32[3] on cpu" for a real tensor. Used by every error message about a tensor.
TORCHDEFER_API std::string describe(const at::TensorBase& t);

// While a FakeMode lives on this thread, every factory function (empty, zeros, randn, arange,
// tensor, ...) returns a fake tensor. Ops on fakes return fakes with or without a FakeMode.
// Ops whose inputs are all real tensors still compute for real.
//
// FakeMode(device) also makes `device` the default for factories that name none; a FakeMode
// without a device keeps the enclosing one's default (CPU outside any). A device without an index
// means index 0: a fake CUDA tensor never asks the driver which device is current, so CUDA is
// never initialized and no GPU or driver needs to be present. FakeModes nest and are
// exception-safe; they are not shared between threads.
class TORCHDEFER_API FakeMode {
 public:
  FakeMode();
  explicit FakeMode(c10::Device default_device);
  ~FakeMode();

  FakeMode(const FakeMode&) = delete;
  FakeMode& operator=(const FakeMode&) = delete;
  FakeMode(FakeMode&&) = delete;
  FakeMode& operator=(FakeMode&&) = delete;

  // True while a FakeMode lives on this thread.
  static bool is_active();

  // The device a factory that names none gets on this thread: the innermost FakeMode's device,
  // or std::nullopt when no FakeMode set one.
  static std::optional<c10::Device> default_device();

 private:
  c10::impl::IncludeDispatchKeyGuard include_fake_;
  std::optional<c10::Device> saved_default_device_;
};

}  // namespace torchdefer
