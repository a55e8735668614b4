// Torch RNG mode at record time: where each random op's draws start on PyTorch's default CPU
// generator, and keeping that generator where eager construction would have left it.
#pragma once

#include <torchdefer/op_graph.h>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <future>
#include <memory>
#include <optional>

namespace torchdefer::detail {

// Note [Torch-mode draw offsets]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Eager construction draws each random op's numbers from the default CPU generator in program
// order. To replay any subset of a recording in any order bit-exactly, each random node records
// where its draws start: `offset` 32-bit draws after an *anchor*, a full generator state saved
// in the graph. How many draws an op takes is a property of PyTorch's CPU kernels, per op and
// dtype; the op table's DrawRule column (core/src/op_table.cpp) says which rule each op follows:
// uniform_ takes one per element (two for float64), normal_ on a contiguous tensor of 16 or more
// elements takes one per element plus a block of 16 when the size is not a multiple of 16 (two
// per element for float64), random_ one or two by range, bernoulli with a tensor of probabilities
// one per element, two when the probabilities are float64 (tests compare each rule with eager).
// Kernels whose draws depend on more than the tensor's shape (normal_ below 16 elements or
// non-contiguous, which caches a Box–Muller sample in the generator; log_normal_; scalar-p
// bernoulli_ and exponential_, which seed MKL on some CPUs; multinomial and the dropouts, built
// on those) and every random op the table does not list are run for real at record time, on
// scratch CPU tensors of the same geometry filled with ones, and their node is anchored at the
// state before. Kernels whose draws depend on the values they draw (DrawRule::kValueDependent:
// the rejection samplers torchdefer::trunc_normal_, poisson, _standard_gamma, binomial,
// _sample_dirichlet) are never run at record time when they read no fake but the tensor they
// fill: each is placed where its draws start, and the chain continues from a lazy anchor after it
// (Note [Lazy RNG anchors]); so is a shape-only scratch kernel that follows such an anchor, since
// the generator cannot be where eager has it then anyway. Ops whose draw counts depend on their
// inputs' values (rrelu, randint with tensor bounds, and the rejection samplers above applied to
// fakes: gamma of recorded concentrations) run on scratch copies of those values, read as Note
// [Reading values while recording] reads them, after a lazy anchor before them is resolved; where
// values cannot be read (a fake of another recording, or after deferred_init returned) recording
// refuses the op, since the generator could not be left where eager leaves it. Every random op
// recorded on the default generator thus moves it exactly as eager does, or owes that move (Note
// [The generator after deferred_init]), whether or not its output is ever used.
//
// The generator itself is advanced lazily: draws accumulate and are applied with one jump
// (Note [MT19937 jump-ahead]) when the recording scope ends and before any unrecorded random op;
// so a 70B recording costs one jump, not one per parameter. The one at scope end is made on a
// worker thread while deferred_init returns (Note [The jump in the background]). A chain that
// continues from a lazy anchor cannot be applied; it ends as the owed generator (Note [The
// generator after deferred_init]). Anyone who touches the generator between two recorded random ops
// (torch::manual_seed in a constructor) is noticed by comparing its state with the one the
// recorder left, and the chain starts a new anchor.
struct DrawPlan {
  enum class Kind { kKnown, kRunOnScratch, kRunOnScratchWithValues, kValueDependent };
  Kind kind = Kind::kRunOnScratch;
  uint64_t draws = 0;
};

// Note [Explicit generators]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A random op given its own CPU torch.Generator (PEFT's VeRA draws its shared projections from
// torch.Generator().manual_seed(key); trainers pass one to every init) draws from that generator
// in eager, not from the default one. Recording places the op on that generator: at its state now
// (an anchor of the op's own, offset 0), or, for a generator the recorder follows, where its
// followed chain is (Note [Followed generators] in recorder/internal/torchdefer/
// followed_generator.h). It then moves the generator exactly as the eager kernel would: by the
// op's counted draws (one MT19937 jump, Note [MT19937 jump-ahead]); a value-dependent sampler that
// can be resolved from its recorded arguments (trunc_normal_) on a followed generator leaves the
// generator owing it, paid the first time anything reads the generator, and so does a shape-only
// scratch kernel on a followed chain; everything else (the kernels of Note [Torch-mode draw
// offsets] that run on scratch, the samplers that read their fake arguments' values, and every
// sampler on a generator that is not followed: a C++ program's, or one under exact_generator)
// runs on scratch with that generator at once, so that the generator is where eager leaves it as
// soon as the op is recorded. A generator nothing follows cannot be owed: its state can be read
// at any moment, and an owed one would answer a state eager never had. Torch-mode replay runs the
// op with a private generator set to the anchor, never the user's, so materializing moves no
// generator; counter mode keys the op by its place on the generator (Note [Counter keys of
// explicit generators] in replay/src/recorded_ops.h), and an op with no counter distribution
// draws from a private generator seeded from that key. A generator of another device is refused
// when recording, since its state could not be left where eager leaves it.

// How `node` of `graph` draws (its op table DrawRule applied to this call); `target` is the tensor
// it fills (its written argument, or its output for factories).
DrawPlan plan_draws(const OpGraph& graph, const RecordedNode& node, const at::Tensor& target);

// Places `node`, about to be added to `graph` (already run on fakes; `tensors` are the tensors it
// was called with, in input order), on the current thread's generator chain and advances the chain
// by its draws; runs it on scratch first when the plan says so, or places a lazy anchor after it
// when its draws depend on values. Call without holding the graph's lock. `tensors` is taken by
// reference: by value it takes two argument registers, x86-64 then passes the seventh argument on
// the stack, and the recorder's caller kept a frame pointer, ~34 instructions more per recorded
// call (callgrind).
RecordedDraws place_random_node(const std::shared_ptr<OpGraph>& graph, const RecordedNode& node,
                                const at::Tensor& target, const c10::ArrayRef<at::Tensor>& tensors,
                                bool in_recording_scope);

// A 64-bit digest (FNV-1a) of the default CPU generator's full state: the counter RNG seed of a
// recording, so that re-seeding and recording the same program gives the same recording. Computed
// when first asked for if a jump is being made (Note [A recording that starts during a jump]).
std::shared_future<uint64_t> default_generator_digest();

// Applies pending draws to the default generator, or leaves it owed when they follow a lazy
// anchor, and forgets the chain: the recording scope ends.
void settle_generator();

// settle_generator(), then resolves and pays an owed generator: an unrecorded random op is about
// to draw, or the recording asked for an exact generator.
void settle_generator_exactly();

}  // namespace torchdefer::detail
