// The op graph: every operator deferred_init recorded, with the write history of every storage,
// in the form the replay engine reads it.
#pragma once

#include <torchdefer/ambient_state.h>
#include <torchdefer/fake_tensor_impl.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Storage.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>

#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace torchdefer {

// Note [The op graph]
// ~~~~~~~~~~~~~~~~~~~
// A node is one dispatcher call, seen at kDeferredInitKey before autograd or any composite
// decomposition ran (Note [Dispatch keys]): the operator, its boxed arguments with each tensor
// replaced by a RecordedInput, and a value per output tensor. A value is one view of one storage
// (its geometry, dtype and device), produced by a node. A storage is what the fakes' shared meta
// StorageImpl stands for: the node that created it and every node that later wrote into it, in
// record order. Which arguments a node writes comes from the schema's alias annotations
// (`Tensor(a!)`), never from op names; whether an output is a view of an input comes from the
// storage identities the Fake layer keeps.
//
// Materializing a storage means replaying its creator and its writers in record order, after the
// storages they read (recursively). A value never needs its view op replayed: it is its storage
// seen through its geometry. The graph costs a few hundred bytes per op and nothing per element;
// it lives as long as a fake refers to it (RecordedFake) and is freed with the last one.

// Where a recorded op's tensor argument came from.
struct RecordedInput {
  enum class Kind {
    kUndefined,    // an absent optional tensor
    kValue,        // a fake this graph recorded; `value` indexes OpGraph::values()
    kReal,         // a real tensor, held by reference; `version` is its version when recorded
    kConstant,     // a real tensor over memory nobody owns (from_blob): a private copy
    kForeignFake,  // a fake this graph did not record (another deferred_init, or a FakeMode)
  };
  Kind kind = Kind::kUndefined;
  int64_t value = -1;
  at::Tensor tensor;
  int64_t version = 0;
};

// One view of one storage, produced by a node.
struct RecordedValue {
  int64_t storage = -1;
  int64_t node = -1;
  // Inline up to 5 dimensions: recording appends a value per output, and most have a few.
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  int64_t storage_offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device = c10::Device(c10::kCPU);
};

// Everything that ever put data into one storage.
struct RecordedStorage {
  c10::Storage identity;    // the fakes' meta storage; held so that its address stays unique
  int64_t creator = -1;     // the node that created it
  int64_t base_value = -1;  // the value that node returned for it
  // The creator, then every in-place or out= write, in order. Inline up to 2: most storages are
  // created and filled once, and a heap list per storage was a visible share of recording.
  c10::SmallVector<int64_t, 2> writers;
};

// Where a random op's draws start in torch RNG mode (Note [Torch-mode draw offsets]).
struct RecordedDraws {
  enum class Kind {
    kPlaced,      // starts `offset` draws after OpGraph::rng_anchors()[anchor], uses `draws`
    kAnchorOnly,  // starts `offset` draws after the anchor; how many it takes depends on values
  };
  Kind kind = Kind::kPlaced;
  int64_t anchor = -1;
  uint64_t offset = 0;
  uint64_t draws = 0;
  // The position of the op's own CPU `generator=` argument, or -1 for the default generator: the
  // anchor is a state of that generator, and replay draws from a private copy of it (Note
  // [Explicit generators]).
  int64_t generator_argument = -1;
  // kAnchorOnly: the anchor that is the generator state right after this op (Note [Lazy RNG
  // anchors]).
  int64_t end_anchor = -1;
  // Counter RNG mode (Note [Counter RNG]): this op's index among the graph's random ops.
  uint64_t stream = 0;
};

struct RecordedNode {
  c10::OperatorHandle op;
  std::vector<c10::IValue> arguments;  // tensors replaced by undefined placeholders
  std::vector<RecordedInput> inputs;   // the tensors of `arguments`, in map_tensors order
  std::vector<int64_t> outputs;        // a value per output tensor (map_tensors order), or -1
  std::optional<RecordedDraws> draws;  // set for random ops
  AmbientState ambient;                // Note [Ambient state is part of the recording]
};

struct RngAnchor;

class OpGraph {
 public:
  // `context` names what was being constructed, for error messages ("torch::nn::LinearImpl").
  // `counter_seed` is the counter RNG seed of this recording (Note [Counter RNG]), ready when
  // first asked for (Note [A recording that starts during a jump] in
  // recorder/src/background_jump.h). `exact_generator` is its deferred_init's option, which random
  // ops recorded after that call returned follow too (Note [The generator after deferred_init]).
  OpGraph(std::string context, std::shared_future<uint64_t> counter_seed,
          bool exact_generator = false);
  ~OpGraph();
  OpGraph(const OpGraph&) = delete;
  OpGraph& operator=(const OpGraph&) = delete;

