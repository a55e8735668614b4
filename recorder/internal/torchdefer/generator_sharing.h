// Who may use PyTorch's default CPU generator at once: a recording open on one thread and a
// torch-mode replay on another are refused together.
#pragma once

namespace torchdefer::detail {

// Note [A recording and a torch-mode replay on two threads]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A torch-mode replay (a materialization, a value read) draws from the one default CPU generator:
// it lends itself the generator (GeneratorLoan), sets it to each random node's state and restores
// it at the end. A recording open on another thread at that time compares the generator with the
// state it left before every random op (Note [Noticing a moved generator]), takes a lent state for
// a move of its own, and places every later random op from it: weights that differ from eager's,
// silently. Nothing orders the two threads' uses of the generator, so the pair is refused, at
// whichever of the two starts second, with a message that says what to do. Both on one thread
// (a value read inside the constructor, a materialization inside it) are fine, and so is a
// counter-mode replay, which draws nothing from the default generator.

// A RecordingScope opening on this thread (throws if another thread is in a torch-mode replay),
// and closing.
void enter_recording();
void leave_recording();

// Marks a torch-mode replay running on this thread for its lifetime; throws if another thread
// has a RecordingScope open.
class TorchModeReplayMark {
 public:
  TorchModeReplayMark();
  ~TorchModeReplayMark();
  TorchModeReplayMark(const TorchModeReplayMark&) = delete;
  TorchModeReplayMark& operator=(const TorchModeReplayMark&) = delete;
};

}  // namespace torchdefer::detail
