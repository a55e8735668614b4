// The jump that leaves the default CPU generator where eager construction does, made off the
// caller's thread: deferred_init returns while a worker thread, holding the generator's mutex,
// computes it.
#pragma once

#include <ATen/core/MT19937RNGEngine.h>

#include <cstdint>

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
// jump is pending waits for it when it first reads the generator (its counter seed is a digest of
// the generator's state, Note [Counter RNG]).

// Moves the default CPU generator `draws` words along, as mt19937_discard() would, if it is still
// `from`; on a worker thread that holds the generator's mutex from before this returns until the
// generator is moved. Jumps here, on the caller's thread, if no worker can be started.
void jump_default_generator_in_background(const at::mt19937_data_pod& from, uint64_t draws);

// Waits until no jump is pending: the default generator is where the last one leaves it.
void wait_for_background_jump();

}  // namespace torchdefer::detail
