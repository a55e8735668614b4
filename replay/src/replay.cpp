// The replay engine: materializes a set of recorded fakes by running, in record order, the nodes
// that write their storages and the storages those read.
#include <torchdefer/replay.h>

#include "dead_writes.h"
#include "fill_in_parts.h"
#include "recorded_ops.h"

#include <torchdefer/ambient_state.h>
#include <torchdefer/boxed_arguments.h>
#include <torchdefer/counter_rng.h>
#include <torchdefer/cuda_draws.h>
#include <torchdefer/fake_tensor.h>
#include <torchdefer/fake_tensor_impl.h>
#include <torchdefer/generator_sharing.h>
#include <torchdefer/mt19937_jump.h>
#include <torchdefer/node_stack.h>
#include <torchdefer/op_graph.h>
#include <torchdefer/rng_anchors.h>
#include <torchdefer/torch_compat.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

namespace torchdefer::detail {
namespace {

// Note [Replay is all or nothing]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A replay first plans (which storages and nodes it needs), then validates everything that can
// be checked without computing (every device can hold a tensor, no real input changed since it
// was recorded, every random op can be placed), then executes into storages nobody else sees,
// and only then commits: each target fake takes a view of its real storage through
// shallow_copy_from(), which cannot fail. An exception anywhere before the commit (a bad device,
// out of memory, an op that throws) leaves every target fake and re-materializable, the real
// tensors it read untouched, and the default generator as it was.
//
// Note [Shared storage stays shared]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A storage that is already real (materialized by an earlier call: a child module first) can
// still be recomputed by a later replay, when a node of that replay reads it as it was before a
// later write (`t0 = w.detach() * 2; w.data.normal_()` reads w before normal_). The recomputed
// copy is private to that replay: a target viewing the storage becomes a view of the real storage
// that already exists, and the graph keeps pointing at it, so every alias of it stays an alias.

at::Tensor view_of(const c10::Storage& storage, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                   int64_t offset, c10::ScalarType dtype) {
  at::Tensor view = at::empty({0}, at::TensorOptions().dtype(dtype).device(storage.device()));
  view.set_(storage, offset, sizes, strides);
  return view;
}

std::string describe_value(const RecordedValue& value) {
  return c10::str("an intermediate ", value.dtype, c10::IntArrayRef(value.sizes), " on ",
                  value.device);
}

std::string op_name(const RecordedNode& node) {
  return c10::toString(node.op.schema().operator_name());
}

}  // namespace

GraphReplay::GraphReplay(std::shared_ptr<OpGraph> graph, ReplayConfig config)
    : graph_(std::move(graph)), config_(std::move(config)) {}

void GraphReplay::add_target(const at::Tensor& fake) {
  targets_.push_back(fake);
  target_values_.push_back(recorded(fake)->value);
}

void GraphReplay::add_value(int64_t value) {
  targets_.emplace_back();
  target_values_.push_back(value);
}

int64_t GraphReplay::storage_of_value(int64_t value) const {
  return graph_->values()[value].storage;
}

void GraphReplay::plan() {
  std::vector<int64_t> pending;
  auto need = [&](int64_t storage) {
    if (to_replay_.insert(storage).second) {
      pending.push_back(storage);
    }
  };
  for (const int64_t value : target_values_) {
    const int64_t storage = storage_of_value(value);
    const RecordedStorage& record = graph_->storages()[storage];
    c10::intrusive_ptr<c10::StorageImpl> real = graph_->real_storage(storage);
    if (real && record.writers.back() < stop_before_) {
      available_.emplace(storage, c10::Storage(std::move(real)));
    } else {
      need(storage);
    }
  }
  while (!pending.empty()) {
    const int64_t storage = pending.back();
    pending.pop_back();
    const RecordedStorage& record = graph_->storages()[storage];
    TORCH_CHECK(record.creator >= 0, "torchdefer: cannot materialize: ",
                op_name(graph_->nodes()[record.writers.front()]), " in deferred_init of ",
                graph_->context(),
                " wrote into a fake that deferred_init did not create (made under a plain "
                "FakeMode or by another deferred_init), so its data has no recorded origin.");
    for (size_t i = 0; i < record.writers.size(); ++i) {
      const int64_t writer = record.writers[i];
      if (writer >= stop_before_) {
        break;
      }
      if (overwritten_before_read(*graph_, record, i, stop_before_)) {
        continue;  // Note [Dead writes]
      }
      nodes_.insert(writer);
      for (const RecordedInput& input : graph_->nodes()[writer].inputs) {
        if (input.kind != RecordedInput::Kind::kValue) {
          continue;
        }
        const int64_t read = storage_of_value(input.value);
        if (to_replay_.count(read) || readable_as_is(read, writer)) {
          continue;
        }
        need(read);
      }
    }
  }
  validate();
}

// A storage that is already real can be read by `node` as it is if nothing recorded writes it
// after `node`, nor `node` itself: then its final contents are what `node` read at record time.
// A node that writes what it reads (a train-mode batch_norm computing its output from the running
// statistics it updates) reads them as they were before it, and running it again on the real
// storage would write it twice.
bool GraphReplay::readable_as_is(int64_t storage, int64_t node) {
  const RecordedStorage& record = graph_->storages()[storage];
  if (record.writers.back() >= node) {
    return false;
  }
  c10::intrusive_ptr<c10::StorageImpl> real = graph_->real_storage(storage);
  if (!real) {
    return false;
  }
  available_.emplace(storage, c10::Storage(std::move(real)));
  return true;
}

c10::Device GraphReplay::device_for(const RecordedValue& value) const {
  return config_.device.value_or(value.device);
}

void GraphReplay::validate() {
  std::set<std::string> checked_devices;
  for (size_t i = 0; i < targets_.size(); ++i) {
    const RecordedValue& value = graph_->values()[target_values_[i]];
    const c10::Device device = device_for(value);
    if (!checked_devices.insert(device.str()).second) {
      continue;
    }
    try {
      RealOnlyGuard real_only;
      at::empty({0}, at::TensorOptions().device(device));
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "torchdefer: cannot materialize ",
                  targets_[i].defined() ? describe(targets_[i]) : describe_value(value), " on ",
                  device, ": ", e.msg(),
                  "\nChoose a device this process can use with MaterializeOptions().device(...).");
    }
  }
  for (const int64_t index : nodes_) {
    const RecordedNode& node = graph_->nodes()[index];
    for (const RecordedInput& input : node.inputs) {
      if (input.kind == RecordedInput::Kind::kReal && !input.tensor.is_inference()) {
        TORCH_CHECK(input.tensor._version() == input.version, "torchdefer: ", op_name(node),
                    " in deferred_init of ", graph_->context(), " read the real tensor ",
                    describe(input.tensor),
                    ", which was modified in place after recording "
                    "(version ",
                    input.version, " then, ", input.tensor._version(),
                    " now), so replaying it would not give what construction computed. Keep "
                    "tensors that a model's construction reads unchanged until it is "
                    "materialized.");
      }
      if (input.kind == RecordedInput::Kind::kForeignFake) {
        TORCH_CHECK(recorded(input.tensor) != nullptr, "torchdefer: ", op_name(node),
                    " in deferred_init of ", graph_->context(), " read ", describe(input.tensor),
                    ", a fake made under a plain FakeMode: it has no recorded data to replay.");
      }
    }
  }
}

