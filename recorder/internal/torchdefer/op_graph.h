// The op graph: every operator deferred_init recorded, with the write history of every storage,
// in the form the replay engine reads it.
#pragma once

#include <torchdefer/ambient_state.h>
#include <torchdefer/fake_tensor_impl.h>
#include <torchdefer/graph_mutex.h>
#include <torchdefer/recording.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Storage.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchdefer {

// Note [The op graph]
// ~~~~~~~~~~~~~~~~~~~
// A node is one dispatcher call as the model's code made it, a composite op before its
// decomposition (Note [Where an op is recorded] in recording.cpp): the operator, its boxed
// arguments with each tensor replaced by a RecordedInput, and a value per output tensor. A value is
// one view of one storage (its geometry, dtype and device), produced by a node. A storage is what
// the fakes' shared meta StorageImpl stands for: the node that created it and every node that later
// wrote into it, in record order. Which arguments a node writes comes from the schema's alias
// annotations (`Tensor(a!)`), never from op names; whether an output is a view of an input comes
// from the storage identities the Fake layer keeps.
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
  // Views into the graph's geometry arena (Note [Where the graph keeps its lists]).
  c10::IntArrayRef sizes;
  c10::IntArrayRef strides;
  int64_t storage_offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device = c10::Device(c10::kCPU);
};

// Everything that ever put data into one storage.
struct RecordedStorage {
  c10::Storage identity;    // the fakes' meta storage; held so that its address stays unique
  int64_t creator = -1;     // the node that created it
  int64_t base_value = -1;  // the value that node returned for it
  // The creator, then every in-place or out= write, in order. Inline up to 6: most storages are
  // created and filled once, a trunc_normal_ initialization writes five times (uniform_, erfinv_,
  // mul_, add_, clamp_), and a heap list per storage was a visible share of recording.
  c10::SmallVector<int64_t, 6> writers;
};

// Where a random op's draws start in torch RNG mode (Note [Torch-mode draw offsets]).
struct RecordedDraws {
  enum class Kind {
    kPlaced,      // starts `offset` draws after OpGraph::rng_anchors()[anchor], uses `draws`
    kAnchorOnly,  // starts `offset` draws after the anchor; how many it takes depends on values
    // On the default generator of CUDA device `cuda_device` (Note [Torch-mode draws on CUDA] in
    // cuda_draws.h): seed `cuda_seed`, offset `offset` past the end of OpGraph::cuda_sampler(
    // anchor), or `offset` itself when `anchor` is -1; the offset moves by `draws`, or, when
    // `end_anchor` names the op's own sampler, by what its run tells.
    kCudaGenerator,
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
  // kCudaGenerator: the device, -1 when its generator could not be read at record time (no CUDA).
  int8_t cuda_device = -1;
  uint64_t cuda_seed = 0;
};

// Note [Where the graph keeps its lists]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Recording appends a node, a value per output and a storage per new storage for every call of a
// model's construction (3,541 calls for Llama-70B), and those appends were a visible share of what
// recording adds to a FakeMode construction (docs/results.md, C++ recording cost): three heap
// vectors per node, and vectors of nodes, values and storages that moved every element each time
// they grew. So a graph keeps its nodes, values, storages and annotations in blocks that never
// move (StableVector), and every node's arguments, inputs and outputs, and every value's sizes and
// strides, in graph-owned arenas (ListArena), each node and value holding views into them. An
// element, once appended, stays where it is until the graph is freed: a node's lists cost no
// allocation of their own, and a fake's annotation can point into the graph (RecordedFake). Both
// construct elements in place in raw memory, so an append is a bounds check and a placement new.
// std::deque keeps references too, but libstdc++'s blocks are 512 bytes, a few nodes each: an
// allocation every few appends, and an index is a division by the elements per block.

// Elements appended in blocks that are never reallocated, each twice the size of the one before
// (2^kFirstBits elements, then twice that...): a reference stays valid while the vector lives, an
// element is constructed in place in raw block memory (one placement new per append), and a large
// vector allocates only every time its size doubles.
//
// Note [A block table that never moves]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The blocks are reached through a table of fixed size, one slot per block that can exist, so an
// append writes only memory no reader uses yet: a new element and, for a new block, a new slot.
// A replay reads the nodes, values and storages it planned, and its commit writes the real
// storages of those storages, without the graph's lock, while another thread may go on recording
// into the same graph (ops on its fakes after deferred_init returned). A table that grew (a
// std::vector, as these once were) was freed under that reader or writer. Element i is in block b =
// floor(log2(i / 2^kFirstBits + 1)), which starts at element 2^kFirstBits * (2^b - 1): indexing is
// a shift, a bit scan and a subtraction.
template <typename T, size_t kFirstBits = 8>
class StableVector {
  static constexpr size_t kFirst = size_t{1} << kFirstBits;
  // Enough blocks for every size a size_t can count.
  static constexpr size_t kMaxBlocks = 64 - kFirstBits;

