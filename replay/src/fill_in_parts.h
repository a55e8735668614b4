// Torch-mode random fills computed in parts on every intra-op thread, each part from a copy of
// the generator jumped to where that part's draws start, with eager's bits.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <vector>

namespace torchdefer::detail {

// Note [Torch-mode fills in parts]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// ATen's CPU kernels for uniform_ and normal_ draw from the generator on one thread, under its
// lock; eager construction spends most of its time there. Replay knows where each fill's draws
// start and how many it takes (Note [Torch-mode draw offsets]), so it can cut the fill into
// contiguous parts, give each part a copy of the generator jumped to its first draw (Note
// [MT19937 jump-ahead]) and run the parts on the intra-op threads at once. That is exact only
// where the element a draw lands in is a function of the draw's position alone, with no state
// carried from one element to the next, so a fill is split only when all of these hold:
//   - it is aten::uniform_ or aten::normal_ on the default CPU generator (no explicit generator),
//     placed (its draw count known), on a contiguous CPU tensor;
//   - uniform_ (float32, float64, float16, bfloat16): one draw per element in memory order (two
//     for float64), through ATen's serial TensorIterator loop;
//   - normal_ (float32, float64 only): ATen's normal fill for 16 or more contiguous elements
//     draws one uniform per element (two for float64), turns each aligned block of 16 into 16
//     normals (Box–Muller on its halves), and, when the size is not a multiple of 16, draws 16
//     more and recomputes the last 16 elements from them. Parts that start at multiples of 16 and
//     hold 16 or more elements reproduce that: every part but the last draws exactly its
//     elements, the last also draws the final block. float16 and bfloat16 draw differently by
//     LibTorch version (Note [Draw counts by LibTorch version]) and the serial path below 16
//     elements or on strided tensors caches a Box–Muller sample between elements: those run
//     whole;
//   - the parts' draws add up to the count recorded for the op; otherwise the kernel is not the
//     one this Note describes, and the op runs whole.
// After the parts ran, the default generator takes the last part's engine, which stands where
// the whole op would have left it. Parts hold at least kMinPartElements elements: below that the
// jump (a fraction of a millisecond) costs about what the part saves. The FillInParts tests
// compare split fills with whole ones bitwise, output and generator, for each dtype, sizes around
// every block boundary, offset views and part counts above the thread count.
constexpr int64_t kMinPartElements = int64_t{1} << 18;

// An in-place op that runs on each part after the fill: `stack` holds its arguments, the fill's
// tensor first (Note [Pointwise ops after a fill run in its parts]).
struct PartwiseStep {
  c10::OperatorHandle op;
  torch::jit::Stack stack;
};

// Note [Pointwise ops after a fill run in its parts]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Initializers rarely stop at a fill: the C++ trunc_normal_ idiom is uniform_, erfinv_, mul_,
// clamp_ on the same tensor. Each of those is its own parallel region in ATen, and on a machine
// whose cores are shared every region waits for its slowest thread to be scheduled. The in-place
// ops that follow a split fill directly in the replay, on the same view, reading no other tensor
// and on Note [Region-exact pointwise ops]'s list (whose bits on a region are the whole tensor's,
// checked by the shard tests), run inside the fill's parallel region, each thread on its own
// part: one region per tensor instead of one per op, each part still in cache from the fill.
//
// Runs random op `op`, called with `stack` (its arguments, in schema order), in parts when Note
// [Torch-mode fills in parts] allows it, with the default CPU generator standing where the op's
// `draws` start, then `then` on each part in order; then `stack` holds the op's result, the
// generator stands after the draws, and the result is true. Returns false, having touched
// nothing and run none of `then`, when the op must run whole. `parts` caps the number of parts
// (0: the number of intra-op threads).
bool run_fill_in_parts(const c10::OperatorHandle& op, torch::jit::Stack& stack, uint64_t draws,
                       int64_t parts = 0, int64_t min_part = kMinPartElements,
                       const std::vector<PartwiseStep>& then = {});

}  // namespace torchdefer::detail
