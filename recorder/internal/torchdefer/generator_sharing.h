// Who may use PyTorch's default CPU generator at once: a replay that lends itself the generator
// waits for another thread's such replay, and is refused beside another thread's recording.
#pragma once

#include <string>

namespace torchdefer::detail {

// Note [Replays that lend themselves the default generator]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A replay (a materialization, a value read) whose random ops draw from the one default CPU
// generator lends itself that generator (GeneratorLoan), sets it before each such op and restores
// it at the end: every random op in torch RNG mode that names no generator of its own, and in
// counter mode the ops with no counter definition (randperm, multinomial), which run on it seeded
// from their stream. Nothing else orders two threads' uses of the generator, so:
// - Two such replays on two threads would each set their states in between the other's and draw
//   from them. The second waits until the first ends, and both give eager's bits: two threads
//   materializing two models at once run their generator-drawing replays one after the other.
// - A recording open on another thread compares the generator with the state it left before every
//   random op (Note [Noticing a moved generator]), would take a lent state for a move of its own,
//   and place every later random op from it. A recording cannot wait (its constructor code runs
//   on, and its random ops interleave with whatever that code does), so the pair is refused at
//   whichever of the two starts second, with a message that says what to do. So is a random op
//   recorded on a returned model's fakes, which is placed from the generator the same way.
// On one thread all of them are fine (a value read inside a constructor, a materialization inside
// it or inside another replay), and a replay that draws nothing from the default generator marks
// nothing and runs beside anything. A replay waiting for another must not be what that one waits
// for: a custom op kernel that blocks on the waiting thread deadlocks.

// A Recording opening on this thread (throws if another thread's replay lends itself the
// default generator), and closing.
void enter_recording();
void leave_recording();
// A Recording that cannot end on its thread (Note [A scope dropped on another thread],
// api/src/extension.cpp): the count of recordings forgets it, so that other threads' replays are
// not refused for good.
void forget_recording_of_another_thread();

// Marks, for its lifetime, the placing of random op `op` recorded on a returned model's fakes (no
// Recording open: an init_weights() after deferred_init), which reads the default generator
// as a recording does; throws if another thread's replay lends itself the generator.
class RandomOpAfterReturnMark {
 public:
  explicit RandomOpAfterReturnMark(const std::string& op);
  ~RandomOpAfterReturnMark();
  RandomOpAfterReturnMark(const RandomOpAfterReturnMark&) = delete;
  RandomOpAfterReturnMark& operator=(const RandomOpAfterReturnMark&) = delete;
};

// Marks, for its lifetime, a replay on this thread that lends itself the default generator: waits
// while another thread runs such a replay, and throws if another thread has a Recording
// open. `first_op` names the replay's first op that may draw from the generator, for the message;
// `counter_is_a_way_out` says whether the replay would draw nothing from it with rng="counter".
class DefaultGeneratorReplayMark {
 public:
  DefaultGeneratorReplayMark(const std::string& first_op, bool counter_is_a_way_out);
  ~DefaultGeneratorReplayMark();
  DefaultGeneratorReplayMark(const DefaultGeneratorReplayMark&) = delete;
  DefaultGeneratorReplayMark& operator=(const DefaultGeneratorReplayMark&) = delete;
};

}  // namespace torchdefer::detail