 public:
  StableVector() = default;
  StableVector(const StableVector&) = delete;
  StableVector& operator=(const StableVector&) = delete;
  ~StableVector() {
    for (size_t i = 0; i < size_; ++i) {
      (*this)[i].~T();
    }
    for (size_t b = 0; b < block_count_; ++b) {
      std::allocator<T>().deallocate(blocks_[b], kFirst << b);
    }
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const T& operator[](size_t i) const { return element(i); }
  T& operator[](size_t i) { return element(i); }
  const T& front() const { return blocks_[0][0]; }
  const T& back() const { return element(size_ - 1); }
  T& back() { return element(size_ - 1); }

  // Constructs the element from `args`, or aggregate-initializes it where T has no such
  // constructor (RecordedNode); with no arguments, default-initializes it (no zeroing first).
  template <typename... Args>
  T& emplace_back(Args&&... args) {
    if (next_ == limit_) {
      add_block();
    }
    T* const place = next_;
    if constexpr (sizeof...(Args) == 0) {
      new (place) T;
    } else if constexpr (std::is_constructible_v<T, Args&&...>) {
      new (place) T(std::forward<Args>(args)...);
    } else {
      new (place) T{std::forward<Args>(args)...};
    }
    ++next_;
    ++size_;
    return *place;
  }

 private:
  T& element(size_t i) const {
    const size_t b = 63 - static_cast<size_t>(__builtin_clzll((i >> kFirstBits) + 1));
    return blocks_[b][i - (((size_t{1} << b) - 1) << kFirstBits)];
  }

  void add_block() {
    TORCH_CHECK(block_count_ < kMaxBlocks, "torchdefer: a recording list outgrew size_t");
    const size_t capacity = kFirst << block_count_;
    T* const block = std::allocator<T>().allocate(capacity);
    blocks_[block_count_++] = block;
    next_ = block;
    limit_ = block + capacity;
  }

  T* blocks_[kMaxBlocks] = {};  // Note [A block table that never moves]
  size_t block_count_ = 0;
  T* next_ = nullptr;   // where the next element goes, in the last block
  T* limit_ = nullptr;  // the end of the last block
  size_t size_ = 0;
};

// Contiguous runs of elements (a node's arguments, inputs or outputs, a value's geometry) in raw
// chunks that are never reallocated, each at least twice the size of the one before: a run is
// constructed in place and stays where it is.
template <typename T>
class ListArena {
  static_assert(std::is_nothrow_move_constructible_v<T>, "take() moves without a rollback");

 public:
  ListArena() = default;
  ListArena(const ListArena&) = delete;
  ListArena& operator=(const ListArena&) = delete;
  ~ListArena() {
    if (!chunks_.empty()) {
      chunks_.back().end = next_;
    }
    for (const Chunk& chunk : chunks_) {
      std::destroy(chunk.begin, chunk.end);
      std::allocator<T>().deallocate(chunk.begin, chunk.capacity);
    }
  }

  // Moves `elements` into the arena and returns where they now are.
  template <typename Range>
  c10::ArrayRef<T> take(Range& elements) {
    T* const first = reserve(elements.size());
    T* place = first;  // a local: the moves could alias a member as far as the compiler knows
    for (auto& element : elements) {
      new (place++) T(std::move(element));
    }
    next_ = place;
    return c10::ArrayRef<T>(first, place - first);
  }

  // Room for `n` more elements at the arena's end, for its one writer to construct them in place
  // and then keep them (keep(), with the end of what it constructed) or destroy them itself.
  T* room_for(size_t n) { return reserve(n); }
  void keep(T* end) { next_ = end; }