std::vector<at::Tensor> GraphReplay::foreign_fakes() const {
  std::vector<at::Tensor> fakes;
  std::set<const c10::TensorImpl*> seen;
  for (const int64_t index : nodes_) {
    for (const RecordedInput& input : graph_->nodes()[index].inputs) {
      if (input.kind == RecordedInput::Kind::kForeignFake && is_fake(input.tensor) &&
          seen.insert(input.tensor.unsafeGetTensorImpl()).second) {
        fakes.push_back(input.tensor);
      }
    }
  }
  return fakes;
}

const c10::Storage& GraphReplay::real_storage(int64_t storage) const {
  const auto replayed = replayed_.find(storage);
  return replayed != replayed_.end() ? replayed->second : available_.at(storage);
}

// A real tensor is read as it is; a fake of another recording through the value the caller
// computed for it (Note [One materialization]).
const at::Tensor& GraphReplay::foreign_value(const at::Tensor& t) const {
  if (!is_fake(t)) {
    return t;
  }
  const auto found = foreign_->find(t.unsafeGetTensorImpl());
  TORCH_CHECK(found != foreign_->end(), "torchdefer: deferred_init of ", graph_->context(),
              " read ", describe(t),
              ", a fake of another deferred_init that this materialization does not compute. "
              "Materialize that tensor first.");
  return found->second;
}

