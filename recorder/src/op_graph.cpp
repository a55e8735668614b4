#include <torchdefer/op_graph.h>

#include <torchdefer/rng_anchors.h>

#include <atomic>
#include <mutex>
#include <typeinfo>
#include <unordered_set>

namespace torchdefer {
namespace {

std::atomic<int64_t> live_graphs{0};

// The graphs alive, for live_recorded_nodes(): one count shared by every graph would be an atomic
// read-modify-write on every recorded call, for a number only tests ask. Never destroyed: graphs
// held by thread_local or static objects can die at exit after function statics.
struct LiveGraphs {
  std::mutex mutex;
  std::unordered_set<OpGraph*> graphs;
};
LiveGraphs& live_graph_list() {
  static auto* const list = new LiveGraphs();
  return *list;
}

}  // namespace

OpGraph::OpGraph(std::string context, std::shared_future<uint64_t> counter_seed,
                 detail::ValueReader reader, bool exact_generator, bool cuda_generator)
    : context_(std::move(context)),
      counter_seed_(std::move(counter_seed)),
      value_reader_(reader),
      exact_generator_(exact_generator),
      cuda_generator_(cuda_generator) {
  live_graphs.fetch_add(1, std::memory_order_relaxed);
  LiveGraphs& list = live_graph_list();
  const std::lock_guard<std::mutex> lock(list.mutex);
  list.graphs.insert(this);
}

OpGraph::~OpGraph() {
  live_graphs.fetch_sub(1, std::memory_order_relaxed);
  LiveGraphs& list = live_graph_list();
  const std::lock_guard<std::mutex> lock(list.mutex);
  list.graphs.erase(this);
}

int64_t OpGraph::add_node(const c10::OperatorHandle& op,
                          c10::SmallVectorImpl<c10::IValue>& arguments,
                          c10::SmallVectorImpl<RecordedInput>& inputs,
                          c10::SmallVectorImpl<int64_t>& outputs, AmbientState ambient) {
  return add_described_node(op, arguments_.take(arguments), inputs_.take(inputs), outputs, ambient);
}

int64_t OpGraph::add_described_node(const c10::OperatorHandle& op,
                                    c10::ArrayRef<c10::IValue> arguments,
                                    c10::ArrayRef<RecordedInput> inputs,
                                    c10::SmallVectorImpl<int64_t>& outputs, AmbientState ambient) {
  nodes_.emplace_back(op, arguments, inputs, outputs_.take(outputs), nullptr, ambient);
  return count_node();
}

// Note [Finding a fake's storage]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every recorded output and every write needs the index of the storage its fake views. A fake this
// graph recorded carries its value (RecordedFake), and the value its storage: that storage is the
// answer whenever its identity is still the fake's (set_ and its kin give a fake another storage,
// and its annotation then names the old one). That covers every in-place op and write on the
// graph's own fakes.
//
// A fake new to the graph (a factory's output, a view) is new to it for sure when its meta
// StorageImpl has one reference: the fake's own shadow. The graph holds every identity it recorded
// (RecordedStorage::identity), only under its lock, so an identity it knows has two at least; and
// an address cannot repeat while the graph lives. So a factory's output storage is appended with
// no lookup. Any other identity (a view's, shared with its base; a foreign fake's) is looked up in
// a table keyed by the meta StorageImpl, which indexes storages only when a lookup needs it: first
// those appended since the last lookup.
int64_t OpGraph::known_storage(const FakeTensorImpl& fake, int64_t known) const {
  if (known < 0) {
    return -1;
  }
  const int64_t storage = values_[known].storage;
  return storages_[storage].identity.unsafeGetStorageImpl() == fake.storage_identity() ? storage
                                                                                       : -1;
}

int64_t OpGraph::indexed_storage(const c10::StorageImpl* identity) {
  for (; indexed_storages_ < storages_.size(); ++indexed_storages_) {
    storage_index_.emplace(storages_[indexed_storages_].identity.unsafeGetStorageImpl(),
                           static_cast<int64_t>(indexed_storages_));
  }
  const auto found = storage_index_.find(identity);
  return found != storage_index_.end() ? found->second : -1;
}

int64_t OpGraph::append_storage(const FakeTensorImpl& fake, int64_t creator, int64_t base_value,
                                int64_t writer) {
  RecordedStorage& storage = storages_.emplace_back();
  storage.identity = fake.meta_storage();
  storage.creator = creator;
  storage.base_value = base_value;
  storage.writers.push_back(writer);
  real_storages_.emplace_back(c10::intrusive_ptr<c10::StorageImpl>());
  return static_cast<int64_t>(storages_.size()) - 1;
}

int64_t OpGraph::add_output(int64_t node, const FakeTensorImpl& impl, const at::Tensor& fake,
                            int64_t known) {
  const int64_t index = static_cast<int64_t>(values_.size());
  int64_t storage = known_storage(impl, known);
  if (storage < 0 && !impl.meta().storage().unique()) {
    storage = indexed_storage(impl.storage_identity());
  }
  if (storage < 0) {
    storage = append_storage(impl, node, index, node);
  } else if (storages_[storage].creator == node && storages_[storage].base_value < 0) {
    storages_[storage].base_value = index;  // Note [A storage a write makes]
  }
  const auto [sizes, strides] = geometry_.copy(fake.sizes(), fake.strides());
  values_.emplace_back(storage, node, sizes, strides, fake.storage_offset(), fake.scalar_type(),
                       fake.device());
  annotations_.emplace_back(this, index);
  return index;
}

// Note [A storage a write makes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// `t.set_()` with no source gives a fake of this graph a new, empty storage. Its write lands in a
// storage the graph has not seen, as a write into a foreign fake's does; but a foreign fake was
// never a value of this graph, while this one was (`known`), and only the fake's own meta shadow
// holds its new storage. Such a storage is made by the writing node: the node is its creator, and
// its output for the fake its base value (add_output), so that replay makes it as eager did.
int64_t OpGraph::add_write(int64_t node, const FakeTensorImpl& impl, int64_t known) {
  int64_t storage = known_storage(impl, known);
  if (storage < 0) {
    storage = indexed_storage(impl.storage_identity());
  }
  if (storage < 0) {
    // A storage this graph never saw: a foreign fake's (made under a plain FakeMode, or by another
    // deferred_init), remembered with no creator so that replay can say why it cannot proceed, or
    // one this write made (Note [A storage a write makes]).
    const bool made_here = known >= 0 && impl.meta().storage().unique();
    return append_storage(impl, made_here ? node : -1, -1, node);
  }
  add_writer(storage, node);
  return storage;
}

void OpGraph::add_writer(int64_t storage, int64_t node) {
  auto& writers = storages_[storage].writers;
  if (writers.back() != node) {
    writers.push_back(node);
  }
}

c10::intrusive_ptr<c10::StorageImpl> OpGraph::real_storage(int64_t storage) const {
  return real_storages_[storage].lock();
}

void OpGraph::set_real_storage(int64_t storage, const c10::Storage& real) {
  real_storages_[storage] = real.getWeakStorageImpl();
}

int64_t OpGraph::add_rng_anchor(std::shared_ptr<RngAnchor> anchor) {
  rng_anchors_.emplace_back(std::move(anchor));
  return static_cast<int64_t>(rng_anchors_.size()) - 1;
}

const RecordedFake* recorded(const at::TensorBase& t) {
  const FakeTensorImpl* impl = fake_impl(t);
  return impl != nullptr ? recorded(*impl) : nullptr;
}

const RecordedFake* recorded(const FakeTensorImpl& impl) {
  // RecordedFake is final: its exact type decides (see fake_impl).
  const FakeAnnotation* annotation = impl.annotation().get();
  return annotation != nullptr && typeid(*annotation) == typeid(RecordedFake)
             ? static_cast<const RecordedFake*>(annotation)
             : nullptr;
}

int64_t detail::live_recorded_nodes() {
  LiveGraphs& list = live_graph_list();
  const std::lock_guard<std::mutex> list_lock(list.mutex);
  int64_t nodes = 0;
  for (const OpGraph* graph : list.graphs) {
    // Not under the graph's lock: a thread that holds one can destroy another graph, whose
    // destructor takes the list's mutex.
    nodes += graph->node_count();
  }
  return nodes;
}

bool detail::any_recording_alive() { return live_graphs.load(std::memory_order_relaxed) != 0; }

}  // namespace torchdefer