  // Copies `first` and then `second` into the arena, contiguously, and returns where each now is.
  std::pair<c10::ArrayRef<T>, c10::ArrayRef<T>> copy(c10::ArrayRef<T> first,
                                                     c10::ArrayRef<T> second) {
    T* const begin = reserve(first.size() + second.size());
    T* place = begin;
    for (const T& element : first) {
      new (place++) T(element);
    }
    for (const T& element : second) {
      new (place++) T(element);
    }
    next_ = place;
    return {c10::ArrayRef<T>(begin, first.size()),
            c10::ArrayRef<T>(begin + first.size(), second.size())};
  }

 private:
  static constexpr size_t kFirst = 1024;

  struct Chunk {
    T* begin;
    T* end;  // past its last element; next_ for the last chunk until the arena is destroyed
    size_t capacity;
  };

  // Where `n` more elements go, contiguously.
  T* reserve(size_t n) {
    if (static_cast<size_t>(limit_ - next_) < n) {
      add_chunk(n);
    }
    return next_;
  }

  void add_chunk(size_t n) {
    if (chunks_.size() == chunks_.capacity()) {
      chunks_.reserve(std::max<size_t>(8, 2 * chunks_.size()));
    }
    const size_t capacity = std::max(n, chunks_.empty() ? kFirst : 2 * chunks_.back().capacity);
    T* const begin = std::allocator<T>().allocate(capacity);
    if (!chunks_.empty()) {
      chunks_.back().end = next_;
    }
    chunks_.push_back(Chunk{begin, begin, capacity});  // cannot throw after the reserve
    next_ = begin;
    limit_ = begin + capacity;
  }

  std::vector<Chunk> chunks_;
  T* next_ = nullptr;   // where the next element goes, in the last chunk
  T* limit_ = nullptr;  // the end of the last chunk's capacity
};

// A node's lists are views into its graph's arenas (Note [Where the graph keeps its lists]); a
// node describing a call not yet in a graph (the recorder's, before it appends it) views the
// recorder's own buffers.
struct RecordedNode {
  c10::OperatorHandle op;
  c10::ArrayRef<c10::IValue> arguments;  // tensors replaced by undefined placeholders
  c10::ArrayRef<RecordedInput> inputs;   // the tensors of `arguments`, in map_tensors order
  c10::ArrayRef<int64_t> outputs;        // a value per output tensor (map_tensors order), or -1
  // Set for random ops, into the graph's list of draws: a third of a model's calls at most, and
  // inline it made every node 56 bytes larger, memory that recording writes for every call.
  const RecordedDraws* draws = nullptr;
  AmbientState ambient;  // Note [Ambient state is part of the recording]
};

struct RngAnchor;

class OpGraph;

// Note [Annotations live in the graph]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// What the recorder attaches to every fake it records: which value of which graph it is. The
// graph holds one per value (OpGraph::annotation()), and a fake holds it through a shared_ptr that
// shares the graph's ownership (the aliasing constructor): no allocation per output, and the
// graph lives exactly as long as a fake or a recording refers to it, as before.
struct RecordedFake final : FakeAnnotation {
  RecordedFake(OpGraph* graph, int64_t value) : graph(graph), value(value) {}
  OpGraph* graph;
  int64_t value;
  // Shares the ownership of `graph` (alive while this annotation is held).
  std::shared_ptr<OpGraph> shared_graph() const;
};

class CudaSampler;

class OpGraph : public std::enable_shared_from_this<OpGraph> {
 public:
  // `context` names what was being constructed, for error messages ("torch::nn::LinearImpl").
  // `counter_seed` is the counter RNG seed of this recording (Note [Counter RNG]), ready when
  // first asked for (Note [A recording that starts during a jump] in
  // recorder/src/background_jump.h). `exact_generator` is its deferred_init's option, which random
  // ops recorded after that call returned follow too (Note [The generator after deferred_init]).
  // `reader` reads its values (Note [Who reads values]). `cuda_generator`: random ops on CUDA
  // tensors draw from CUDA's generator (Note [Torch-mode draws on CUDA] in cuda_draws.h).
  OpGraph(std::string context, std::shared_future<uint64_t> counter_seed,
          detail::ValueReader reader, bool exact_generator, bool cuda_generator = false);
  ~OpGraph();
  OpGraph(const OpGraph&) = delete;
  OpGraph& operator=(const OpGraph&) = delete;

  const std::string& context() const { return context_; }
  bool exact_generator() const { return exact_generator_; }
  bool cuda_generator() const { return cuda_generator_; }
  detail::ValueReader value_reader() const { return value_reader_; }