at::Tensor GraphReplay::input_tensor(const RecordedInput& input, c10::Device node_device) {
  switch (input.kind) {
    case RecordedInput::Kind::kUndefined:
      return at::Tensor();
    case RecordedInput::Kind::kValue: {
      const RecordedValue& value = graph_->values()[input.value];
      return view_of(real_storage(value.storage), value.sizes, value.strides, value.storage_offset,
                     value.dtype);
    }
    case RecordedInput::Kind::kReal:
    case RecordedInput::Kind::kConstant:
    case RecordedInput::Kind::kForeignFake: {
      const at::Tensor& t = foreign_value(input.tensor);
      // A meta template has only its geometry, read where it is (Note [Factories of meta
      // templates]).
      const bool moves = config_.device && t.device() != node_device && !t.is_meta() &&
                         !(t.dim() == 0 && t.device().is_cpu());
      return moves ? t.to(node_device) : t;
    }
  }
  return at::Tensor();
}

c10::Device GraphReplay::node_device(const RecordedNode& node) const {
  for (const int64_t value : node.outputs) {
    if (value >= 0) {
      return device_for(graph_->values()[value]);
    }
  }
  for (const RecordedInput& input : node.inputs) {
    if (input.kind == RecordedInput::Kind::kValue) {
      return device_for(graph_->values()[input.value]);
    }
  }
  return config_.device.value_or(c10::Device(c10::kCPU));
}

void GraphReplay::place_generator(const RecordedDraws& draws) {
  const bool continues = rng_anchor_ == draws.anchor &&
                         draws.kind == RecordedDraws::Kind::kPlaced && draws.offset >= rng_offset_;
  // A lazy anchor is resolved before the generator is locked: resolving draws from it.
  const at::Tensor anchor_state =
      continues ? at::Tensor() : graph_->rng_anchor(draws.anchor)->state();
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(generator.mutex());
  if (!continues) {
    generator.set_state(anchor_state);
    rng_offset_ = 0;
  }
  discard_draws(*at::check_generator<at::CPUGeneratorImpl>(generator), draws.offset - rng_offset_);
  if (draws.kind == RecordedDraws::Kind::kPlaced) {
    rng_anchor_ = draws.anchor;
    rng_offset_ = draws.offset + draws.draws;
  } else {
    rng_anchor_ = -1;
  }
}

// Note [Explicit generators] (torch_rng.h): the op draws from a private CPU generator, never the
// one it was recorded with: in torch mode set to its anchor and offset, in counter mode seeded
// from the op's counter key (Note [Counter keys of explicit generators]).
at::Generator GraphReplay::own_generator(const RecordedNode& node) const {
  const RecordedDraws& draws = *node.draws;
  if (config_.counter_rng) {
    return at::make_generator<at::CPUGeneratorImpl>(
        generator_seed(counter_key(*graph_, node, recording_seed())));
  }
  return cpu_generator_at(graph_->rng_anchor(draws.anchor)->state(), draws.offset);
}

uint64_t GraphReplay::recording_seed() const {
  return config_.counter_seed.value_or(graph_->counter_seed());
}

