// The one place where torchdefer meets the parts of LibTorch that differ between the versions it
// supports (2.11 on the GPU machines, 2.13 here); everything else is written against this header.
#pragma once

#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/headeronly/version.h>

namespace torchdefer {

// Note [Dispatch keys]
// ~~~~~~~~~~~~~~~~~~~~
// torchdefer needs three dispatcher keys that core PyTorch does not use itself:
//
//  * kFakeKey sits *below* autograd and ADInplaceOrView (LibTorch's `Fake`, next to `Python`).
//    Every fake tensor carries it, so autograd, view tracking and version counters run on fakes
//    exactly as on real tensors, and only the computation itself is replaced by its meta-device
//    shadow (see Note [Fake tensors are meta shadows with a device]).
//  * kDeferredInitKey sits *above* autograd (LibTorch's `DeferredInit`, reserved for deferred
//    module initialization). The recorder uses it to see a composite operator before its
//    decomposition; every other op it records at kFakeKey, where the call is the same and seeing
//    it costs less (Note [Where an op is recorded], recorder/src/recording.cpp).
//  * kFollowedGeneratorKey sits above the dense, quantized and other plain backends and below
//    MkldnnCPU, Sparse, SparseCsr, NestedTensor and BackendSelect (LibTorch's `CustomRNGKeyId`,
//    which PyTorch keeps for generators of its own kind and uses only in its tests). No tensor
//    carries it: a generator the recorder follows puts it in its own key set, so that every op
//    given that generator passes torchdefer before a kernel draws from it (Note [Followed
//    generators], recorder/internal/torchdefer/followed_generator.h).
//
// All three keys exist in every LibTorch 2.x the project supports; CMake checks that at configure
// time (cmake/TorchdeferDispatchKeys.cmake), so a LibTorch that dropped one fails the build with a
// message instead of failing here. PyTorch 2.13 gives `Fake` to its own nascent C++ FakeTensor
// mode (TensorImpl::is_fake(), set_fake_device()) but registers no kernel or fallback for it;
// torchdefer registers the fallback. No other file names these keys.
inline constexpr c10::DispatchKey kFakeKey = c10::DispatchKey::Fake;
inline constexpr c10::DispatchKey kDeferredInitKey = c10::DispatchKey::DeferredInit;
inline constexpr c10::DispatchKey kFollowedGeneratorKey = c10::DispatchKey::CustomRNGKeyId;

// Note [Draw counts by LibTorch version]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// One CPU draw count differs between the supported versions (every random op, dtype and size of
// the op-table tests was compared on both): normal_ of 16 or more contiguous float16/bfloat16
// elements takes as many draws as float32 in 2.11 (n, plus a block of 16 when n is not a multiple
// of 16) and only the 16-aligned prefix plus one block of 16 in 2.13. Versions measured on neither
// run that op on scratch at record time, which is exact whatever the kernel does.
enum class ReducedFloatNormalDraws { kAsFloat32, kAlignedPrefix, kUnmeasured };
inline constexpr ReducedFloatNormalDraws kReducedFloatNormalDraws =
    TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR == 11 ? ReducedFloatNormalDraws::kAsFloat32
    : TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR == 13
        ? ReducedFloatNormalDraws::kAlignedPrefix
        : ReducedFloatNormalDraws::kUnmeasured;

// While alive, ops dispatch as if neither key existed: real tensors, nothing faked or recorded
// (replaying, reading values, running an op for real at record time).
class RealOnlyGuard {
 public:
  RealOnlyGuard() = default;
  RealOnlyGuard(const RealOnlyGuard&) = delete;
  RealOnlyGuard& operator=(const RealOnlyGuard&) = delete;

 private:
  c10::impl::ExcludeDispatchKeyGuard guard_{c10::DispatchKeySet(kFakeKey) |
                                            c10::DispatchKeySet(kDeferredInitKey)};
};

// While alive, no Python dispatch mode the caller has active (a TorchDispatchMode, a
// FakeTensorMode, the pre-dispatch tracer) sees the ops run or computes them instead: torchdefer's
// own runs that resolve where a generator stands, which are not the user's program.
class NoPythonModesGuard {
 public:
  NoPythonModesGuard() = default;
  NoPythonModesGuard(const NoPythonModesGuard&) = delete;
  NoPythonModesGuard& operator=(const NoPythonModesGuard&) = delete;

 private:
  c10::impl::ExcludeDispatchKeyGuard guard_{
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                           c10::DispatchKey::PreDispatch})};
};

}  // namespace torchdefer