  // The recorded program. Nodes, values and storages are only ever appended; read them while no
  // other thread records into this graph.
  const StableVector<RecordedNode>& nodes() const { return nodes_; }
  const StableVector<RecordedValue>& values() const { return values_; }
  const StableVector<RecordedStorage>& storages() const { return storages_; }

  // How many nodes the graph has, readable without its lock (detail::live_recorded_nodes()).
  int64_t node_count() const { return node_count_.load(std::memory_order_relaxed); }

  // The index the next add_node() returns. The recorder appends a call's writes and outputs, which
  // name their node, and then the node, in one pass under the lock (Note [Recording an op]).
  int64_t next_node() const { return static_cast<int64_t>(nodes_.size()); }

  // Appends a node for a call of `op` and returns its index. Its arguments, inputs and outputs (a
  // value per output tensor, -1 where it is no fake) are moved into the graph.
  int64_t add_node(const c10::OperatorHandle& op, c10::SmallVectorImpl<c10::IValue>& arguments,
                   c10::SmallVectorImpl<RecordedInput>& inputs,
                   c10::SmallVectorImpl<int64_t>& outputs, AmbientState ambient);

  // Note [A recording's own lists]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // The thread inside this graph's Recording describes its common calls (Note [The common
  // call] in recording.cpp) straight into arenas that only it writes: a call's arguments and
  // inputs are constructed where its node will view them, before the call runs and without the
  // lock, and the node is then appended under the lock as any other (add_described_node()).
  // Describing into buffers of the recorder's own and moving them into the graph was a visible
  // share of recording. Readers read only the nodes appended so far, never an arena's own state,
  // so constructing at an arena's end needs no lock with a single writer.
  ListArena<c10::IValue>& own_arguments() { return own_arguments_; }
  ListArena<RecordedInput>& own_inputs() { return own_inputs_; }
  // Appends a node whose arguments and inputs are already where own_arguments() and own_inputs()
  // keep them; its outputs are moved into the graph.
  int64_t add_described_node(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                             c10::ArrayRef<RecordedInput> inputs,
                             c10::SmallVectorImpl<int64_t>& outputs, AmbientState ambient);

  // Records output `fake` (whose FakeTensorImpl is `impl`) of node `node`: finds or creates its
  // storage (created by `node` if the graph has not seen it) and returns the new value's index,
  // whose annotation is annotation(). `known` is the value `fake` was recorded as in this graph
  // before, if it was (an in-place op returns its argument).
  int64_t add_output(int64_t node, const FakeTensorImpl& impl, const at::Tensor& fake,
                     int64_t known = -1);

  // Records that `node` wrote into the storage the fake `impl` views, and returns that storage's
  // index. `known` is the value that fake was recorded as in this graph, if it was (a hint: Note
  // [Finding a fake's storage]).
  int64_t add_write(int64_t node, const FakeTensorImpl& impl, int64_t known = -1);

  // Replaces input `input` of `node` (in map_tensors order): the recorder swaps a real tensor it
  // held by reference for a copy of what the node read (Note [Real tensors written while
  // recording]).
  void replace_input(int64_t node, size_t input, RecordedInput replacement) {
    // The graph owns the arena the view points into.
    const_cast<RecordedInput&>(nodes_[node].inputs[input]) = std::move(replacement);
  }

  // What a fake recorded as `value` carries (Note [Annotations live in the graph]).
  const RecordedFake& annotation(int64_t value) const { return annotations_[value]; }

  // States of PyTorch's default CPU generator that random ops are placed from (rng_anchors.h).
  const std::shared_ptr<RngAnchor>& rng_anchor(int64_t anchor) const {
    return rng_anchors_[anchor];
  }
  int64_t add_rng_anchor(std::shared_ptr<RngAnchor> anchor);
  // The samplers on CUDA generators that this graph's random ops are placed after (cuda_draws.h).
  const std::shared_ptr<CudaSampler>& cuda_sampler(int64_t sampler) const {
    return cuda_samplers_[sampler];
  }
  int64_t add_cuda_sampler(std::shared_ptr<CudaSampler> sampler) {
    cuda_samplers_.emplace_back(std::move(sampler));
    return static_cast<int64_t>(cuda_samplers_.size()) - 1;
  }
  void set_draws(int64_t node, RecordedDraws draws) {
    draws.stream = random_ops_++;
    nodes_[node].draws = &draws_.emplace_back(std::move(draws));
  }

