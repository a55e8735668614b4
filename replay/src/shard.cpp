#include <torchdefer/shard.h>

#include <c10/core/TensorImpl.h>

#include <torchdefer/replay.h>

#include <algorithm>

namespace torchdefer {
namespace {

// Attached to a tensor materialized as a shard (TensorImpl's BackendMeta slot, which dense CPU
// and CUDA tensors leave empty and shallow copies carry along).
struct ShardMeta final : c10::BackendMeta {
  explicit ShardMeta(ShardInfo info) : info(std::move(info)) {}
  ShardInfo info;
};

}  // namespace

std::vector<int64_t> Box::sizes() const {
  std::vector<int64_t> sizes(start.size());
  for (size_t d = 0; d < start.size(); ++d) {
    sizes[d] = std::max<int64_t>(stop[d] - start[d], 0);
  }
  return sizes;
}

Box whole(c10::IntArrayRef sizes) {
  return Box{std::vector<int64_t>(sizes.size(), 0), sizes.vec()};
}

std::optional<Box> Shard::box_for(c10::IntArrayRef global_sizes) const {
  TORCH_CHECK(world_size > 0 && rank >= 0 && rank < world_size, "torchdefer: Shard{rank=", rank,
              ", world_size=", world_size,
              "} is not a rank of that world; use 0 <= rank < "
              "world_size");
  TORCH_CHECK(dim >= 0, "torchdefer: Shard dim must be >= 0, got ", dim);
  if (dim >= static_cast<int64_t>(global_sizes.size())) {
    return std::nullopt;
  }
  const int64_t size = global_sizes[dim];
  const int64_t chunk = chunk_size(size);
  Box box = whole(global_sizes);
  box.start[dim] = std::min(rank * chunk, size);
  box.stop[dim] = std::min(box.start[dim] + chunk, size);
  return box;
}

std::optional<ShardInfo> shard_info(const at::Tensor& t) {
  if (!t.defined()) {
    return std::nullopt;
  }
  const auto* meta = dynamic_cast<const ShardMeta*>(t.unsafeGetTensorImpl()->get_backend_meta());
  return meta == nullptr ? std::nullopt : std::optional<ShardInfo>(meta->info);
}

namespace detail {

void set_shard_info(const at::Tensor& t, ShardInfo info) {
  t.unsafeGetTensorImpl()->set_backend_meta(c10::make_intrusive<ShardMeta>(std::move(info)));
}

}  // namespace detail
}  // namespace torchdefer
