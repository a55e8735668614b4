// Materialization: turning the fakes deferred_init recorded into real tensors, in place, by
// replaying what construction did, on the device of your choice.
//
//   auto model = torchdefer::deferred_init([&] { return Llama(config); });
//   torchdefer::materialize_module(*model);                               // whole model, CPU
//   torchdefer::materialize_module(*model->layers[3], MaterializeOptions().device(at::kCUDA));
//
// Checkpoints that materialize_module reads parameters and buffers from, initializing from the
// recording only what the checkpoint lacks (docs/checkpoints.md):
//
//   auto model = torchdefer::deferred_init([&] { return Classifier(config); });
//   auto stats = torchdefer::materialize_module(
//       *model, MaterializeOptions().checkpoint(torchdefer::open_safetensors("ckpt/")));
#pragma once

#include <torchdefer/deferred_init.h>
#include <torchdefer/export.h>
#include <torchdefer/shard.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}  // namespace torch::nn

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

// How random ops are replayed.
enum class RngMode {
  // On PyTorch's own default generator, from the state it had when each op ran at record time:
  // materializing gives bit-for-bit the values eager construction with the same seed gives on
  // the CPU, in any order and for any subset (Note [Torch-mode draw offsets]).
  kTorch,
  // Every element a pure function of (seed, the op's index in its recording, the element's
  // index): any slice of any tensor is generated alone with the full tensor's bits, so shards of
  // any world size agree (Note [Counter RNG]). Not eager's values.
  kCounter,
};

// What materialize_module did with one tensor.
struct TensorStats {
  std::string name;  // qualified name in the module
  std::vector<int64_t> global_sizes;
  std::optional<Box> box;       // the shard it holds; nullopt for the whole tensor
  bool sliced = false;          // its box was computed from regions (Note [Region replay])
  std::string fallback;         // the op(s) that made the whole tensor, or an input, be computed
                                // whole ("" when nothing was)
  int64_t bytes_computed = 0;   // bytes allocated to produce it
  int64_t bytes_kept = 0;       // bytes it holds now
  std::string source = "init";  // "checkpoint" when read from MaterializeOptions::checkpoint,
                                // "init" when computed from the recording
  int counter_scheme = 0;       // computed in counter mode: the counter scheme's version (Note
                                // [Counter scheme versions]); 0 otherwise
};

struct MaterializeStats {
  std::vector<TensorStats> tensors;
  // One line per tensor and a total, for logs and the demo.
  TORCHDEFER_API std::string to_string() const;
};

// Note [Progress]
// ~~~~~~~~~~~~~~~
// A progress callback is called after each step of one materialization call, `done` counting
// from 1 to `total` over the whole call. A full replay's step is one replayed operation (`op`
// is its name, e.g. "aten::normal_"), counted over every recording the call replays, so that a
// long single replay shows movement. A sharded call's step is one tensor (`op` is its qualified
// name): region replay plans each tensor's operations only when it computes that tensor, so
// their number is not known up front. The operations that compute fakes of other recordings a
// replay reads are counted too (Note [One materialization]). An exception thrown by the callback
// aborts the call, which then leaves everything fake (Note [Replay is all or nothing]).
struct MaterializeProgress {
  int64_t done = 0;
  int64_t total = 0;
  std::string op;
};

