// Region replay: computing only the part of a recorded tensor that one rank holds.
#pragma once

#include <torchdefer/materialize.h>
#include <torchdefer/op_graph.h>
#include <torchdefer/shard.h>

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace torchdefer::detail {

// Note [Region replay]
// ~~~~~~~~~~~~~~~~~~~~
// To materialize box B of a recorded value, walk back through the ops that produced it and ask
// each for the region of its inputs it needs:
//  * a value is a view of its storage's base; a "box view" (any mix of narrow, slice with step 1,
//    select, t, transpose, permute, unsqueeze, view of contiguous data that keeps the layout)
//    maps B to a box of the base, and a write through a box view touches the intersection of its
//    box with the region being computed;
//  * factories (zeros, ones, full, empty and their _like/new_ forms) and counter-RNG random ops
//    produce just the region: a random op's element index is its row-major index in its own
//    output shape, which the box view maps (Note [Counter RNG]);
//  * pointwise ops (ATen's `pointwise` tag, casts, clone) map a region to the same region of
//    inputs of the same shape; 0-dim inputs are taken whole;
//  * copy_ maps its destination's region to the same region of its source; fill_ and zero_
//    write any region alone.
// Anything else (linalg_qr inside orthogonal_, reductions, matmul, randperm, broadcasting, views
// with odd geometry, torch-mode random ops, which draw sequentially) makes the caller fall back:
// materialize the tensor whole, then slice. That is always correct; why() names the op, for the
// per-parameter stats.
class RegionReplay {
 public:
  RegionReplay(const OpGraph& graph, const MaterializeOptions& options);

  // The values of recorded value `value` inside `box` (in the value's own index space), computed
  // from that region alone; nullopt when some op on the way has no region rule.
  std::optional<at::Tensor> local(int64_t value, const Box& box);

  // Why the last local() returned nullopt.
  const std::string& why() const { return why_; }

  // Bytes of the tensors this replay allocated, region results and intermediates.
  int64_t bytes_computed() const { return bytes_computed_; }

 private:
  std::optional<at::Tensor> storage_region(int64_t storage, const Box& region);
  std::optional<at::Tensor> created(int64_t node, const RecordedValue& base, const Box& region);
  bool apply_write(int64_t node, const RecordedValue& base, const Box& region, at::Tensor& local);
  std::optional<at::Tensor> input_region(const RecordedInput& input, c10::IntArrayRef output_sizes,
                                         const Box& region);
  c10::Device device_of(const RecordedValue& value) const;
  at::Tensor allocate(const Box& region, const RecordedValue& like);
  bool fail(std::string why);

  const OpGraph& graph_;
  const MaterializeOptions& options_;
  uint64_t seed_;
  std::string why_;
  int64_t bytes_computed_ = 0;
};

}  // namespace torchdefer::detail