  // Values made while torch.inference_mode() was on (Note [Inference mode while recording]):
  // eager made inference tensors there, which materialization does not. Under the lock.
  void add_inference_value(int64_t value) { inference_values_.insert(value); }
  bool is_inference_value(int64_t value) const { return inference_values_.count(value) != 0; }

  // The counter RNG seed: a digest of the default generator's state when recording began.
  uint64_t counter_seed() const { return counter_seed_.get(); }

  // The real storage that a committed replay materialized `storage` into, while it lives, so that
  // every later fake viewing it (a tied weight, a view registered as a buffer) shares it; null
  // before that.
  c10::intrusive_ptr<c10::StorageImpl> real_storage(int64_t storage) const;
  // Called by the replay engine's commit when it materialized `storage` into `real`.
  void set_real_storage(int64_t storage, const c10::Storage& real);

  // Serializes recording into this graph with replays planning from it: the recorder holds the
  // lock while it appends one node, a materialization while it plans (Note [The graph's lock]).
  [[nodiscard]] std::unique_lock<GraphMutex> lock() { return std::unique_lock<GraphMutex>(mutex_); }

 private:
  // Note [Finding a fake's storage]: the storage of the value `known`, if `fake` still views it;
  // the storage whose identity is `identity`; each -1 if none.
  int64_t known_storage(const FakeTensorImpl& fake, int64_t known) const;
  int64_t indexed_storage(const c10::StorageImpl* identity);
  // Appends the storage `fake` views and returns its index.
  int64_t append_storage(const FakeTensorImpl& fake, int64_t creator, int64_t base_value,
                         int64_t writer);
  void add_writer(int64_t storage, int64_t node);
  // Publishes the node count for detail::live_recorded_nodes() and returns the last node's index.
  int64_t count_node() {
    const auto count = static_cast<int64_t>(nodes_.size());
    node_count_.store(count, std::memory_order_relaxed);  // relaxed: a plain store on x86
    return count - 1;
  }

  std::string context_;
  StableVector<RecordedNode> nodes_;
  StableVector<RecordedValue> values_;
  StableVector<RecordedStorage> storages_;
  StableVector<RecordedFake> annotations_;  // one per value
  StableVector<RecordedDraws> draws_;       // what random nodes point to
  ListArena<c10::IValue> arguments_;
  ListArena<RecordedInput> inputs_;
  ListArena<int64_t> outputs_;
  ListArena<int64_t> geometry_;           // every value's sizes and strides
  ListArena<c10::IValue> own_arguments_;  // Note [A recording's own lists]
  ListArena<RecordedInput> own_inputs_;
  // Per storage, what set_real_storage() recorded (Note [A block table that never moves]).
  StableVector<c10::weak_intrusive_ptr<c10::StorageImpl>> real_storages_;
  // Open addressing, keyed by identity: storages_[0, indexed_storages_), filled when a lookup needs
  // it (Note [Finding a fake's storage]).
  ska::flat_hash_map<const c10::StorageImpl*, int64_t> storage_index_;
  size_t indexed_storages_ = 0;
  StableVector<std::shared_ptr<RngAnchor>, 2> rng_anchors_;
  StableVector<std::shared_ptr<CudaSampler>, 2> cuda_samplers_;
  ska::flat_hash_set<int64_t> inference_values_;
  uint64_t random_ops_ = 0;
  const std::shared_future<uint64_t> counter_seed_;
  const detail::ValueReader value_reader_;
  const bool exact_generator_;
  const bool cuda_generator_;
  GraphMutex mutex_;
  std::atomic<int64_t> node_count_{0};  // nodes_.size(), for live_recorded_nodes()
};

inline std::shared_ptr<OpGraph> RecordedFake::shared_graph() const {
  return graph->shared_from_this();
}

// The recording behind `t`, or nullptr if `t` is not a recorded fake.
const RecordedFake* recorded(const at::TensorBase& t);
// The recording behind the fake `impl`, or nullptr if it is not a recorded fake.
const RecordedFake* recorded(const FakeTensorImpl& impl);

namespace detail {
// How many recorded nodes are alive in this process (for tests of the graph's lifetime).
int64_t live_recorded_nodes();
// Whether any graph is alive in this process: while none is, no fake is a recorded one and no
// recording is open, so a call on fakes has nothing to record (a plain FakeMode's calls ask it).
bool any_recording_alive();
}  // namespace detail

}  // namespace torchdefer