// Counter RNG mode: fills the op's target with counter values instead of running it. Ops with no
// counter distribution (randperm, multinomial, ...) run on the default generator seeded from the
// seed and their stream: still a function of the recording alone, so every rank agrees, but not
// element-addressable. Returns false when the op should run normally after that seeding.
bool GraphReplay::run_counter_node(int64_t index, const RecordedNode& node, c10::Device device) {
  const CounterKey key = counter_key(*graph_, node, recording_seed());
  if (!has_counter_definition(node)) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    const std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_current_seed(generator_seed(key));
    return false;
  }
  if (writes_first_argument(node.op.schema())) {
    return counter_fill_node(node, input_tensor(node.inputs[0], device), key);
  }
  const int64_t value = node.outputs.at(0);
  const RecordedValue& out = graph_->values()[value];
  const at::Tensor result = at::empty_strided(
      out.sizes, out.strides, at::TensorOptions().dtype(out.dtype).device(device_for(out)));
  counter_fill_node(node, result, key);
  const int64_t storage = storage_of_value(value);
  if (graph_->storages()[storage].creator == index && to_replay_.count(storage)) {
    replayed_[storage] = result.storage();
  }
  return true;
}

namespace {

// Whether `real` puts every element where the recorded value says: the same offset, and the same
// stride in every dimension of more than one element (a size-1 dimension's stride is never used).
bool same_layout(const at::Tensor& real, const RecordedValue& value) {
  if (real.numel() == 0) {
    return true;
  }
  if (real.storage_offset() != value.storage_offset) {
    return false;
  }
  for (int64_t d = 0; d < real.dim(); ++d) {
    if (real.size(d) > 1 && real.stride(d) != value.strides[d]) {
      return false;
    }
  }
  return true;
}

}  // namespace

// Replay must produce what recording saw; a mismatch means the Fake layer computed metadata the
// real kernel does not, and the values would be misread (a layout, Note [Pointwise results take
// TensorIterator's layout]). Fail loudly instead.
void GraphReplay::check_replayed_output(const RecordedNode& node, const RecordedValue& value,
                                        const at::Tensor& real) const {
  TORCH_CHECK(real.scalar_type() == value.dtype && real.sizes() == c10::IntArrayRef(value.sizes),
              "torchdefer: replaying ", op_name(node), " in deferred_init of ", graph_->context(),
              " produced ", describe(real), ", but recording saw ", c10::toString(value.dtype),
              c10::IntArrayRef(value.sizes),
              ". The fake computation disagrees with the real kernel; please report this op.");
  TORCH_CHECK(same_layout(real, value), "torchdefer: replaying ", op_name(node),
              " in deferred_init of ", graph_->context(), " produced ", describe(real),
              " with strides ", real.strides(), " and offset ", real.storage_offset(),
              ", but recording saw strides ", c10::IntArrayRef(value.strides), " and offset ",
              value.storage_offset,
              ": the fake computation laid it out unlike the real kernel, and its values would "
              "be read scrambled; please report this op.");
}

// Note [Torch-mode draws run on the CPU]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Recording places every random op on the default CPU generator (Note [Torch-mode draw offsets]),
// so torch mode's values are eager construction's on the CPU. A kernel of another device draws
// from that device's generator (CUDA's Philox), whose position the recording does not know: run
// there, the op would give values that are neither eager's on the CPU nor eager's on the device.
// So a random node whose tensors live on another device runs on the CPU, with the CPU generator
// placed, and what it wrote and returned is copied to the device: the same values on every
// device, at the cost of host copies of that op's tensors. A tensor the op writes is copied with
// its whole storage and viewed with its own strides and offset on the CPU, since how a CPU kernel
// draws can depend on the layout it writes (normal_ on a strided view). Counter mode fills on the
// device. A recording whose CUDA ops draw from CUDA's generator runs them on their CUDA device
// the same way, wherever they are materialized (Note [Torch-mode draws on CUDA] in
// recorder/internal/torchdefer/cuda_draws.h).
namespace {

// The bytes of `t`'s storage, as a one-dimensional uint8 tensor on t's device.
at::Tensor storage_bytes(const at::Tensor& t) {
  const auto nbytes = static_cast<int64_t>(t.storage().nbytes());
  return at::empty({0}, t.options().dtype(at::kByte)).set_(t.storage(), 0, {nbytes}, {1});
}

}  // namespace

