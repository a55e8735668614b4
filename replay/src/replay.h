// The replay engine behind materialize_*: one GraphReplay per recorded graph.
#pragma once

#include <torchdefer/materialize.h>
#include <torchdefer/op_graph.h>
#include <torchdefer/shard.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace torchdefer::detail {

// Reports to MaterializeOptions::progress, counting across one whole materialization call
// (Note [Progress]). Does nothing without a callback.
class ProgressReporter {
 public:
  ProgressReporter(const MaterializeOptions& options, int64_t total)
      : callback_(options.progress()), total_(total) {}
  void step(const std::string& what) {
    if (callback_) {
      callback_({++done_, total_, what});
    }
  }

 private:
  const std::function<void(const MaterializeProgress&)>& callback_;
  int64_t done_ = 0;
  int64_t total_;
};

// Materializes fakes of one OpGraph: plan(), validate(), execute(), commit(), in that order
// (Note [Replay is all or nothing]).
class GraphReplay {
 public:
  GraphReplay(std::shared_ptr<OpGraph> graph, const MaterializeOptions& options);

  void add_target(const at::Tensor& fake);
  // A recorded value to compute but not commit (region replay's whole inputs); result() only.
  void add_value(int64_t value);
  // Replays only nodes recorded before `node`: the targets as that node read them (Note [Reading a
  // value as it was]). Call before plan().
  void stop_before(int64_t node) { stop_before_ = node; }
  // Finds the storages to replay and the nodes that write them.
  void plan();
  // Raises, naming the op or tensor, for anything that would make execute() fail or lie.
  void validate();
  // After plan(): a fake of another recording that the planned nodes read and that is still fake
  // (execute() materializes those in place first), or an undefined tensor if there is none.
  at::Tensor unmaterialized_foreign_fake() const;
  // After plan(): how many nodes execute() will run.
  int64_t planned_nodes() const { return static_cast<int64_t>(nodes_.size()); }
  // Runs the planned nodes into storages private to this replay, reporting each to `progress`.
  void execute(ProgressReporter* progress = nullptr);
  // Turns every target real, in place. Cannot fail.
  void commit() noexcept;
  // After execute(): the real tensor target `i` would become, without turning it real.
  const at::Tensor& result(size_t i) const { return views_.at(i); }

 private:
  int64_t storage_of_value(int64_t value) const;
  bool readable_as_is(int64_t storage, int64_t node);
  c10::Device device_for(const RecordedValue& value) const;
  c10::Device node_device(const RecordedNode& node) const;
  at::Tensor input_tensor(const RecordedInput& input, c10::Device node_device);
  void place_generator(const RecordedDraws& draws);
  void offer_end_anchor(const RecordedDraws& draws);
  bool run_counter_node(int64_t index, const RecordedNode& node, c10::Device device);
  void check_replayed_output(const RecordedNode& node, const RecordedValue& value,
                             const at::Tensor& real) const;
  void run_node(int64_t index);

  std::shared_ptr<OpGraph> graph_;
  const MaterializeOptions& options_;
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
};

// Records in a materialized shard what it holds (read back by shard_info()).
void set_shard_info(const at::Tensor& t, ShardInfo info);

// materialize_tensors() without argument checks: groups fakes by graph and replays each group,
// reporting each replayed node to the progress callback when `report_progress`.
void materialize_tensors_in_place(const std::vector<at::Tensor>& tensors,
                                  const MaterializeOptions& options, bool report_progress = true);

}  // namespace torchdefer::detail
