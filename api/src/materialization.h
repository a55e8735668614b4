// The one orchestrator behind every materialization call: groups fakes by recording, adds the
// fakes of other recordings that a replay reads, plans each replay under its recording's lock,
// runs them in dependency order and commits everything together.
#pragma once

#include <torchdefer/extension.h>
#include <torchdefer/materialize.h>
#include <torchdefer/op_graph.h>
#include <torchdefer/shard.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include <torchdefer/replay.h>

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

// The engine configuration `options` asks for.
ReplayConfig replay_config(const MaterializeOptions& options);

// Note [One materialization]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every public materialization call is one Materialization: targets are grouped by the recording
// (OpGraph) that made them, one GraphReplay per recording. A replay may read a fake of another
// recording (an op recorded in one deferred_init on a fake another one made); that fake becomes
// a target of its own recording's replay in the same Materialization, which runs first and hands
// its result over by TensorImpl (ForeignValues). Recordings that read each other's fakes in a
// cycle are refused. Nothing is committed until every replay has run: then every target of every
// recording, and every shard, turns real at once, so a failure anywhere leaves all of them fake
// (Note [Replay is all or nothing]). This is also the one place that takes a recording's lock.
class Materialization {
 public:
  explicit Materialization(const MaterializeOptions& options);

  // A tensor to turn real whole; real tensors are skipped.
  void add(const at::Tensor& t);
  // Computes `entry`'s `box` by region replay (or whole and sliced) now, to be committed with the
  // rest; fills `stats` in and returns the local tensor.
  const at::Tensor& add_shard(const NamedTensor& entry, const Box& box, TensorStats& stats);
  // Slices `entry`, a tensor that was real at record time, to `box`, to be put in place with the
  // rest (Note [Real tensors of a sharded module]); returns the slice.
  const at::Tensor& add_real_shard(const NamedTensor& entry, const Box& box);

  // Allocates `entry`'s `box` (the whole tensor for nullopt), in its dtype on the target
  // device, for run() to read from the options' checkpoint under `key` together with every
  // other such tensor, and to commit with the rest; returns the bytes it keeps (Note [Loading
  // is committed with the rest]). `entry` may be a tensor real at record time (Note [Loading a
  // tensor real at record time]).
  int64_t add_loaded(const NamedTensor& entry, const std::optional<Box>& box,
                     const std::string& key);

  // Plans, runs and commits everything added, reporting each replayed node to the progress
  // callback when `report_progress`; once.
  void run(bool report_progress);

 private:
  struct Group {
    std::shared_ptr<OpGraph> graph;
    std::vector<at::Tensor> targets;
    std::unordered_set<const c10::TensorImpl*> seen;
    std::unique_ptr<GraphReplay> replay;  // null until planned with every target
    std::vector<const OpGraph*> reads;    // recordings whose fakes it reads
  };
  struct LocalShard {
    at::Tensor fake;  // for real_shards_, the real tensor that is sliced
    at::Tensor local;
    ShardInfo info;
  };

  struct Load {
    NamedTensor entry;
    std::optional<Box> box;
    bool real = false;  // entry is real at record time
  };

  Group& group_of(const std::shared_ptr<OpGraph>& graph);
  void read_checkpoint();
  void add_target(const at::Tensor& fake);
  void plan();
  std::vector<Group*> run_order();
  at::Tensor compute_shard(const NamedTensor& entry, const Box& box, TensorStats& stats);
  void commit() noexcept;
  void pay_for_finished_recordings();

  const MaterializeOptions& options_;
  ReplayConfig config_;
  std::map<const OpGraph*, Group> groups_;
  std::vector<LocalShard> shards_;
  std::vector<LocalShard> real_shards_;
  std::vector<LocalShard> loaded_whole_;  // info unused: whole tensors are no shards
  std::vector<LocalShard> loaded_real_;   // whole real tensors and their read values; info unused
  std::vector<CheckpointRead> reads_;     // for read_checkpoint(), with their loads_
  std::vector<Load> loads_;
};

// The value reader every recording is opened with (Note [Who reads values], Note [Reading values
// while recording]): the values `fake` has so far, replayed on CPU in torch RNG mode into a
// tensor private to the caller.
at::Tensor read_recorded_values(const at::Tensor& fake);

}  // namespace torchdefer::detail