void GraphReplay::call_on(const RecordedNode& node, torch::jit::Stack& stack, c10::Device run_on,
                          c10::Device device) {
  const auto& arguments = node.op.schema().arguments();
  struct Written {
    at::Tensor device_bytes;
    at::Tensor run_bytes;
    at::Tensor on_device;
    at::Tensor on_run;
  };
  std::vector<Written> written;
  for (size_t i = 0; i < stack.size() && i < arguments.size(); ++i) {
    const bool writes = arguments[i].alias_info() && arguments[i].alias_info()->isWrite();
    stack[i] = map_tensors(stack[i], [&](const at::Tensor& t) {
      if (!t.defined() || t.device() == run_on) {
        return t;
      }
      if (!writes) {
        return t.to(run_on);
      }
      Written w{storage_bytes(t), at::Tensor(), t, at::Tensor()};
      w.run_bytes = w.device_bytes.to(run_on);
      w.on_run = at::empty({0}, t.options().device(run_on))
                     .set_(w.run_bytes.storage(), t.storage_offset(), t.sizes(), t.strides());
      written.push_back(w);
      return w.on_run;
    });
    if (is_device_argument(arguments[i]) && stack[i].isDevice()) {
      stack[i] = run_on;
    }
  }
  node.op.callBoxed(&stack);
  for (Written& w : written) {
    w.device_bytes.copy_(w.run_bytes);
  }
  for (c10::IValue& output : stack) {
    output = map_tensors(output, [&](const at::Tensor& t) {
      if (!t.defined() || t.device() != run_on) {
        return t;
      }
      for (const Written& w : written) {
        if (t.is_alias_of(w.on_run)) {
          return w.on_device;
        }
      }
      return t.to(device);
    });
  }
}

// Note [Torch-mode draws on CUDA] (recorder/internal/torchdefer/cuda_draws.h): the node runs on
// its recorded CUDA device with that device's generator lent at its place; how far the run moved
// the offset either resolves the node's own sampler or is checked against the recorded increment.
void GraphReplay::call_on_cuda_generator(const RecordedNode& node, torch::jit::Stack& stack,
                                         c10::Device device) {
  const RecordedDraws& draws = *node.draws;
  const CudaPlace place = cuda_place(*graph_, node);  // may run samplers: before the node's state
  const AmbientStateGuard ambient(node.ambient);
  const c10::Device cuda(c10::kCUDA, draws.cuda_device);
  const uint64_t end = with_cuda_generator_at(draws.cuda_device, place, [&] {
    if (device == cuda) {
      node.op.callBoxed(&stack);
    } else {
      call_on(node, stack, cuda, device);
    }
  });
  cuda_generators_.insert(draws.cuda_device);
  if (draws.end_anchor >= 0) {
    graph_->cuda_sampler(draws.end_anchor)->offer(end);
    return;
  }
  TORCH_CHECK(end == place.offset + draws.draws, "torchdefer: ", op_name(node),
              " in deferred_init of ", graph_->context(), " moved CUDA's generator on ", cuda,
              " by ", end - place.offset, " where torchdefer computed ", draws.draws,
              " from ATen's launch of its distribution kernel, so the random ops recorded after it "
              "would not get eager's values. Materialize in counter RNG mode, or record with "
              "cuda_draws=\"cpu\" (C++: CudaDraws::kCpuGenerator); and please report this LibTorch "
              "version.");
}

namespace {

bool same_view(const RecordedValue& a, const RecordedValue& b) {
  return a.storage == b.storage && a.sizes == b.sizes && a.strides == b.strides &&
         a.storage_offset == b.storage_offset && a.dtype == b.dtype && a.device == b.device;
}

}  // namespace

