// The jump that leaves the default CPU generator where eager construction does, made off the
// caller's thread: deferred_init returns while a worker thread, holding the generator's mutex,
// computes it.
#pragma once

#include <ATen/core/MT19937RNGEngine.h>
#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>

namespace torchdefer::detail {

// Note [The jump in the background]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A recording's counted draws reach the default generator as one MT19937 jump when its scope ends
// (Note [Torch-mode draw offsets]); for Llama-70B (~7·10^10 draws) that jump costs ~0.7 ms, about
// as much as all the rest of the recording's overhead over a FakeMode construction. deferred_init
// need not wait for it. Every reader and writer of a CPU generator in PyTorch takes the
// generator's mutex first (Note [Acquire lock when using random generators] in
// ATen/core/Generator.h), and this is what makes the jump safe to finish later:
//  - the CPU kernels lock it around their draws (ATen/native/cpu/DistributionTemplates.h, as
//    installed with LibTorch 2.13: normal_, uniform_, random_, bernoulli_, ...);
//  - torch::manual_seed / at::manual_seed (ATen/Context.h) lock it to reseed;
//  - from Python, torch.get_rng_state / set_rng_state / manual_seed / seed go through
//    torch.Generator's get_state / set_state / manual_seed / seed, which lock it
//    (torch/csrc/Generator.cpp, THPGenerator_getState and its neighbours in PyTorch's source);
//  - torchdefer itself locks it for every read and move (GeneratorLoan, anchors, value reads).
// So jump_default_generator_in_background() hands the jump to a persistent worker thread and
// returns only once that thread holds the generator's mutex; the worker checks that the generator
// is still where the recorder left it (else the draws are moot, as a synchronous jump would have
// found), jumps, sets the state and releases the mutex. Anyone who locks the generator meanwhile,
// on any thread, waits until it is where eager leaves it: nobody can observe it in between. The
// worker's CPU time is still spent, on another core when there is one.
//
// What does not lock: Generator::current_seed() (torch.initial_seed), which a jump does not change,
// and C++ code that calls the default generator's get_state()/engine() without its mutex, against
// PyTorch's rule: such code would see the generator before the jump. DeferredInitOptions::
// exact_generator(true) (exact_generator=True in Python) jumps on the caller's thread before
// deferred_init returns, for such callers.
//
// A process that forks (DataLoader workers) while a jump is pending would give the child a
// generator mutex held by a thread it does not have: the fork waits for the jump first
// (pthread_atfork), and the child starts its own worker when it needs one. At exit, the worker is
// stopped and joined before the default generator is destroyed. A recording that starts while a
// jump is pending does not wait for it (Note [A recording that starts during a jump]).

// Note [A recording that starts during a jump]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Back-to-back deferred_init calls (a script that builds several models, a benchmark) start a
// recording while the previous one's jump is still being made. That recording reads the generator
// three times: its counter seed (a digest of the generator's state, Note [Counter RNG]), the
// anchor its first random op is placed from, and, before every later random op, whether anyone
// moved the generator since (Note [Torch-mode draw offsets]). Each would wait for the jump, and
// a recording of one Linear(4096, 4096) spent four fifths of its time waiting. None of them needs
// to, while the worker holds the generator's mutex: nobody can move the generator then, so its
// state, as anyone who locks it next would read it, is the one the jump leaves, and that is
// known, only not yet computed. So every jump publishes where it leaves the generator (a JumpEnd:
// the full state, read by the worker before it lets go of the mutex), and a recording that starts
// while the worker holds the generator takes that JumpEnd for what it reads:
//  - the counter seed is the digest of the JumpEnd's state, computed when a counter-mode replay
//    first asks for it;
//  - the first random op's anchor is the JumpEnd's state, read when a torch-mode replay or a value
//    read first needs it;
//  - "nobody moved it since" holds without a look for as long as the worker still holds the
//    generator for that jump (JumpEnd::held(), one atomic load);
//  - the recording's own draws are handed to the worker as a jump that follows the pending one
//    without letting go of the mutex in between, so that deferred_init returns without waiting
//    either (the caller waits only when a second jump is already queued).
// Anything else (a draw the recorder does not place, an exact_generator, a chain that ends owing
// the generator) reads the JumpEnd's state, waiting for the jump, and goes on as before. Seeds,
// anchors and the generator's final state are bitwise the ones the recording would have read by
// waiting: it reads the same state, only later.

// Where a jump handed to the worker leaves the default CPU generator.
class JumpEnd {
 public:
  JumpEnd() : ready_(made_.get_future().share()) {}

  // The generator's full state (get_state()) and its engine right after the jump; they wait for
  // it, which the worker makes before it lets go of the generator.
  const at::Tensor& state() const {
    ready_.wait();
    return state_;
  }
  const at::mt19937_data_pod& engine() const {
    ready_.wait();
    return engine_;
  }

  // Whether the worker still holds the generator's mutex for this jump, with no other jump
  // queued after it: nobody has moved the generator since this jump was handed over, or can.
  bool held() const;

  // Called once by the worker when it made the jump, holding the generator's mutex.
  void publish(at::Tensor state, const at::mt19937_data_pod& engine);

 private:
  std::promise<void> made_;
  std::shared_future<void> ready_;
  at::Tensor state_;
  at::mt19937_data_pod engine_{};
};

// Moves the default CPU generator `draws` words along, as mt19937_discard() would, if it is still
// `from`; on a worker thread that holds the generator's mutex from before this returns until the
// generator is moved. Jumps here, on the caller's thread, if no worker can be started.
void jump_default_generator_in_background(const at::mt19937_data_pod& from, uint64_t draws);

// Moves the default CPU generator `draws` words along from where the jump `after` leaves it: on
// the worker, right after that jump if the worker still holds the generator for it, else from
// its state if the generator is still there.
void jump_default_generator_in_background(const std::shared_ptr<const JumpEnd>& after,
                                          uint64_t draws);

// The jump the worker holds the default generator for now, if it does (JumpEnd::held()).
std::shared_ptr<const JumpEnd> held_jump();

}  // namespace torchdefer::detail
