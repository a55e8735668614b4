// Shards: the region of each parameter's global index space that one rank materializes, and
// what a materialized shard remembers about the tensor it came from.
#pragma once

#include <torchdefer/export.h>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace torchdefer {

// A box in a tensor's index space: [start[d], stop[d]) along every dimension.
struct Box {
  std::vector<int64_t> start;
  std::vector<int64_t> stop;

  TORCHDEFER_API std::vector<int64_t> sizes() const;
  bool operator==(const Box& other) const { return start == other.start && stop == other.stop; }
};

// The whole of a tensor of `sizes`.
TORCHDEFER_API Box whole(c10::IntArrayRef sizes);

// Rank `rank` of `world_size` along `dim`, with torch.chunk semantics: chunks of
// ceil(size / world_size) elements, so trailing ranks may hold fewer or none. With `padded`, the
// local tensor always has the chunk size along `dim`, zero past the end (as FSDP2 pads).
// Tensors with no dimension `dim` (scalars, and 1-D tensors when dim is 1) are replicated.
struct Shard {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t dim = 0;
  bool padded = false;

  // This rank's box of a tensor of `global_sizes`, or nullopt to replicate it.
  TORCHDEFER_API std::optional<Box> box_for(c10::IntArrayRef global_sizes) const;

  // The torch.chunk size of a dimension of `size` elements: ceil(size / world_size).
  int64_t chunk_size(int64_t size) const { return (size + world_size - 1) / world_size; }
};

// A general layout: the box a rank holds of the tensor named `name` (its qualified name in the
// module, "layers.0.attention.wq.weight") of `global_sizes`, or nullopt to replicate it.
using RegionFn =
    std::function<std::optional<Box>(const std::string& name, c10::IntArrayRef global_sizes)>;

// What a tensor materialized as a shard holds.
struct ShardInfo {
  std::vector<int64_t> global_sizes;
  Box box;
  bool padded = false;  // the local tensor extends past box.stop along the sharded dimension
};

// The shard `t` holds, or nullopt if it is not a shard (a whole tensor, or still fake).
TORCHDEFER_API std::optional<ShardInfo> shard_info(const at::Tensor& t);

}  // namespace torchdefer