// The planned nodes right after random node `fill` that may run in its parts (Note [Pointwise ops
// after a fill run in its parts]): in-place, on the very view the fill writes, reading no other
// tensor, drawing nothing, under the same ambient state, region-exact for its dtype.
std::vector<int64_t> GraphReplay::partwise_followers(std::set<int64_t>::const_iterator fill) const {
  const RecordedNode& filler = graph_->nodes()[*fill];
  if (filler.inputs.empty() || filler.inputs[0].kind != RecordedInput::Kind::kValue) {
    return {};
  }
  const RecordedValue& target = graph_->values()[filler.inputs[0].value];
  std::vector<int64_t> followers;
  for (auto it = std::next(fill); it != nodes_.end(); ++it) {
    const RecordedNode& node = graph_->nodes()[*it];
    const bool follows = !node.draws && writes_first_argument(node.op.schema()) &&
                         node.inputs.size() == 1 &&
                         node.inputs[0].kind == RecordedInput::Kind::kValue &&
                         same_view(graph_->values()[node.inputs[0].value], target) &&
                         node.ambient.default_dtype == filler.ambient.default_dtype &&
                         region_exact_pointwise(node, target.dtype);
    if (!follows) {
      break;
    }
    followers.push_back(*it);
  }
  return followers;
}

// Torch mode, on the CPU, the generator placed: runs the fill `node` in parts with the pointwise
// ops after it when it can (Note [Torch-mode fills in parts]); returns how many nodes ran, 0 if
// none did.
int64_t GraphReplay::run_fill_in_parts_from(std::set<int64_t>::const_iterator fill,
                                            torch::jit::Stack& stack, c10::Device device) {
  const RecordedNode& node = graph_->nodes()[*fill];
  const bool large =
      !stack.empty() && stack[0].isTensor() && stack[0].toTensor().numel() >= 2 * kMinPartElements;
  if (node.draws->kind != RecordedDraws::Kind::kPlaced || node.draws->generator_argument >= 0 ||
      !large) {
    return 0;  // runs whole: no followers' stacks to build
  }
  const std::vector<int64_t> followers = partwise_followers(fill);
  std::vector<PartwiseStep> then;
  then.reserve(followers.size());
  for (const int64_t index : followers) {
    const RecordedNode& follower = graph_->nodes()[index];
    then.push_back({follower.op, node_stack(
                                     follower,
                                     [&](size_t, const RecordedInput& input) {
                                       return input_tensor(input, device);
                                     },
                                     device)});
  }
  if (!run_fill_in_parts(node.op, stack, node.draws->draws, 0, kMinPartElements, then)) {
    return 0;
  }
  return 1 + static_cast<int64_t>(followers.size());
}

namespace {

// Note [An untagged op that draws]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// deferred_init knows that an op draws random numbers by ATen's nondeterministic_seeded tag. An op
// of another library (a custom op, registered from Python or C++) whose kernel draws from the
// default CPU generator without that tag is recorded as an op that draws nothing: recording
// places no draws for it, so neither its values nor those of the random ops recorded after it
// can be eager's, and at materialization it draws from wherever the generator is. Recording cannot
// tell, since only its fake kernel runs there; replay can. A replay whose plan holds a node of an
// op outside ATen (and torchdefer) with no recorded draws lends itself the default generator as a
// drawing replay does (Note [Replays that lend themselves the default generator]: no other
// thread's replay sets it meanwhile, and its whole state is restored when the replay ends), and
// runs each such node between two reads of the generator's engine (two 2.5 KB copies, next to a
// real kernel on real memory). A moved engine is refused with the op's name and the tag to add:
// the materialization fails whole and leaves the model fake (Note [Replay is all or nothing]).
// ATen's ops are known by their tags and run unwatched, as do ops recorded with their draws (a
// tagged custom op). One given a generator without the tag is refused when recorded (Note [A
// generator recording cannot follow], recording.cpp); a custom op that draws from a CUDA
// generator, or from a torch.Generator it holds itself, is not noticed (docs/python.md, known
// limits).
bool outside_aten(const RecordedNode& node) {
  const std::string& name = node.op.schema().name();
  return name.rfind("aten::", 0) != 0 && name.rfind("prims::", 0) != 0 &&
         name.rfind("torchdefer::", 0) != 0;
}

void call_watching_the_default_generator(const RecordedNode& node, torch::jit::Stack& stack) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(generator);
  at::mt19937 before;
  {
    const std::lock_guard<std::mutex> lock(generator.mutex());
    before = impl->engine();
  }
  node.op.callBoxed(&stack);
  bool moved = false;
  {
    const std::lock_guard<std::mutex> lock(generator.mutex());
    moved = !same_engine(impl->engine().data(), before.data());
  }
  TORCH_CHECK(!moved, "torchdefer: ", op_name(node),
              " drew from the default CPU generator when materialization ran it, but it has no "
              "nondeterministic_seeded tag, so deferred_init recorded it as an op that draws "
              "nothing: its values, and those of the random ops recorded after it, would differ "
              "from eager's. Register the op with that tag (torch.library.custom_op(..., "
              "tags=(torch.Tag.nondeterministic_seeded,)), or the tags of its TORCH_LIBRARY "
              "schema) and record the model again. (Code on another thread that drew from the "
              "default generator while the op ran looks the same.)");
}

