#include <torchdefer/op_graph.h>

#include <torchdefer/rng_anchors.h>

#include <atomic>
#include <typeinfo>

namespace torchdefer {
namespace {

std::atomic<int64_t> live_nodes{0};
std::atomic<int64_t> live_graphs{0};

}  // namespace

OpGraph::OpGraph(std::string context, std::shared_future<uint64_t> counter_seed,
                 bool exact_generator)
    : context_(std::move(context)),
      counter_seed_(std::move(counter_seed)),
      exact_generator_(exact_generator) {
  live_graphs.fetch_add(1, std::memory_order_relaxed);
}

OpGraph::~OpGraph() {
  live_nodes -= static_cast<int64_t>(nodes_.size());
  live_graphs.fetch_sub(1, std::memory_order_relaxed);
}

int64_t OpGraph::add_node(const c10::OperatorHandle& op,
                          c10::SmallVectorImpl<c10::IValue>& arguments,
                          c10::SmallVectorImpl<RecordedInput>& inputs,
                          c10::SmallVectorImpl<int64_t>& outputs, AmbientState ambient) {
  nodes_.emplace_back(RecordedNode{op, arguments_.take(arguments), inputs_.take(inputs),
                                   outputs_.take(outputs), std::nullopt, ambient});
  ++live_nodes;
  return static_cast<int64_t>(nodes_.size()) - 1;
}

// Note [Finding a fake's storage]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every recorded output and every write needs the index of the storage its fake views. A fake this
// graph recorded carries its value (RecordedFake), and the value its storage: that storage is the
// answer whenever its identity is still the fake's (set_ and its kin give a fake another storage,
// and its annotation then names the old one). Otherwise, and for fakes new to the graph, the
// storage identity is looked up in a table keyed by the meta StorageImpl.
std::optional<int64_t> OpGraph::known_storage(const FakeTensorImpl& fake, int64_t known) const {
  if (known < 0) {
    return std::nullopt;
  }
  const int64_t storage = values_[known].storage;
  if (storages_[storage].identity.unsafeGetStorageImpl() != fake.storage_identity()) {
    return std::nullopt;
  }
  return storage;
}

int64_t OpGraph::storage_of(const FakeTensorImpl& fake, int64_t node) {
  const auto [it, inserted] =
      storage_index_.emplace(fake.storage_identity(), static_cast<int64_t>(storages_.size()));
  if (inserted) {
    RecordedStorage& storage = storages_.emplace_back();
    storage.identity = fake.meta_storage();
    storage.creator = node;
    storage.writers.push_back(node);
    real_storages_.emplace_back(c10::intrusive_ptr<c10::StorageImpl>());
  }
  return it->second;
}

int64_t OpGraph::add_output(int64_t node, const FakeTensorImpl& impl, const at::Tensor& fake,
                            int64_t known) {
  const int64_t storage_index = known_storage(impl, known).value_or(-1);
  const int64_t storage = storage_index >= 0 ? storage_index : storage_of(impl, node);
  // Filled in place: moving a value copies its inline sizes.
  RecordedValue& value = values_.emplace_back();
  value.storage = storage;
  value.node = node;
  value.sizes.assign(fake.sizes().begin(), fake.sizes().end());
  value.strides.assign(fake.strides().begin(), fake.strides().end());
  value.storage_offset = fake.storage_offset();
  value.dtype = fake.scalar_type();
  value.device = fake.device();
  const int64_t index = static_cast<int64_t>(values_.size()) - 1;
  annotations_.emplace_back(this, index);
  RecordedStorage& record = storages_[storage];
  if (record.creator == node && record.base_value < 0) {
    record.base_value = index;
  }
  return index;
}

void OpGraph::add_write(int64_t node, const FakeTensorImpl& impl, int64_t known) {
  if (const std::optional<int64_t> storage = known_storage(impl, known)) {
    add_writer(*storage, node);
    return;
  }
  const auto found = storage_index_.find(impl.storage_identity());
  if (found == storage_index_.end()) {
    // A fake this graph never saw (made under a plain FakeMode, or by another deferred_init):
    // the write is remembered, with no creator, so that replay can say why it cannot proceed.
    storage_index_.emplace(impl.storage_identity(), static_cast<int64_t>(storages_.size()));
    RecordedStorage& storage = storages_.emplace_back();
    storage.identity = impl.meta_storage();
    storage.writers.push_back(node);
    real_storages_.emplace_back(c10::intrusive_ptr<c10::StorageImpl>());
    return;
  }
  add_writer(found->second, node);
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
  rng_anchors_.push_back(std::move(anchor));
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

int64_t detail::live_recorded_nodes() { return live_nodes.load(); }

bool detail::any_recording_alive() { return live_graphs.load(std::memory_order_relaxed) != 0; }

}  // namespace torchdefer
