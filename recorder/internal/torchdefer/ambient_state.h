// The ambient state an operator reads besides its arguments, as the recorder saw it, and a guard
// that puts it back while a recorded op replays.
#pragma once

#include <c10/core/DefaultDtype.h>
#include <c10/core/DeviceType.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/ScalarType.h>
#include <c10/core/ScalarTypeToTypeMeta.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <array>
#include <optional>

namespace torchdefer {

// Note [Ambient state is part of the recording]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An op's result depends on its arguments and on process state the call does not name. Three
// pieces of that state change what construction computes, and each is made part of the recording:
//
//  * The default dtype (torch.set_default_dtype; what from_config(cfg, dtype=torch.bfloat16)
//    sets while the model is built). Factories without a dtype read it (empty, zeros, rand,
//    full with a float, arange with float bounds), and so does type promotion: an integer tensor
//    divided by an integer, or times a Python float, or sqrt of it, is of the default dtype. Only
//    some of those calls have a dtype argument that could be filled in, so instead every node
//    records the default dtype it ran under (RecordedNode::ambient), and replay runs it under that
//    dtype again (AmbientStateGuard). The guard sets the process-wide default only around a node
//    recorded under a different one, so a recording made and replayed under the same default (the
//    common case) never touches it; torch's default dtype is one per process, and a thread that
//    reads it while another thread replays such a node sees the recorded one for that long.
//  * The default device (torch.set_default_device, `with torch.device(...)`): torch's Python
//    factories pass it to the dispatcher as an explicit `device=` argument, and C++ factories
//    have none, so the recorded arguments already carry it.
//  * Grad mode: it decides requires_grad and grad_fn of results, never values. Autograd runs
//    above the fakes while recording (Note [Dispatch keys]), so each fake already has what eager
//    would have given its tensor, and materialization keeps the TensorImpl's autograd metadata;
//    replay itself runs without grad.
//  * Autocast (torch.autocast): the recorder sees most calls below autocast's kernels, with their
//    inputs already cast (Note [Composite ops under autocast] in recording.cpp), but a kernel
//    below may dispatch further ops that autocast casts in eager: _trilinear, which F.bilinear
//    calls, runs its products through bmm, in bfloat16 under CPU autocast. So a node recorded
//    while autocast was on records for which device types and dtypes, and replays under the same.
//    Replaying an op whose inputs autocast already cast under autocast again casts nothing more.
//    Autocast on for more than two device types at once is refused while recording.

// One device type autocast was on for, and the dtype it cast to.
struct AutocastOn {
  c10::DeviceType device_type = c10::DeviceType::CPU;
  c10::ScalarType dtype = c10::ScalarType::Undefined;  // Undefined: this slot is unused
};

// Whether autocast is on for any device type on this thread. Autocast's keys come with the
// tensors, and TLS excludes them unless autocast is on.
inline bool autocast_on_now() {
  return !(c10::autocast_dispatch_keyset - c10::impl::tls_local_dispatch_key_set().excluded_)
              .empty();
}

struct AmbientState {
  c10::ScalarType default_dtype = c10::ScalarType::Float;
  std::array<AutocastOn, 2> autocast{};

  // The state now, on this thread.
  static AmbientState current() {
    AmbientState state{c10::typeMetaToScalarType(c10::get_default_dtype())};
    if (autocast_on_now()) {
      state.autocast = current_autocast();
    }
    return state;
  }

 private:
  static std::array<AutocastOn, 2> current_autocast();
};

// Empties autocast's cache of casts of leaf tensors. Autocast keeps, for the rest of its region,
// the cast of every parameter it casts; a recording leaves fakes there, which a forward pass in
// the same region would use after materialization (the cast of a fake parameter, not of its now
// real values). A recording that ends under autocast therefore empties the cache; eager's casts
// are only recomputed.
void forget_autocast_casts();

// While alive, autocast is on for exactly the device types `recorded` lists, with their dtypes;
// every device type's autocast flag and dtype are put back as they were when it ends.
class AutocastGuard {
 public:
  explicit AutocastGuard(const std::array<AutocastOn, 2>& recorded);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  struct Saved {
    bool enabled = false;
    c10::ScalarType dtype = c10::ScalarType::Undefined;
  };
  std::array<Saved, 9> saved_{};  // per device type of kAutocastDeviceTypes (ambient_state.cpp)
};

// Runs a recorded op under the ambient state it was recorded with, and restores the state after.
class AmbientStateGuard {
 public:
  explicit AmbientStateGuard(const AmbientState& recorded)
      : saved_dtype_(c10::typeMetaToScalarType(c10::get_default_dtype())),
        dtype_changed_(recorded.default_dtype != saved_dtype_) {
    if (dtype_changed_) {
      c10::set_default_dtype(c10::scalarTypeToTypeMeta(recorded.default_dtype));
    }
    if (recorded.autocast[0].dtype != c10::ScalarType::Undefined || autocast_on_now()) {
      autocast_.emplace(recorded.autocast);
    }
  }
  ~AmbientStateGuard() {
    autocast_.reset();
    if (dtype_changed_) {
      c10::set_default_dtype(c10::scalarTypeToTypeMeta(saved_dtype_));
    }
  }
  AmbientStateGuard(const AmbientStateGuard&) = delete;
  AmbientStateGuard& operator=(const AmbientStateGuard&) = delete;

 private:
  c10::ScalarType saved_dtype_;
  bool dtype_changed_;
  std::optional<AutocastGuard> autocast_;
};

}  // namespace torchdefer
