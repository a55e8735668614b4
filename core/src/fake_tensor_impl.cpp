#include <torchdefer/fake_tensor.h>
#include <torchdefer/fake_tensor_impl.h>
#include <torchdefer/torch_compat.h>

#include "stand_in_device_guard.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <sstream>
#include <typeinfo>
#include <utility>

namespace torchdefer {
namespace {

c10::DispatchKeySet fake_key_set(c10::Device device) {
  const c10::DispatchKey backend = c10::computeDispatchKey(std::nullopt, c10::kStrided, device);
  return c10::DispatchKeySet(backend) | c10::DispatchKeySet(kFakeKey);
}

// A second meta TensorImpl over the same meta StorageImpl, so that a detached copy of a fake keeps
// its storage identity but not its geometry (resizing one must not resize the other).
at::Tensor alias_of(const at::Tensor& meta) {
  at::Tensor alias = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(meta.storage()),
                                                              meta.key_set(), meta.dtype());
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(meta.sizes(), meta.strides(),
                                                     meta.storage_offset());
  return alias;
}

std::string describe_impl(const c10::TensorImpl& impl) {
  std::ostringstream out;
  if (impl.key_set().has(kFakeKey)) {
    out << "fake ";
  }
  out << c10::toString(impl.dtype().toScalarType()) << impl.sizes() << " on " << impl.device();
  return out.str();
}

}  // namespace

FakeTensorImpl::FakeTensorImpl(at::Tensor meta, c10::Device device)
    : c10::TensorImpl(fake_key_set(device), meta.dtype(), device),
      meta_(std::move(meta)),
      device_(device) {
  TORCH_INTERNAL_ASSERT(meta_.defined() && meta_.is_meta(),
                        "torchdefer: a fake tensor's shadow must be a meta tensor");
  detail::install_stand_in_device_guard(device.type());
  sync_from_meta();
  set_storage_access_should_throw();
}

const c10::StorageImpl* FakeTensorImpl::storage_identity() const {
  return meta_.defined() ? meta_.storage().unsafeGetStorageImpl() : nullptr;
}

void FakeTensorImpl::sync_from_meta() {
  const bool resized = sizes_and_strides_.sizes_arrayref() != meta_.sizes();
  sizes_and_strides_.set_sizes(meta_.sizes());
  sizes_and_strides_.set_strides(meta_.strides());
  storage_offset_ = meta_.storage_offset();
  refresh_numel();
  refresh_contiguous();
  if (resized) {
    access_error_written_ = false;  // the message names the shape
  }
}

// Note [The access error of a fake]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Reading a fake's data or storage fails in TensorImpl itself: storage() throws when
// storage_access_should_throw_ is set, and every data pointer accessor throws when has_storage()
// is false, each with the custom message kept in the TensorImpl's ExtraMeta if there is one.
// Those throwing functions are private and not virtual, but both checks go through virtual
// functions (storage() and has_storage() are TENSORIMPL_MAYBE_VIRTUAL, virtual unless a mobile
// build defines C10_DISABLE_TENSORIMPL_EXTENSIBILITY, which LibTorch releases do not), so
// the fake writes its message there, just before the check fails, and only when its shape changed
// since it last wrote one. Formatting the message for every fake made (a stream, the dtype, the
// sizes and the device) cost about a fifth of constructing a model under a FakeMode, for a
// message that is almost never shown. The message is the same as when it was written at
// creation and after each resize: it names the dtype, the sizes and the device, and of those only
// the sizes change in place.
void FakeTensorImpl::write_access_error() const {
  if (access_error_written_.load(std::memory_order_acquire) || !meta_.defined()) {
    return;
  }
  // Rare (an access that is about to fail), so one lock for all fakes.
  static std::mutex writing;
  const std::lock_guard<std::mutex> lock(writing);
  if (access_error_written_.load(std::memory_order_relaxed)) {
    return;
  }
  std::ostringstream message;
  message << "Cannot access the data or storage of " << describe_impl(*this)
          << ": a fake tensor has shape, dtype and device but no storage. Materialize it before "
             "reading its data (data_ptr, item, storage, printing values); to print what it is, "
             "use torchdefer::describe(t) (Python: torchdefer.describe(t)).";
  // The object is never const itself: only this accessor is.
  const_cast<FakeTensorImpl*>(this)->release_storage_and_set_meta_custom_data_ptr_error_msg_(
      message.str());
  access_error_written_.store(true, std::memory_order_release);
}

bool FakeTensorImpl::has_storage() const {
  const bool has = c10::TensorImpl::has_storage();
  if (!has) {
    write_access_error();
  }
  return has;
}

const c10::Storage& FakeTensorImpl::storage() const {
  write_access_error();
  return c10::TensorImpl::storage();
}

template <typename VersionCounter>
c10::intrusive_ptr<c10::TensorImpl> FakeTensorImpl::detached_copy(
    VersionCounter&& version_counter, bool allow_tensor_metadata_change) const {
  if (!meta_.defined()) {
    return c10::TensorImpl::shallow_copy_and_detach(std::forward<VersionCounter>(version_counter),
                                                    allow_tensor_metadata_change);
  }
  auto copy = c10::make_intrusive<FakeTensorImpl>(alias_of(meta_), device_);
  copy_tensor_metadata(this, copy.get(), std::forward<VersionCounter>(version_counter),
                       allow_tensor_metadata_change);
  copy->annotation_ = annotation_;
  return copy;
}

c10::intrusive_ptr<c10::TensorImpl> FakeTensorImpl::shallow_copy_and_detach(
    const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const {
  return detached_copy(version_counter, allow_tensor_metadata_change);
}

c10::intrusive_ptr<c10::TensorImpl> FakeTensorImpl::shallow_copy_and_detach(
    c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const {
  return detached_copy(std::move(version_counter), allow_tensor_metadata_change);
}

void FakeTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  copy_tensor_metadata(impl.get(), this, version_counter(), allow_tensor_metadata_change());
  if (const auto* fake = dynamic_cast<const FakeTensorImpl*>(impl.get());
      fake != nullptr && fake->meta_.defined()) {
    meta_ = alias_of(fake->meta_);
    device_ = fake->device_;
    annotation_ = fake->annotation_;
    access_error_written_ = false;
    return;
  }
  // A real tensor's metadata, storage and key set were copied: this tensor is real from now on.
  meta_.reset();
  annotation_.reset();
  device_ = impl->device();
}

bool is_fake(const at::TensorBase& t) noexcept { return fake_impl(t) != nullptr; }

at::Tensor make_fake(at::Tensor meta, c10::Device device) {
  return at::Tensor(c10::make_intrusive<FakeTensorImpl>(std::move(meta), device));
}

c10::Device normalize_fake_device(c10::Device device) {
  TORCH_CHECK(!device.is_meta(),
              "torchdefer: a fake tensor needs a real device type (cpu, cuda, ...), not meta. "
              "Meta tensors already have no storage; create them with device=meta directly.");
  if (device.is_cpu() || device.has_index()) {
    return device;
  }
  // "cuda" is the current device, as for a real tensor (torch.cuda.set_device(rank) before
  // building on "cuda"); asking creates no context. Without CUDA, and for other types, device 0.
  if (device.is_cuda() && at::globalContext().hasCUDA()) {
    return c10::Device(c10::kCUDA, at::detail::getCUDAHooks().current_device());
  }
  return c10::Device(device.type(), 0);
}

std::string describe(const at::TensorBase& t) {
  if (!t.defined()) {
    return "undefined tensor";
  }
  return describe_impl(*t.unsafeGetTensorImpl());
}

}  // namespace torchdefer