// Whether replaying `node` may touch the default CPU generator: a random op, in torch mode when it
// has no generator of its own, in counter mode when it has no counter definition
// (run_counter_node seeds the default generator for it); and a node watched for drawing untagged
// (Note [An untagged op that draws]).
bool uses_default_generator(const RecordedNode& node, bool counter_rng) {
  if (node.draws == nullptr) {
    return outside_aten(node);
  }
  if (counter_rng) {
    return !has_counter_definition(node);
  }
  return node.draws->generator_argument < 0 &&
         node.draws->kind != RecordedDraws::Kind::kCudaGenerator;
}

}  // namespace

int64_t GraphReplay::run_node(std::set<int64_t>::const_iterator position) {
  const int64_t index = *position;
  const RecordedNode& node = graph_->nodes()[index];
  const c10::Device device = node_device(node);
  if (node.draws && config_.counter_rng && run_counter_node(index, node, device)) {
    return 1;
  }
  torch::jit::Stack stack = node_stack(
      node, [&](size_t, const RecordedInput& input) { return input_tensor(input, device); },
      device);
  if (node.draws && !config_.counter_rng &&
      node.draws->kind == RecordedDraws::Kind::kCudaGenerator) {
    call_on_cuda_generator(node, stack, device);
    keep_outputs(index, node, stack);
    return 1;
  }
  at::Generator own;
  if (node.draws && node.draws->generator_argument >= 0) {
    own = own_generator(node);
    stack.at(static_cast<size_t>(node.draws->generator_argument)) = own;
  } else if (node.draws && !config_.counter_rng) {
    place_generator(*node.draws);
  }
  const AmbientStateGuard ambient(node.ambient);
  int64_t ran = 1;
  if (node.draws && !config_.counter_rng && !device.is_cpu()) {
    call_on(node, stack, c10::Device(c10::kCPU), device);
  } else if (node.draws && !config_.counter_rng) {
    ran = run_fill_in_parts_from(position, stack, device);
    if (ran == 0) {
      node.op.callBoxed(&stack);  // Note [Torch-mode fills in parts] says when it runs whole
      ran = 1;
    }
  } else if (node.draws == nullptr && outside_aten(node)) {
    call_watching_the_default_generator(node, stack);  // Note [An untagged op that draws]
  } else {
    node.op.callBoxed(&stack);
  }
  if (node.draws && node.draws->end_anchor >= 0 && !config_.counter_rng) {
    offer_end_anchor(*node.draws, own.defined() ? own : at::detail::getDefaultCPUGenerator());
  }
  keep_outputs(index, node, stack);
  return ran;
}

// Keeps what node `index` returned for the storages it creates in this replay.
void GraphReplay::keep_outputs(int64_t index, const RecordedNode& node,
                               const torch::jit::Stack& stack) {
  size_t output = 0;
  for (size_t i = 0; i < stack.size(); ++i) {
    map_tensors(stack[i], [&](const at::Tensor& t) {
      const int64_t value = output < node.outputs.size() ? node.outputs[output] : -1;
      ++output;
      if (value < 0 || !t.defined()) {
        return t;
      }
      const int64_t storage = storage_of_value(value);
      if (graph_->storages()[storage].creator == index && to_replay_.count(storage)) {
        check_replayed_output(node, graph_->values()[value], t);
        replayed_[storage] = t.storage();
      }
      return t;
    });
  }
}

