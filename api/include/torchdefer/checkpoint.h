// Checkpoints that materialize_module reads parameters and buffers from, initializing from the
// recording only what the checkpoint lacks (docs/checkpoints.md):
//
//   auto model = torchdefer::deferred_init([&] { return Classifier(config); });
//   auto stats = torchdefer::materialize_module(
//       *model, MaterializeOptions().checkpoint(torchdefer::open_safetensors("ckpt/")));
#pragma once

#include <torchdefer/export.h>
#include <torchdefer/shard.h>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace torchdefer {

// What a checkpoint says about one tensor it holds.
struct CheckpointTensor {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
};

// One read of a batch: the elements of `name` inside `box` into `out`, as CheckpointReader::read.
struct CheckpointRead {
  std::string name;
  Box box;
  at::Tensor out;
};

// A source of named tensors that can read any box of any of them. Implementations must be safe
// to read from one thread at a time; materialize_module reads each tensor once, all of a call's
// tensors in one read_all.
class TORCHDEFER_API CheckpointReader {
 public:
  virtual ~CheckpointReader() = default;
  // Every tensor it holds, by name.
  virtual const std::map<std::string, CheckpointTensor>& tensors() const = 0;
  // Writes the elements of `name` inside `box` into `out`: a contiguous tensor of the box's
  // sizes whose dtype the stored one casts to (c10::canCast), on any device. Throws c10::Error
  // naming the tensor and the file when the bytes cannot be read.
  virtual void read(const std::string& name, const Box& box, const at::Tensor& out) const = 0;
  // Performs every read of `reads`, in any order; the default calls read() for each in turn. A
  // reader that reads a batch faster than its parts (DCP plans one load for all of them)
  // overrides it.
  virtual void read_all(const std::vector<CheckpointRead>& reads) const;
};

// A safetensors checkpoint: a `.safetensors` file, a `model.safetensors.index.json` (or the
// directory holding one, as save_pretrained writes it with sharded files), or a directory
// holding a single `model.safetensors`. Reads only headers when opened; read() then fetches
// just the bytes of a box with pread (Note [Reading a box of a safetensors tensor]).
TORCHDEFER_API std::shared_ptr<CheckpointReader> open_safetensors(const std::string& path);

}  // namespace torchdefer