  const std::string& context() const { return context_; }
  bool exact_generator() const { return exact_generator_; }

  // The recorded program. Nodes, values and storages are only ever appended; read them while no
  // other thread records into this graph.
  const std::vector<RecordedNode>& nodes() const { return nodes_; }
  const std::vector<RecordedValue>& values() const { return values_; }
  const std::vector<RecordedStorage>& storages() const { return storages_; }

  // Appends `node` (its outputs filled in by add_output) and returns its index.
  int64_t add_node(RecordedNode&& node);

  // Records output `fake` of node `node`: finds or creates its storage (created by `node` if the
  // graph has not seen it) and returns the new value's index. `known` is the value `fake` was
  // recorded as in this graph before, if it was (an in-place op returns its argument).
  int64_t add_output(int64_t node, const at::Tensor& fake, int64_t known = -1);

  // Records that `node` wrote into the storage `fake` views. `known` is the value `fake` was
  // recorded as in this graph, if it was (a hint: Note [Finding a fake's storage]).
  void add_write(int64_t node, const at::Tensor& fake, int64_t known = -1);

  // Replaces input `input` of `node` (in map_tensors order): the recorder swaps a real tensor it
  // held by reference for a copy of what the node read (Note [Real tensors written while
  // recording]).
  void replace_input(int64_t node, size_t input, RecordedInput replacement) {
    nodes_[node].inputs[input] = std::move(replacement);
  }

  // Sets the values of `node`'s output tensors (-1 where an output is not a fake).
  void set_outputs(int64_t node, std::vector<int64_t> outputs) {
    nodes_[node].outputs = std::move(outputs);
  }

  // States of PyTorch's default CPU generator that random ops are placed from (rng_anchors.h).
  const std::shared_ptr<RngAnchor>& rng_anchor(int64_t anchor) const {
    return rng_anchors_[anchor];
  }
  int64_t add_rng_anchor(std::shared_ptr<RngAnchor> anchor);
  void set_draws(int64_t node, RecordedDraws draws) {
    draws.stream = random_ops_++;
    nodes_[node].draws = std::move(draws);
  }

  // The counter RNG seed: a digest of the default generator's state when recording began.
  uint64_t counter_seed() const { return counter_seed_.get(); }

  // The real storage that a committed replay materialized `storage` into, while it lives, so that
  // every later fake viewing it (a tied weight, a view registered as a buffer) shares it; null
  // before that.
  c10::intrusive_ptr<c10::StorageImpl> real_storage(int64_t storage) const;
  // Called by the replay engine's commit when it materialized `storage` into `real`.
  void set_real_storage(int64_t storage, const c10::Storage& real);

  // Serializes recording into this graph with replays planning from it: the recorder holds the
  // lock while it appends one node, a materialization while it plans.
  [[nodiscard]] std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mutex_); }

 private:
  int64_t storage_of(const FakeTensorImpl& fake, int64_t node);
  std::optional<int64_t> known_storage(const FakeTensorImpl& fake, int64_t known) const;
  void add_writer(int64_t storage, int64_t node);

  std::string context_;
  std::vector<RecordedNode> nodes_;
  std::vector<RecordedValue> values_;
  std::vector<RecordedStorage> storages_;
  // Per storage, what set_real_storage() recorded.
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> real_storages_;
  // Open addressing: every recorded output and write looks its storage up here.
  ska::flat_hash_map<const c10::StorageImpl*, int64_t> storage_index_;
  std::vector<std::shared_ptr<RngAnchor>> rng_anchors_;
  uint64_t random_ops_ = 0;
  const std::shared_future<uint64_t> counter_seed_;
  const bool exact_generator_;
  std::mutex mutex_;
};

// What the recorder attaches to every fake it records: which value of which graph it is.
struct RecordedFake final : FakeAnnotation {
  RecordedFake(std::shared_ptr<OpGraph> graph, int64_t value)
      : graph(std::move(graph)), value(value) {}
  std::shared_ptr<OpGraph> graph;
  int64_t value;
};

// The recording behind `t`, or nullptr if `t` is not a recorded fake.
const RecordedFake* recorded(const at::TensorBase& t);

namespace detail {
// How many recorded nodes are alive in this process (for tests of the graph's lifetime).
int64_t live_recorded_nodes();
}  // namespace detail

}  // namespace torchdefer