// A value-dependent sampler just ran on `generator` (the default CPU generator, or the op's
// private one: Note [Followed generators]): the state it left is its lazy end anchor (Note [Lazy
// RNG anchors]), which need not be computed again.
void GraphReplay::offer_end_anchor(const RecordedDraws& draws, at::Generator generator) {
  at::Tensor state;
  {
    const std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state();
  }
  graph_->rng_anchor(draws.end_anchor)->offer(state);
}

void GraphReplay::run(const ForeignValues& foreign,
                      const std::function<void(const std::string&)>& on_node) {
  // Note [Replays that lend themselves the default generator]: a replay that draws nothing from
  // it neither marks nor restores it, so it runs beside any other thread's.
  const RecordedNode* first_user = nullptr;
  bool counter_draws_nothing = true;
  for (const int64_t index : nodes_) {
    const RecordedNode& node = graph_->nodes()[index];
    if (first_user == nullptr && uses_default_generator(node, config_.counter_rng)) {
      first_user = &node;
    }
    counter_draws_nothing = counter_draws_nothing && !uses_default_generator(node, true);
  }
  std::optional<DefaultGeneratorReplayMark> lending;
  std::optional<GeneratorLoan> restore_generator;
  if (first_user != nullptr) {
    lending.emplace(op_name(*first_user), !config_.counter_rng && counter_draws_nothing);
    restore_generator.emplace();
  }
  foreign_ = &foreign;
  RealOnlyGuard real_only;
  c10::AutoGradMode no_grad(false);
  for (auto position = nodes_.begin(); position != nodes_.end();) {
    for (int64_t ran = run_node(position); ran > 0; --ran, ++position) {
      if (on_node) {
        on_node(op_name(graph_->nodes()[*position]));
      }
    }
  }
  foreign_ = nullptr;
  for (const c10::DeviceIndex device : cuda_generators_) {
    // Note [Torch-mode draws on CUDA]. The values are computed: a debt that cannot be paid (a
    // sampler that fails on scratch) leaves CUDA's generator owed, and says why.
    try {
      pay_cuda_generator_debt(device);
    } catch (const c10::Error& e) {
      TORCH_WARN("torchdefer: CUDA's generator on cuda:", static_cast<int>(device),
                 " stays where the recording left it, not where eager construction leaves it: ",
                 e.what_without_backtrace());
    }
  }
  views_.reserve(targets_.size());
  for (size_t i = 0; i < targets_.size(); ++i) {
    const RecordedValue& value = graph_->values()[target_values_[i]];
    // Note [Shared storage stays shared]: a target whose storage is already real becomes a view
    // of that storage even when this replay recomputed it (to read an older version of it).
    const auto available = available_.find(value.storage);
    const c10::Storage& real =
        available != available_.end() ? available->second : real_storage(value.storage);
    const at::Tensor& t = targets_[i];
    views_.push_back(
        t.defined() ? view_of(real, t.sizes(), t.strides(), t.storage_offset(), t.scalar_type())
                    : view_of(real, value.sizes, value.strides, value.storage_offset, value.dtype));
  }
}

void GraphReplay::commit() noexcept {
  for (size_t i = 0; i < targets_.size(); ++i) {
    FakeTensorImpl* impl = targets_[i].defined() ? fake_impl(targets_[i]) : nullptr;
    if (impl == nullptr) {
      continue;  // a value computed for the caller, or listed twice (a tied weight), already real
    }
    const int64_t storage = storage_of_value(target_values_[i]);
    if (available_.count(storage) == 0) {
      graph_->set_real_storage(storage, views_[i].storage());
    }
    impl->materialize(views_[i].getIntrusivePtr());
  }
}

}  // namespace torchdefer::detail
