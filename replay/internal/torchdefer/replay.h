// The replay engine: runs the recorded nodes that produce a set of values of one OpGraph into
// storages private to the replay, and turns target fakes real in place when told to.
#pragma once

#include <torchdefer/op_graph.h>
#include <torchdefer/shard.h>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace torchdefer::detail {

// What a replay needs to know from the caller: the narrow part of MaterializeOptions.
struct ReplayConfig {
  // Where real tensors are created; by default the device each value was recorded on.
  std::optional<c10::Device> device;
  // Counter RNG (Note [Counter RNG]) instead of PyTorch's default generator.
  bool counter_rng = false;
  // The counter RNG seed; by default the recording's own (OpGraph::counter_seed()).
  std::optional<uint64_t> counter_seed;
};

// Real tensors standing in for fakes of other recordings that a replay reads, by TensorImpl
// (Note [One materialization]).
using ForeignValues = std::unordered_map<const c10::TensorImpl*, at::Tensor>;

// Materializes values of one OpGraph: plan(), run(), then commit() (Note [Replay is all or
// nothing]). Callers hold the graph's lock (OpGraph::lock()) around plan().
class GraphReplay {
 public:
  GraphReplay(std::shared_ptr<OpGraph> graph, ReplayConfig config);

  void add_target(const at::Tensor& fake);
  // A recorded value to compute but not commit (region replay's whole inputs); result() only.
  void add_value(int64_t value);
  // Replays only nodes recorded before `node`: the targets as that node read them (Note [Reading a
  // value as it was]). Call before plan().
  void stop_before(int64_t node) { stop_before_ = node; }

  // Finds the storages to replay and the nodes that write them, and raises, naming the op or the
  // tensor, for anything that would make run() fail or lie (a device that does not exist, a real
  // input modified since recording, a random op that cannot be placed).
  void plan();
  // After plan(): the fakes of other recordings that the planned nodes read and that are still
  // fake; run() needs a real value for each.
  std::vector<at::Tensor> foreign_fakes() const;
  // After plan(): how many nodes run() will run.
  int64_t planned_nodes() const { return static_cast<int64_t>(nodes_.size()); }
  // Runs the planned nodes into storages private to this replay, calling `on_node` (if set) with
  // each node's op name after it ran. `foreign` holds a real value for every foreign_fakes().
  void run(const ForeignValues& foreign = {},
           const std::function<void(const std::string&)>& on_node = nullptr);
  // After run(): the real tensor target `i` becomes, without turning it real.
  const at::Tensor& result(size_t i) const { return views_.at(i); }
  // Turns every target real, in place, and records the storages it computed in the graph.
  // Cannot fail.
  void commit() noexcept;

 private:
  int64_t storage_of_value(int64_t value) const;
  bool readable_as_is(int64_t storage, int64_t node);
  void validate();
  c10::Device device_for(const RecordedValue& value) const;
  c10::Device node_device(const RecordedNode& node) const;
  at::Tensor input_tensor(const RecordedInput& input, c10::Device node_device);
  const at::Tensor& foreign_value(const at::Tensor& t) const;
  void place_generator(const RecordedDraws& draws);
  at::Generator own_generator(const RecordedNode& node) const;
  uint64_t recording_seed() const;
  void call_on(const RecordedNode& node, torch::jit::Stack& stack, c10::Device run_on,
               c10::Device device);
  void call_on_cuda_generator(const RecordedNode& node, torch::jit::Stack& stack,
                              c10::Device device);
  void offer_end_anchor(const RecordedDraws& draws, at::Generator generator);
  bool run_counter_node(int64_t index, const RecordedNode& node, c10::Device device);
  void check_replayed_output(const RecordedNode& node, const RecordedValue& value,
                             const at::Tensor& real) const;
  // Runs the node at `position` of nodes_, and the ones after it that run in its parts; returns
  // how many ran.
  int64_t run_node(std::set<int64_t>::const_iterator position);
  void keep_outputs(int64_t index, const RecordedNode& node, const torch::jit::Stack& stack);
  std::vector<int64_t> partwise_followers(std::set<int64_t>::const_iterator fill) const;
  int64_t run_fill_in_parts_from(std::set<int64_t>::const_iterator fill, torch::jit::Stack& stack,
                                 c10::Device device);
  const c10::Storage& real_storage(int64_t storage) const;

  std::shared_ptr<OpGraph> graph_;
  ReplayConfig config_;
  const ForeignValues* foreign_ = nullptr;     // set during run()
  std::vector<at::Tensor> targets_;            // undefined for add_value() targets
  std::vector<int64_t> target_values_;         // per target, its recorded value
  std::vector<at::Tensor> views_;              // per target, the real view it becomes
  std::set<int64_t> to_replay_;                // storages this replay computes
  std::set<int64_t> nodes_;                    // their writers, in record order
  std::map<int64_t, c10::Storage> available_;  // storages already real, read as they are
  std::map<int64_t, c10::Storage> replayed_;   // storages computed by this replay
  int64_t stop_before_ = std::numeric_limits<int64_t>::max();
  int64_t rng_anchor_ = -1;  // where the default generator stands
  uint64_t rng_offset_ = 0;
  std::set<c10::DeviceIndex> cuda_generators_;  // CUDA generators this replay drew from
};

// Records in a materialized shard what it holds (read back by shard_info()).
void set_shard_info(const at::Tensor& t, ShardInfo info);

}  // namespace torchdefer::detail
