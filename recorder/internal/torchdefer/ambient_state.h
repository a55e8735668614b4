// The ambient state an operator reads besides its arguments, as the recorder saw it, and a guard
// that puts it back while a recorded op replays.
#pragma once

#include <c10/core/DefaultDtype.h>
#include <c10/core/ScalarType.h>
#include <c10/core/ScalarTypeToTypeMeta.h>

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
struct AmbientState {
  c10::ScalarType default_dtype = c10::ScalarType::Float;

  // The state now, on this thread.
  static AmbientState current() {
    return AmbientState{c10::typeMetaToScalarType(c10::get_default_dtype())};
  }
};

// Runs a recorded op under the ambient state it was recorded with, and restores the state after.
class AmbientStateGuard {
 public:
  explicit AmbientStateGuard(const AmbientState& recorded)
      : saved_(AmbientState::current()), changed_(recorded.default_dtype != saved_.default_dtype) {
    if (changed_) {
      c10::set_default_dtype(c10::scalarTypeToTypeMeta(recorded.default_dtype));
    }
  }
  ~AmbientStateGuard() {
    if (changed_) {
      c10::set_default_dtype(c10::scalarTypeToTypeMeta(saved_.default_dtype));
    }
  }
  AmbientStateGuard(const AmbientStateGuard&) = delete;
  AmbientStateGuard& operator=(const AmbientStateGuard&) = delete;

 private:
  AmbientState saved_;
  bool changed_;
};

}  // namespace torchdefer
