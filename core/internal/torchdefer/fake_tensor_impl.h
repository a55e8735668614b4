// FakeTensorImpl is the TensorImpl behind every fake tensor. The recorder and the replay engine
// use it to find a fake's storage identity and, at materialization, to turn it real in place.
#pragma once

#include <torchdefer/torch_compat.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/TensorImpl.h>

#include <atomic>
#include <memory>
#include <typeinfo>

namespace torchdefer {

// Note [Fake tensors are meta shadows with a device]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A fake tensor is a FakeTensorImpl that owns a *meta-device shadow*: an ordinary meta tensor
// with the fake's sizes, strides, storage offset and dtype. The fake itself reports the device the
// user asked for (cuda:0 on a machine with no GPU is fine: nothing ever asks the driver) and
// carries kFakeKey, so every op on it reaches the Fake fallback (fake_fallback.cpp) after
// autograd and ADInplaceOrView have run on the fake as on any tensor. The fallback swaps each
// fake for its shadow, runs the op's meta kernel, and wraps each new meta output as a fake.
//
// The shadow is what makes aliasing real. A view of a fake is computed as the same view of the
// shadow, so the two shadows share one meta StorageImpl; that StorageImpl *is* the storage
// identity of the fake (storage_identity()). In-place writes through a view land on the same
// identity as writes to the base, which is what the recorder's write histories key on.
//
// The fake's own `storage_` stays empty, and storage/data access throws a message that names the
// tensor (TensorImpl's custom error-message hook, Note [The access error of a fake]). A
// FakeTensorImpl can turn real in place:
// shallow_copy_from() a real TensorImpl takes over that tensor's storage, drops kFakeKey and the
// shadow, and from then on this object behaves exactly like a plain TensorImpl, so every
// at::Tensor and module member that holds it sees the real tensor.
// What a layer above core attaches to a fake (the recorder: which recorded value it is). Core
// only stores it, copies it along with detached copies and set_data(), and drops it when the fake
// turns real; it never looks inside.
class FakeAnnotation {
 public:
  virtual ~FakeAnnotation() = default;
};

class FakeTensorImpl final : public c10::TensorImpl {
 public:
  // `meta` must be a tensor on the meta device; `device` is the device the fake reports.
  FakeTensorImpl(at::Tensor meta, c10::Device device);

  // The meta shadow (undefined once this tensor turned real).
  const at::Tensor& meta() const { return meta_; }

  // Two fakes alias exactly when their storage identities are equal.
  const c10::StorageImpl* storage_identity() const;

  // The meta storage behind storage_identity(), for holders that must keep the identity unique
  // while they remember it.
  c10::Storage meta_storage() const { return meta_.storage(); }

  const std::shared_ptr<const FakeAnnotation>& annotation() const { return annotation_; }
  void set_annotation(std::shared_ptr<const FakeAnnotation> annotation) {
    annotation_ = std::move(annotation);
  }

  // Adds `key` to this fake's dispatch key set, so that ops on it reach that key's kernel (the
  // recorder adds kDeferredInitKey to every fake it records).
  void include_dispatch_key(c10::DispatchKey key) { key_set_ = key_set_.add(key); }

  // Re-reads sizes, strides and offset from the shadow after an op changed it in place
  // (resize_, set_, as_strided_, ...).
  void sync_from_meta();

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      const c10::VariableVersion& version_counter,
      bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

  // Turns this fake real with `real`'s storage, as shallow_copy_from() does, and remembers that a
  // materialization did it: a fake that user code turned real while recording (`p.data = t` with
  // a real `t`) is a real tensor of the model like any other, which a sharded materialization
  // slices; one that a materialization turned real is left as it is (Note [Nested
  // materialization], api/src/materialize.cpp).
  void materialize(const c10::intrusive_ptr<c10::TensorImpl>& real) {
    shallow_copy_from(real);
    materialized_ = true;
  }
  bool materialized() const { return materialized_; }

  // Where a data or storage access of a fake fails: they write the message first (Note [The
  // access error of a fake]).
  bool has_storage() const override;
  const c10::Storage& storage() const override;

 protected:
  const char* tensorimpl_type_name() const override { return "torchdefer::FakeTensorImpl"; }

 private:
  template <typename VersionCounter>
  c10::intrusive_ptr<c10::TensorImpl> detached_copy(VersionCounter&& version_counter,
                                                    bool allow_tensor_metadata_change) const;
  void write_access_error() const;

  at::Tensor meta_;
  c10::Device device_;
  std::shared_ptr<const FakeAnnotation> annotation_;
  // Whether TensorImpl's custom error messages describe this fake as it is now.
  mutable std::atomic<bool> access_error_written_{false};
  bool materialized_ = false;
};

// The FakeTensorImpl behind `t`, or nullptr if `t` is not a fake. Inline: the recorder asks it
// several times per recorded call.
inline FakeTensorImpl* fake_impl(const at::TensorBase& t) noexcept {
  if (!t.defined() || !t.key_set().has(kFakeKey)) {
    return nullptr;
  }
  // A tensor can carry kFakeKey without being a fake (has_fake_metadata_only). FakeTensorImpl is
  // final, so its exact type decides, which costs a pointer comparison where a dynamic_cast walks
  // the class hierarchy.
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return typeid(*impl) == typeid(FakeTensorImpl) ? static_cast<FakeTensorImpl*>(impl) : nullptr;
}

// Wraps a meta tensor as a fake tensor that reports `device` (see the Note above).
at::Tensor make_fake(at::Tensor meta, c10::Device device);

// `device` as a fake reports it: CUDA and other accelerators without an index get index 0.
c10::Device normalize_fake_device(c10::Device device);

}  // namespace torchdefer
