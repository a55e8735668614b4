// Torch-mode random fills computed in parts on every intra-op thread, each part from a copy of
// the generator jumped to where that part's draws start, with eager's bits.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>

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

// Runs random op `op`, called with `stack` (its arguments, in schema order), in parts when Note
// [Torch-mode fills in parts] allows it, with the default CPU generator standing where the op's
// `draws` start; then `stack` holds the op's result, the generator stands after the draws, and
// the result is true. Returns false, having touched nothing, when the op must run whole. `parts`
// caps the number of parts (0: the number of intra-op threads).
bool run_fill_in_parts(const c10::OperatorHandle& op, torch::jit::Stack& stack, uint64_t draws,
                       int64_t parts = 0, int64_t min_part = kMinPartElements);

}  // namespace torchdefer::detail
