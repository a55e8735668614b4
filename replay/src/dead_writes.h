// Dead writes: recorded writes that a whole-tensor replay may skip because a later write
// replaces every element they wrote before anything reads them.
#pragma once

#include <torchdefer/op_graph.h>

#include <cstdint>

namespace torchdefer::detail {

// Note [Dead writes]
// ~~~~~~~~~~~~~~~~~~
// Constructors initialize their parameters and models then initialize them again: torch::nn::
// Linear's kaiming_uniform_ is followed by the model's own init (trunc_normal_, normal_), so eager
// construction fills every weight twice and keeps the second fill. Replaying the first fill is
// wasted work. Writer i of a storage is dead when
//   - its op overwrites its first argument and nothing else, reading none of its values (the op
//     table's overwrites_self: the in-place random fills, fill_, zero_, copy_), and it is not the
//     storage's creator (which allocates it);
//   - the storage's next writer, also replayed, is such an op too, reads the storage through no
//     other argument, and writes a dense, non-overlapping view of the same dtype that contains
//     every element writer i wrote;
//   - no node recorded between the two reads the storage (any input of it counts as a read, views
//     included: conservative);
//   - in torch RNG mode, its draws, if any, are placed (known in number): the nodes after it are
//     placed from their own anchors and offsets (Note [Torch-mode draw offsets]), so skipping it
//     moves the generator by its draws with one jump (Note [MT19937 jump-ahead]) when the next
//     random node is placed, as if it had run. A write whose draws are not placed is never
//     skipped, so nothing that torch mode refuses becomes accepted.
// In counter RNG mode every random node's values depend on its own stream alone, so skipping one
// changes no other. Skipped writes are not validated either (a real input they would have read
// may since have changed): what they would have computed is never seen.
bool overwritten_before_read(const OpGraph& graph, const RecordedStorage& storage, size_t writer,
                             int64_t stop_before);

}  // namespace torchdefer::detail
