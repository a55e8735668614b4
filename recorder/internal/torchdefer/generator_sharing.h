// Who may use PyTorch's default CPU generator at once: a replay that lends itself the generator is
// refused while another thread records or runs such a replay.
#pragma once

#include <string>

namespace torchdefer::detail {

// Note [Replays that lend themselves the default generator]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A replay (a materialization, a value read) whose random ops draw from the one default CPU
// generator lends itself that generator (GeneratorLoan), sets it before each such op and restores
// it at the end: every random op in torch RNG mode that names no generator of its own, and in
// counter mode the ops with no counter definition (randperm, multinomial), which run on it seeded
// from their stream. Nothing orders two threads' uses of the generator, so while it is lent:
// - a recording open on another thread compares the generator with the state it left before every
//   random op (Note [Noticing a moved generator]), takes a lent state for a move of its own, and
//   places every later random op from it;
// - a second such replay on another thread sets its own states in between the first one's, and
//   each draws from the other's.
// Both give weights that differ from eager's, silently, so the pair is refused at whichever of the
// two starts second, with a message that says what to do. On one thread all of them are fine (a
// value read inside a constructor, a materialization inside it or inside another replay), and so
// is a replay that draws nothing from the default generator, on any thread.

// A RecordingScope opening on this thread (throws if another thread's replay lends itself the
// default generator), and closing.
void enter_recording();
void leave_recording();

// Marks, for its lifetime, a replay on this thread that lends itself the default generator; throws
// if another thread has a RecordingScope open or such a replay running. `first_op` names the
// replay's first op that draws from the generator, for the message; `torch_mode` says whether
// rng="counter" is a way out.
class DefaultGeneratorReplayMark {
 public:
  DefaultGeneratorReplayMark(const std::string& first_op, bool torch_mode);
  ~DefaultGeneratorReplayMark();
  DefaultGeneratorReplayMark(const DefaultGeneratorReplayMark&) = delete;
  DefaultGeneratorReplayMark& operator=(const DefaultGeneratorReplayMark&) = delete;
};

}  // namespace torchdefer::detail
