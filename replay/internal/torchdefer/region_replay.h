// Region replay: computing only the part of a recorded tensor that one rank holds.
#pragma once

#include <torchdefer/op_graph.h>
#include <torchdefer/shard.h>

#include <torchdefer/replay.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torchdefer::detail {

// Note [Region replay]
// ~~~~~~~~~~~~~~~~~~~~
// To materialize box B of a recorded value, walk back through the ops that produced it and ask
// each for the region of its inputs it needs:
//  * a value is a view of its storage's base; a "box view" (any mix of narrow, slice with step 1,
//    select, t, transpose, permute, unsqueeze, view of contiguous data that keeps the layout)
//    maps B to a box of the base, and a write through a box view touches the intersection of its
//    box with the region being computed, or nothing (Note [Views that miss the region]);
//  * factories (zeros, ones, full, empty and their _like/new_ forms) and counter-RNG random ops
//    produce just the region: a random op's element index is its row-major index in its own
//    output shape, which the box view maps (Note [Counter RNG]);
//  * pointwise ops on Note [Region-exact pointwise ops]'s list (arithmetic, casts, clone, copy_,
//    fill_) map a region to the same region of each input; an input that broadcasts is read over
//    the box broadcasting maps the region to (a size-1 dimension whole, a 0-dim input whole);
//  * cat and stack map a region to the part of each input it meets (Note [Region rules for cat
//    and stack]).
// An input that none of these rules reaches (linalg_qr inside orthogonal_, a reduction, matmul,
// randperm, arange, a view with odd geometry, a torch-mode random op, which draws sequentially) is
// computed whole by the ordinary replay and sliced: only that input costs its full size, and
// whole_inputs() names the op for the per-parameter stats. When the requested value itself has
// no rule, local() returns nullopt and why() names the op; the caller computes it whole and
// slices. Either way the result has the bits of the full materialization.
//
// Note [Reading a value as it was]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A node reads its inputs as they were when it ran: `p[:, 1].copy_(p[:, 1] * 3)` reads p before
// the copy_ writes it. The ordinary replay gets this for free by running nodes in record order;
// region replay walks backwards, so every read carries the index of the node that reads, and a
// storage's region is rebuilt from its creator and only the writes recorded before that index
// (an input computed whole stops its replay there too). Without it, the copy_ above would ask for
// p's region including the copy_ itself, forever.
class RegionReplay {
 public:
  RegionReplay(std::shared_ptr<OpGraph> graph, ReplayConfig config);

  // The values of recorded value `value` inside `box` (in the value's own index space), computed
  // from that region, with inputs that have no region rule computed whole; nullopt when the ops
  // that write `value`'s own storage have none.
  std::optional<at::Tensor> local(int64_t value, const Box& box);

  // Why the last local() returned nullopt.
  const std::string& why() const { return why_; }

  // The ops that made local() compute some input whole, each once, in the order met.
  const std::vector<std::string>& whole_inputs() const { return whole_inputs_; }

  // Bytes of the tensors this replay allocated, region results and intermediates.
  int64_t bytes_computed() const { return bytes_computed_; }

 private:
  // Note [Reading a value as it was]: `before` is the index of the node reading the value; only
  // writes recorded before it count.
  std::optional<at::Tensor> local_before(int64_t value, const Box& box, int64_t before);
  std::optional<at::Tensor> storage_region(int64_t storage, const Box& region, int64_t before);
  std::optional<at::Tensor> created(int64_t node, const RecordedValue& base, const Box& region);
  std::optional<at::Tensor> joined(const RecordedNode& node, int64_t index,
                                   const RecordedValue& base, const Box& region);
  bool apply_write(int64_t node, const RecordedValue& base, const Box& region, at::Tensor& local);
  at::Tensor local_or_whole(int64_t value, const Box& box, int64_t before);
  at::Tensor whole_then_sliced(int64_t value, const Box& box, int64_t before);
  at::Tensor compute_whole(int64_t value, int64_t before);
  std::optional<at::Tensor> input_region(const RecordedInput& input, c10::IntArrayRef output_sizes,
                                         const Box& region, int64_t reader);
  // Refuses a real input modified in place since `reader` recorded it, as the full replay does.
  void check_unchanged(const RecordedInput& input, int64_t reader) const;
  c10::Device device_of(const RecordedValue& value) const;
  at::Tensor allocate(const Box& region, const RecordedValue& like);
  bool fail(std::string why);

  std::shared_ptr<OpGraph> graph_;
  ReplayConfig config_;
  uint64_t seed_;
  std::string why_;
  std::vector<std::string> whole_inputs_;
  int64_t bytes_computed_ = 0;
};

// The view of `t` that is `box` of it.
at::Tensor slice(const at::Tensor& t, const Box& box);

}  // namespace torchdefer::detail