// Options every materialization call understands, builder style:
//   MaterializeOptions().device(at::kCUDA).check_fn(...).progress(...)
class MaterializeOptions {
 public:
  // Where real tensors are created; by default the device each fake reports.
  MaterializeOptions& device(c10::Device device) {
    device_ = device;
    return *this;
  }
  // The RNG mode; by default kTorch, or kCounter when sharding.
  MaterializeOptions& rng(RngMode mode) {
    rng_ = mode;
    return *this;
  }
  // materialize_module only: each fake parameter becomes, in place, the slice `shard` gives this
  // rank (Shard::box_for); buffers and tensors it does not split stay whole.
  MaterializeOptions& shard(Shard shard) {
    shard_ = shard;
    return *this;
  }
  // materialize_module only: a general layout (tensor parallel, 2-D); takes precedence over
  // shard() and applies to buffers too. A box that is the whole tensor is still computed by
  // region replay (Note [A region may be the whole tensor]); nullopt replicates.
  MaterializeOptions& region(RegionFn region) {
    region_ = std::move(region);
    return *this;
  }
  // The counter RNG seed; by default a digest of the default generator's state when the
  // recording began, so `torch::manual_seed(s)` before deferred_init decides it.
  MaterializeOptions& counter_seed(uint64_t seed) {
    counter_seed_ = seed;
    return *this;
  }
  // materialize_module only: a child module for which `check_fn` returns false is skipped with
  // its whole subtree (FSDP wraps and materializes those units itself).
  MaterializeOptions& check_fn(std::function<bool(const torch::nn::Module&)> check_fn) {
    check_fn_ = std::move(check_fn);
    return *this;
  }
  // materialize_module only: materialize buffers and leave parameters fake.
  MaterializeOptions& buffers_only(bool buffers_only = true) {
    buffers_only_ = buffers_only;
    return *this;
  }
  // materialize_module only: every parameter and buffer `reader` holds is read from it (this
  // rank's box of it when sharding) instead of computed; the rest is initialized from the
  // recording (docs/checkpoints.md). The reader's names are the module's qualified names with
  // `prefix` in front (a child materialized on its own); names without it are ignored.
  MaterializeOptions& checkpoint(std::shared_ptr<const CheckpointReader> reader,
                                 std::string prefix = "") {
    checkpoint_ = std::move(reader);
    checkpoint_prefix_ = std::move(prefix);
    return *this;
  }
  // With a checkpoint: whether a checkpoint name that matches no parameter or buffer is an error
  // (the default) or ignored. Tensors the checkpoint lacks are initialized either way (Note
  // [Checking a checkpoint first]).
  MaterializeOptions& strict(bool strict = true) {
    strict_ = strict;
    return *this;
  }
  // Called after each step (Note [Progress]).
  MaterializeOptions& progress(std::function<void(const MaterializeProgress&)> progress) {
    progress_ = std::move(progress);
    return *this;
  }

  const std::optional<c10::Device>& device() const { return device_; }
  RngMode rng() const { return rng_.value_or(sharded() ? RngMode::kCounter : RngMode::kTorch); }
  bool sharded() const { return shard_.has_value() || static_cast<bool>(region_); }
  const std::optional<Shard>& shard() const { return shard_; }
  const RegionFn& region() const { return region_; }
  const std::optional<uint64_t>& counter_seed() const { return counter_seed_; }
  const std::function<bool(const torch::nn::Module&)>& check_fn() const { return check_fn_; }
  bool buffers_only() const { return buffers_only_; }
  const std::function<void(const MaterializeProgress&)>& progress() const { return progress_; }
  const std::shared_ptr<const CheckpointReader>& checkpoint() const { return checkpoint_; }
  const std::string& checkpoint_prefix() const { return checkpoint_prefix_; }
  bool strict() const { return strict_; }

 private:
  std::optional<c10::Device> device_;
  std::optional<RngMode> rng_;
  std::optional<Shard> shard_;
  RegionFn region_;
  std::optional<uint64_t> counter_seed_;
  std::function<bool(const torch::nn::Module&)> check_fn_;
  bool buffers_only_ = false;
  std::function<void(const MaterializeProgress&)> progress_;
  std::shared_ptr<const CheckpointReader> checkpoint_;
  std::string checkpoint_prefix_;
  bool strict_ = true;
};

// Makes `t` real in place: the same TensorImpl gets real storage, so every at::Tensor, module
// member and container holding it sees the real tensor. Returns `t`. A real tensor is returned
// untouched. On failure (a device that does not exist, a real input mutated since recording,
// out of memory) `t` is still fake and can be materialized again.
TORCHDEFER_API at::Tensor materialize_tensor(const at::Tensor& t,
                                             const MaterializeOptions& options = {});

// Materializes several tensors in one replay: storages they share are computed once and stay
// shared. Either all of them turn real or, on failure, none does.
TORCHDEFER_API void materialize_tensors(const std::vector<at::Tensor>& tensors,
                                        const MaterializeOptions& options = {});

// Materializes the fake parameters and buffers of `module` and its children (honoring
// check_fn and buffers_only), whole or, with shard()/region(), as this rank's slices. Tensors
// that were materialized before are not touched; tensors that never were fake are not touched
// either, except that shard()/region() slices them too (Note [Real tensors of a sharded module]).
// Returns what it did per tensor.
TORCHDEFER_API MaterializeStats materialize_module(torch::nn::Module& module,
                                                   const MaterializeOptions& options = {});

// True if any parameter or buffer of `module` or its children is still fake.
TORCHDEFER_API bool is_deferred(const torch::nn::Module& module);

// True if `t` is a fake that deferred_init recorded, so that materializing makes it real; false
// for a real tensor and for a fake made under FakeMode, which records nothing.
TORCHDEFER_API bool can_materialize(const at::Tensor& t);

}  // namespace torchdefer
