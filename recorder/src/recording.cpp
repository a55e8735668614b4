// Recording: the boxed fallbacks that append every operator on fakes to an OpGraph (composite ops
// at kDeferredInitKey, every other op at kFakeKey), and the Recording that deferred_init opens.
#include <torchdefer/boxed_arguments.h>
#include <torchdefer/core_kernels.h>
#include <torchdefer/cuda_draws.h>
#include <torchdefer/data_dependent_ops.h>
#include <torchdefer/fake_tensor_impl.h>
#include <torchdefer/generator_sharing.h>
#include <torchdefer/op_graph.h>
#include <torchdefer/op_table.h>
#include <torchdefer/recording.h>
#include <torchdefer/rng_anchors.h>
#include <torchdefer/torch_compat.h>

#include "deregistrations.h"
#include "recorder_kernels.h"
#include "torch_rng.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <c10/util/StringUtil.h>
#include <c10/util/flat_hash_map.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchdefer {
namespace {

// The graph the innermost Recording on this thread records into.
thread_local std::shared_ptr<OpGraph> tls_graph;

// Where the recorded nodes of one recording hold a real tensor by reference: node and input
// index, by the tensor's storage (Note [Real tensors written while recording]).
struct RealRead {
  int64_t node;
  size_t input;
};
struct OpenRecording {
  OpGraph* graph;  // alive while its Recording is
  std::unordered_map<const c10::StorageImpl*, std::vector<RealRead>> real_reads;
};

// The Recordings open on this thread, innermost last.
thread_local std::vector<OpenRecording> tls_open_recordings;

// Set while a call the recorder took runs below it (Note [Where an op is recorded]).
thread_local bool tls_below_recorded_call = false;

class BelowRecordedCall {
 public:
  BelowRecordedCall() : saved_(tls_below_recorded_call) { tls_below_recorded_call = true; }
  ~BelowRecordedCall() { tls_below_recorded_call = saved_; }
  BelowRecordedCall(const BelowRecordedCall&) = delete;
  BelowRecordedCall& operator=(const BelowRecordedCall&) = delete;

 private:
  bool saved_;
};

// Note [Reading values while recording]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Model code reads small tensors while it builds itself: drop-path schedules are
// `[x.item() for x in torch.linspace(0, rate, depth)]` in timm and in many transformers vision
// models, and a constructor may branch on `torch::rand({1}).item<double>()`. Under deferred_init
// those tensors are fakes and have no values, so the Fake layer would refuse such an op
// (value_reading_api()). Instead, when a data-dependent op's fake arguments are all fakes of the
// recording in progress on this thread, the recorder asks the value reader for a real, private
// copy of each, runs the op on the copies with both of torchdefer's keys excluded, and returns the
// real result: a Scalar for item(), a real tensor for nonzero() (which later recorded ops capture
// as any real input). The op itself is not recorded: whatever it produced is real.
//
// The reader (the recording's, given by the entry layer: Note [Who reads values]) replays the
// history of that value once, on CPU, in torch RNG mode, into storages nobody else sees, and
// commits nothing: the fakes stay fake, the recording is unchanged, and the default generator is
// restored to where the recorder keeps it (Note [Torch-mode draw offsets]), so materialization and
// code after deferred_init see exactly what they would have without the read. The cost is that
// replay, per read: fine for the small tensors model code reads, a full computation for a large
// one.
//
// The value read is always the torch-mode one, eager's values on CPU, even for a model that will
// be materialized in counter RNG mode: the read decides control flow during construction, which
// must follow eager's so that the recording is the one eager construction would have made. (A
// value that came from a random op on an accelerator device is eager's CPU value, not that
// device's.) Fakes of a plain FakeMode, or of another recording than the one in progress, record
// nothing to replay here, and data-dependent ops on them are refused as before.
//
// A recording outlives its deferred_init call: the ops run on its fakes afterwards are appended to
// it (torchtitan-style code constructs first and runs init_weights() after), so outside any
// Recording a data-dependent op whose fakes all belong to one recording reads them the same
// way, from that recording's graph as it stands. Eager would have read the values at this point of
// the program, after the ops recorded so far, which is exactly what the replay computes.

// A real tensor whose memory nobody owns (at::from_blob without a deleter) may be freed or
// rewritten by its owner at any time after construction; the recorder keeps a copy instead.
bool is_borrowed_memory(const at::Tensor& t) {
  return t.has_storage() && t.storage().data() != nullptr &&
         t.storage().data_ptr().get_context() == nullptr;
}

// Note [What the recorder knows of an operator]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every recorded call asks the same questions of its operator: does it draw random numbers, may
// it read values, which arguments does it write. The answers come from the schema's tags and
// alias annotations and from the op table; asking them anew costs a scan of the tags and string
// hashing per call, several times per call, which was a visible share of recording a model of
// thousands of ops. So they are computed once per operator and thread (Note [Operators known by
// their schema's address], deregistrations.h).
// Its base holds what the Fake layer would ask again, handed down to it (Note [A caller that knows
// the operator]): `random` and `may_read_values`, false when value_reading_api() answers nullopt
// whatever the arguments.
struct OperatorFacts : detail::KnownOperator {
  std::string name;
  std::string overload_name;
  // Per schema argument. Bytes, not std::vector<bool>: every recorded call reads it per argument,
  // and a bit vector's indexing was a visible share of scanning the stack.
  std::vector<uint8_t> written;
  BitView bit_view = BitView::kNone;  // Note [Conjugate and negative views of fakes]
  // Recorded as the ops its composite kernel calls (Note [Composite ops that read values inside]).
  bool records_its_parts = false;
  // Recorded by CommonCall: none of the traits above that need the Recorder's general path, at
  // most one result, a tensor, and at most one written argument, the first, which the op returns
  // (Note [The common call]).
  bool common = false;
  // The schema returns one tensor (for CommonCall, whose operators return one or nothing).
  bool returns_tensor = false;
  // A result is a tensor the call makes (a view included), not an argument it writes and returns,
  // and whether one is a view (Note [Inference mode while recording]).
  bool returns_new_tensor = false;
  bool returns_view = false;
  // The arguments that can hold a generator (generator_argument_kind()), and whether the op's
  // random-op placement can follow them: one `Generator`/`Generator?` of a random op (Note [A
  // generator recording cannot follow]).
  std::vector<int32_t> generator_arguments;
  bool generators_followed = true;
  // The bool argument without which the op table's unmarked writes are not made, and those
  // writes (Note [Writes the schema does not show], core/src/op_table.cpp).
  int32_t unmarked_writes_when = -1;
  uint32_t unmarked_writes = 0;
};

// Whether `schema` has the shape CommonCall records (OperatorFacts::common).
bool has_common_shape(const c10::FunctionSchema& schema, const std::vector<uint8_t>& written) {
  const auto& returns = schema.returns();
  if (returns.size() > 1 ||
      (returns.size() == 1 && returns[0].type()->kind() != c10::TypeKind::TensorType)) {
    return false;
  }
  const auto writes = std::count(written.begin(), written.end(), uint8_t{1});
  if (writes == 0) {
    return true;
  }
  if (writes > 1 || written[0] == 0 || returns.size() != 1) {
    return false;
  }
  const c10::AliasInfo* argument = schema.arguments()[0].alias_info();
  const c10::AliasInfo* result = returns[0].alias_info();
  return argument != nullptr && result != nullptr && argument->isWrite() && result->isWrite() &&
         argument->beforeSets() == result->beforeSets();
}

OperatorFacts facts_of_schema(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  OperatorFacts facts;
  facts.name = schema.name();
  facts.overload_name = schema.overload_name();
  facts.random = is_random(op);
  const OpInfo* info = find_op_info(std::string_view(schema.name()));
  facts.records_its_parts = info != nullptr && info->records_its_parts;
  facts.bit_view = info != nullptr ? info->bit_view : BitView::kNone;
  if (info == nullptr || info->values == ValueRule::kFromTags) {
    facts.may_read_values = value_reading_api(op, {}).has_value();
  }
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    facts.written.push_back(writes_argument(schema, i) ? 1 : 0);
  }
  if (info != nullptr && !info->unmarked_writes_when.empty()) {
    const std::optional<int> when = schema.argumentIndexWithName(info->unmarked_writes_when);
    TORCH_INTERNAL_ASSERT(when.has_value(), "torchdefer: ", schema.name(), " has no argument ",
                          info->unmarked_writes_when);
    facts.unmarked_writes_when = *when;
    facts.unmarked_writes = info->unmarked_writes;
  }
  facts.returns_tensor = schema.returns().size() == 1 &&
                         schema.returns()[0].type()->kind() == c10::TypeKind::TensorType;
  for (const c10::Argument& r : schema.returns()) {
    const c10::TypePtr& type = r.type();
    const bool tensors = type->kind() == c10::TypeKind::TensorType ||
                         (type->kind() == c10::TypeKind::ListType &&
                          type->containedType(0)->kind() == c10::TypeKind::TensorType);
    if (tensors && (r.alias_info() == nullptr || !r.alias_info()->isWrite())) {
      facts.returns_new_tensor = true;
      facts.returns_view = facts.returns_view || r.alias_info() != nullptr;
    }
  }
  bool one_generator = true;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const GeneratorArgument kind = generator_argument_kind(schema.arguments()[i]);
    if (kind != GeneratorArgument::kNone) {
      one_generator = one_generator && kind == GeneratorArgument::kOne;
      facts.generator_arguments.push_back(static_cast<int32_t>(i));
    }
  }
  facts.generators_followed =
      facts.generator_arguments.empty() ||
      (facts.random && one_generator && facts.generator_arguments.size() == 1);
  facts.common = facts.generators_followed && !facts.records_its_parts && !facts.may_read_values &&
                 facts.bit_view == BitView::kNone && has_common_shape(schema, facts.written);
  return facts;
}

struct FactsEntry {
  uint64_t deregistrations = 0;  // the count when `facts` were asked
  std::unique_ptr<OperatorFacts> facts;
};

const OperatorFacts& facts_of(const c10::OperatorHandle& op) {
  // The last operators asked, by their schema's address: a model's construction calls a handful
  // of operators over and over, and a hash map lookup was a visible share of recording one call.
  // Plain data, so that reaching it costs no thread_local initialization check.
  struct Recent {
    const c10::FunctionSchema* schema;
    const OperatorFacts* facts;
    uint64_t deregistrations;
  };
  thread_local Recent recent[64];
  const c10::FunctionSchema* schema = &op.schema();
  const uint64_t now = detail::deregistrations_so_far();
  Recent& slot = recent[(reinterpret_cast<uintptr_t>(schema) >> 4) % 64];
  if (slot.schema == schema && slot.deregistrations == now) {
    return *slot.facts;
  }
  // By pointer, so that an entry stays where it is while ops run under a recorder that holds it.
  thread_local ska::flat_hash_map<const c10::FunctionSchema*, FactsEntry> known;
  FactsEntry& entry = known[schema];
  if (entry.facts == nullptr || entry.deregistrations != now) {
    entry.facts = std::make_unique<OperatorFacts>(facts_of_schema(op));
    entry.deregistrations = now;
  }
  slot = Recent{schema, entry.facts.get(), now};
  return *entry.facts;
}

// Calls `f` on every tensor map_tensors() visits in `value`, in the same order, without building
// a mapped copy.
template <typename F>
void for_each_tensor(const c10::IValue& value, const F& f) {
  if (value.isTensor()) {
    f(value.toTensor());
    return;
  }
  if (!value.isList()) {
    return;
  }
  // A Tensor[] holds only tensors (an undefined one too is tagged a tensor), so asking each
  // element visits what map_tensors() visits, without isTensorList(), a call.
  for (const c10::IValue& element : value.toListRef()) {
    if (element.isTensor()) {
      f(element.toTensor());
    }
  }
}

// Note [Real tensors written while recording]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Construction creates real tensors too (torch.tensor(data), BatchNorm's num_batches_tracked,
// results of ops on real tensors alone) and may write into them: `t.copy_(torch.randn(3))`,
// nn.init.sparse_ indexing a real weight with a recorded randperm, `num_batches_tracked += 1`
// after a recorded op read it. Such a tensor stays real: its TensorImpl is a plain one that model
// code holds and may read at any moment (item(), numpy(), a real op), so it cannot turn fake, and
// it must hold what eager construction gave it from the write on. So the recording takes it in
// two ways:
//
//  1. A write of this recording's values into a real tensor runs now, on the values: the
//     recorder reads each fake argument as Note [Reading values while recording] does (eager's
//     values, whatever RNG mode materializes the model later) and runs the op on the copies, after
//     settling the generator if the op draws. The real tensor then holds eager's values, and
//     recorded ops that read it later hold it as any real input. In counter RNG mode its values
//     are still the torch-mode ones: it is a constant of the recording, the same for every rank,
//     so shards still concatenate to the full model. Fakes of another recording or of a FakeMode
//     have no values to read; the Fake layer refuses those writes as before.
//  2. A recorded node holds a real input by reference, so that the graph costs no bytes per
//     element. When construction is about to write into a real tensor that recorded nodes read
//     (any in-place or out= op reaches the recorder while a Recording is open, recorded or
//     not), the recorder first gives those nodes a private copy of the contents they read (a
//     constant, as for borrowed memory). Eager's order of reads and writes is kept, and the copy
//     costs the tensor's bytes once, only for real tensors construction both reads and rewrites.
//     The recorder finds those nodes by storage, so a write through another view or through
//     `.data` (a new version counter) is caught too. A write after deferred_init returned does not
//     pass the recorder; materialization sees the changed version and refuses, as before.

// Note [Recording an op]
// ~~~~~~~~~~~~~~~~~~~~~~
// The recorder sees each call where it is still the call the model's code made (Note [Where an op
// is recorded]): aten::linear, not the aten::addmm its composite kernel decomposes into. It
// records the call only when the call involves fakes: a factory under a Recording, or an op
// with a fake argument, before or after deferred_init returned (every recorded fake carries
// kDeferredInitKey, so `m->to(torch::kBFloat16)` or tying weights afterwards is recorded too).
// Ops on real tensors alone are real computations and run unrecorded. The op then runs below the
// recorder with kDeferredInitKey excluded, so the ops a composite kernel calls are not recorded a
// second time; the Fake layer computes the outputs, and the recorder annotates each output fake
// with its value and adds kDeferredInitKey to it. Arguments are classified before the op runs:
// an in-place op must be recorded reading the input's old value and the real tensors' versions
// as they were. A random op is placed on its generator (Note [Torch-mode draw offsets]) before its
// node joins the graph: one that cannot be placed (an explicit generator of another device, a
// scratch run that fails) leaves no node behind, and placing needs no copy of a node in the graph.
// Under the graph's lock the recorder then appends, in one pass, the call's writes and outputs
// (which name the node by the index it is about to get) and the node itself, finding each fake's
// FakeTensorImpl once; nothing between them checks or refuses, so no half-appended node remains.
//
// Note [Where an op is recorded]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// kDeferredInitKey sits above autograd (Note [Dispatch keys]) so that the recorder sees a
// composite op before its CompositeImplicitAutograd kernel decomposes it. For every other op the
// kernels between that key and kFakeKey (autograd, ADInplaceOrView, autocast, ...) pass the call
// itself down, so at the Fake key it is the same call, and seeing it there is cheaper: a boxed
// fallback on kDeferredInitKey boxes the arguments, unboxes them into autograd's kernel and boxes
// them again for the Fake fallback, ~550 instructions a call, a sixth of what recording a
// Llama-70B added to its FakeMode construction (docs/results.md). So when the library loads, every
// op registered by then that has no CompositeImplicitAutograd kernel (and is not one the op table
// records as its parts) falls through kDeferredInitKey, and the Fake fallback records its calls
// before the Fake layer computes them. Composite ops, ops registered later (custom ops, Python
// libraries) and the op table's `records_its_parts` ops keep the kDeferredInitKey fallback. A call
// either fallback records runs below it with the key excluded and a thread-local mark set, and the
// Fake fallback records only calls made outside such a call. The mark is the recorder's own: the
// key's exclusion would not do, since torch's Python key runs a TorchDispatchMode's or a tensor
// subclass's __torch_dispatch__ with every key above it excluded, kDeferredInitKey among them,
// and the calls such a handler makes (the op itself, or what a mode computes instead) are the
// calls eager runs, to be recorded as any other.
//
// What differs for a call recorded at the Fake key: autograd and ADInplaceOrView run before the
// recorder and finish after it (versions of written tensors are bumped after the recorder read
// them, as before; a view's autograd metadata is set on the annotated fake, and a detached copy
// keeps its annotation and keys).

// Note [Composite ops under autocast]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under torch.autocast, autocast's kernels (below kDeferredInitKey) cast the inputs of the ops
// they know and run them in the cast dtype. A composite op recorded above them would replay, with
// no autocast around the replay, in the dtype of its inputs: aten::linear produced Float where
// the recording saw BFloat16 and was refused at materialization, and F.bilinear, whose own
// kernel autocast does not know but whose parts it casts, replayed silently different values.
// So while autocast is enabled on this thread, a composite call is not recorded itself: it runs
// down with the key left in place, and the calls below it (autocast's casts, the op run in the
// cast dtype, or its decomposition) are recorded, each as eager ran it. Ops without a composite
// kernel are recorded at the Fake key, below autocast, already (Note [Where an op is recorded]);
// what their kernels dispatch below is autocast's too, which replay repeats (Note [Ambient state
// is part of the recording]).

// The same holds under a TorchDispatchMode: the mode sees a composite's parts, not the composite,
// and may compute something else for them (or count them, or draw); recording the composite whole
// would replay eager's kernel without the mode. So while a mode is on the stack (torch then
// includes the Python key on this thread), a composite call passes down as under autocast.
bool dispatch_mode_on() {
  return c10::impl::tls_local_dispatch_key_set().included_.has(c10::DispatchKey::Python);
}

// Note [Inference mode while recording]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A tensor made under torch.inference_mode() (a factory's, a functional op's) is an inference
// tensor: eager code may not use it in autograd or write it outside inference mode, and
// is_inference() says so. A recorded result is a fake, and materialization makes ordinary tensors,
// so a model that holds such a tensor would come back different from eager's, silently. Most such
// tensors are temporaries, though (nn.init.orthogonal_'s, `w.copy_(torch.ones(...))`'s), whose
// values are all that reaches the model, as in eager. So the recorder marks the values a call
// makes while inference mode is on (OpGraph::is_inference_value), and materialization refuses a
// module tensor that is one, or that views the storage one made (a view or detach() of an
// inference tensor is one, taken in inference mode or not), naming it (materialize.cpp); Python's
// deferred_init refuses it when it returns. A view of a fake cannot be made in inference mode
// (autograd gives it its base's version counter, which a fake made in inference mode cannot
// take, while eager makes a view of an ordinary tensor an ordinary one): a view op recorded at the
// Fake key is refused before it runs, and a composite one (view_as, reshape) when a view made
// below it failed; a composite's view that was made (below it, autograd is off) records unmarked,
// since the storage it views decides (nn.init.orthogonal_ writes through one). A composite that
// may return a view but returns its argument (`.to()` of a fake's own dtype) records too.
// Writes into existing fakes make no tensor, and calls on real tensors only run for real and give
// eager's inference tensors.
C10_NOINLINE bool inference_mode_on() { return c10::InferenceMode::is_enabled(); }

// Refuses a view made in inference mode (Note [Inference mode while recording]), `cause` the
// error the call raised, if it ran.
[[noreturn]] C10_NOINLINE void refuse_view_in_inference_mode(const c10::OperatorHandle& op,
                                                             const OpGraph* graph,
                                                             const c10::Error* cause) {
  TORCH_CHECK(false, "torchdefer: ", op.schema().operator_name(),
              " was called under torch.inference_mode() on ",
              graph != nullptr ? "fakes of " + graph->context() : std::string("fakes"),
              ": it makes a view, which torchdefer's fakes cannot make in inference mode",
              cause != nullptr ? std::string(" (") + cause->what_without_backtrace() + ")" : "",
              ". Build the module outside inference_mode (torch.no_grad() records the same "
              "initialization), or make this view after materializing.");
}

// Whether a call of `facts`' operator about to be recorded makes a tensor while inference mode is
// on; a view op at the Fake key is refused here, before it runs, since autograd would fail after
// it. Out of line but for the operator's fact, so that the recorder's hot path stays as the
// compiler laid it out.
inline bool makes_inference_tensor(const c10::OperatorHandle& op, const OperatorFacts& facts,
                                   const OpGraph* graph, bool at_fake_key) {
  if (!facts.returns_new_tensor || !inference_mode_on()) {
    return false;
  }
  if (facts.returns_view && at_fake_key) {
    refuse_view_in_inference_mode(op, graph, nullptr);
  }
  return true;
}

// How many values recordings made in inference mode (inference_tensors_made()).
std::atomic<uint64_t> inference_values{0};

// Marks the values node `node` made among `outputs` (Note [Inference mode while recording]); not
// an argument it returned, which it did not make. Under the graph's lock.
C10_NOINLINE void mark_inference_values(OpGraph& graph, int64_t node,
                                        c10::ArrayRef<int64_t> outputs) {
  for (const int64_t value : outputs) {
    if (value >= 0 && graph.values()[value].node == node) {
      graph.add_inference_value(value);
      inference_values.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

// Where a Recorder sees its call (Note [Where an op is recorded]).
enum class Position {
  kAboveAutograd,  // the kDeferredInitKey fallback: ops that decompose above autograd
  kAtFakeKey,      // the kFakeKey fallback, before the Fake layer: every other op
};

// A tensor argument of a recorded call: where the stack holds it (until the call pops it), and
// what scan_arguments() found it to be.
struct SeenTensor {
  const at::Tensor* tensor;
  FakeTensorImpl* fake;          // nullptr for a real or undefined tensor
  const RecordedFake* recorded;  // a fake's recording, if any
};

// A fake the call writes, held until the call is recorded.
struct WrittenFake {
  at::Tensor tensor;
  FakeTensorImpl* fake;
  const RecordedFake* recorded;
};

// A list argument (sizes, dims) that holds no tensor and that only the stack refers to: the node
// can keep the list itself instead of a copy, since nothing else can change it once the call
// pops it (the kernels below read list arguments). A list held elsewhere too (a TorchScript
// list variable) is copied, as before: its owner may change it after the call.
bool is_private_list_of_no_tensors(const c10::IValue& argument) {
  if (!argument.isList() || argument.use_count() != 1) {
    return false;
  }
  const c10::ArrayRef<c10::IValue> elements = argument.toListRef();
  return std::none_of(elements.begin(), elements.end(),
                      [](const c10::IValue& element) { return element.isTensor(); });
}

// Note [An output that is its input's value]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An in-place op returns the fake it wrote, seen as before: the same storage through the same
// geometry. A value is a view of a storage, not a version of it (Note [The op graph]): replay
// reads a storage as the nodes recorded before the reader left it. So an output fake that this
// graph recorded before and that still views its value's storage exactly as that value does
// keeps the value, with no new value or annotation: the common case of initialization, where
// every weight is written four or five times in place. An op that changed the fake's geometry
// (t_, resize_, as_strided_, set_) makes a new value, as every other output.
// Whether `fake` views the storage of value `value` through the same geometry; the storage is the
// caller's to check.
inline bool same_geometry(const RecordedValue& value, const at::Tensor& fake) {
  const c10::IntArrayRef sizes = fake.sizes();
  const c10::IntArrayRef strides = fake.strides();
  if (sizes.size() != value.sizes.size()) {
    return false;
  }
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] != value.sizes[d] || strides[d] != value.strides[d]) {
      return false;
    }
  }
  return fake.storage_offset() == value.storage_offset && fake.scalar_type() == value.dtype &&
         fake.device() == value.device;
}

bool still_views(const OpGraph& graph, int64_t known, const FakeTensorImpl& impl,
                 const at::Tensor& fake) {
  const RecordedValue& value = graph.values()[known];
  return graph.storages()[value.storage].identity.unsafeGetStorageImpl() ==
             impl.storage_identity() &&
         same_geometry(value, fake);
}

// Appends the fake `t` (whose FakeTensorImpl is `impl`) as an output of node `index` and
// annotates it with its value (Note [Annotations live in the graph]); `known` as for add_output.
int64_t add_recorded_output(OpGraph& graph, const std::shared_ptr<OpGraph>& owner, int64_t index,
                            FakeTensorImpl& impl, const at::Tensor& t, int64_t known) {
  const int64_t value = graph.add_output(index, impl, t, known);
  impl.set_annotation(std::shared_ptr<const FakeAnnotation>(owner, &graph.annotation(value)));
  impl.include_dispatch_key(kDeferredInitKey);
  return value;
}

// Where a call on fakes of `graph` is recorded, for messages: inside its deferred_init, or after.
std::string recorded_where(const OpGraph& graph) {
  return &graph == tls_graph.get()
             ? " in deferred_init of " + graph.context()
             : " on a fake recorded by deferred_init of " + graph.context() + ", outside that call";
}

// The value of output `t` (whose FakeTensorImpl is `impl`, recorded as `rec` if at all) of node
// `index` in `graph`: its own value while it still views it (Note [An output that is its input's
// value]), else a new one.
int64_t output_value(OpGraph& graph, const std::shared_ptr<OpGraph>& owner, int64_t index,
                     FakeTensorImpl& impl, const at::Tensor& t) {
  const RecordedFake* rec = recorded(impl);
  const int64_t known = rec != nullptr && rec->graph == &graph ? rec->value : -1;
  if (known >= 0 && still_views(graph, known, impl, t)) {
    return known;
  }
  return add_recorded_output(graph, owner, index, impl, t, known);
}

// What a recorded call that failed below the recorder adds to its error.
std::string while_recording(const c10::FunctionSchema& schema, const OpGraph& graph) {
  return "torchdefer: while recording " + c10::toString(schema.operator_name()) +
         recorded_where(graph);
}

class Recorder {
 public:
  Recorder(const c10::OperatorHandle& op, const OperatorFacts& facts, torch::jit::Stack* stack,
           Position position)
      : position_(position),
        op_(op),
        schema_(op.schema()),
        facts_(facts),
        stack_(*stack),
        first_argument_(stack_.size() - schema_.arguments().size()) {}

  void run(c10::DispatchKeySet keys) {
    scan_arguments();
    refuse_bit_views();
    keep_what_recorded_nodes_read();
    if (reads_values_of_recording() || writes_recorded_values_into_real()) {
      run_on_values();
      return;
    }
    if (graph_ == nullptr) {
      if (facts_.random) {
        settle_before_a_real_draw();  // an unrecorded op is about to draw
      }
      redispatch(keys);
      return;
    }
    if (!has_fake_ && has_real_ && !makes_tensor_from_meta_template(op_, arguments())) {
      run_real(keys);
      return;
    }
    if (position_ == Position::kAboveAutograd &&
        (facts_.records_its_parts || autocast_on_now() || dispatch_mode_on())) {
      // Note [Composite ops that read values inside], Note [Composite ops under autocast]: the
      // kernel's calls pass this key again.
      op_.redispatchBoxed(
          keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kDeferredInitKey), &stack_);
      return;
    }
    refuse_generators_recording_cannot_follow();
    inference_ = makes_inference_tensor(op_, facts_, graph_, position_ == Position::kAtFakeKey);
    describe_call();
    redispatch(keys);
    record();
  }

 private:
  // Note [Conjugate and negative views of fakes]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // `conj()` of a complex tensor (also through `.mH`, `.H`, `adjoint()`) and `_neg_view` make views
  // that carry a conjugate or negative bit, which fakes do not keep; recording one would
  // materialize the plain values, a silent difference from eager. Found by the real-library suite's
  // conjugate deepcopy case. `.mH`,
  // `.H` and `adjoint()` are composites whose _conj runs below this key, so they are refused by
  // name for a complex input: the Python layer refuses them while recording, this catches them on
  // recorded fakes after deferred_init returned too, where `.mH` materialized unconjugated values.
  void refuse_bit_views() const {
    const bool makes_one =
        facts_.bit_view == BitView::kAlways ||
        (facts_.bit_view == BitView::kOfComplexInput && stack_[first_argument_].isTensor() &&
         stack_[first_argument_].toTensor().is_complex());
    if (!has_fake_ || !makes_one) {
      return;
    }
    TORCH_CHECK(false, "torchdefer: ", facts_.name, " of ",
                describe(stack_[first_argument_].toTensor()),
                " would make a conjugate or negative view of a fake, which fakes do not keep. "
                "Use conj_physical() (or neg()) instead, or compute it after materialization.");
  }

  // Note [A generator recording cannot follow]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A random op given a generator is placed on it and moves it as eager does (Note [Explicit
  // generators], torch_rng.cpp), which needs one generator, in one `Generator`/`Generator?`
  // argument, of an op that recording knows draws: ATen's nondeterministic_seeded tag (every ATen
  // op with a Generator argument has it; inductor's internal inductor_reserve_rng_state aside).
  // Any other call given a generator would be recorded with its draws on none or only one of
  // them: an op of another library without the tag is recorded as drawing nothing, and one with
  // several generator arguments, or a list of them, has only one followed. Replay would then draw
  // from wherever those generators are, and both they and the values drawn would differ from
  // eager's, silently (for a generator other than the default CPU one, which replay cannot watch:
  // Note [An untagged op that draws], replay.cpp). So such a call is refused before it runs,
  // naming the op and the argument; given no generator it records as before.
  void refuse_generators_recording_cannot_follow() const {
    if (facts_.generators_followed) {
      return;
    }
    std::vector<std::string> given;
    for (const int32_t index : facts_.generator_arguments) {
      const c10::IValue& value = stack_[first_argument_ + index];
      const std::string& name = schema_.arguments()[index].name();
      if (value.isGenerator()) {
        given.push_back("'" + name + "'");
      } else if (value.isList()) {
        const c10::List<c10::IValue> list = value.toList();
        for (size_t k = 0; k < list.size(); ++k) {
          if (list.get(k).isGenerator()) {
            given.push_back("'" + name + "'[" + std::to_string(k) + "]");
          }
        }
      }
    }
    if (given.empty()) {
      return;
    }
    const std::string arguments =
        (given.size() == 1 ? "argument " : "arguments ") + c10::Join(", ", given);
    TORCH_CHECK(facts_.random, "torchdefer: ", schema_.operator_name(), recorded_where(*graph_),
                " was given a generator (", arguments,
                ") but has no nondeterministic_seeded tag, so deferred_init would record it as an "
                "op that draws nothing: that generator, and the values drawn from it, would differ "
                "from eager's. Define the op with that tag (torch.library.Library.define(schema, "
                "tags=(torch.Tag.nondeterministic_seeded,)), or the tags of its TORCH_LIBRARY "
                "schema) and record the model again, or give it no generator, or call it after "
                "materializing.");
    TORCH_CHECK(false, "torchdefer: ", schema_.operator_name(), recorded_where(*graph_),
                " was given generators (", arguments,
                "), but recording follows one generator, given in a single Generator argument: "
                "those generators, and the values drawn from them, would differ from eager's. Give "
                "it one generator, or none, or call it after materializing.");
  }

  c10::ArrayRef<c10::IValue> arguments() const {
    return c10::ArrayRef<c10::IValue>(stack_).slice(first_argument_, schema_.arguments().size());
  }

  // The op table's unmarked writes that this call does not make (batch_norm when not training).
  uint32_t writes_not_made() const {
    if (facts_.unmarked_writes_when < 0) {
      return 0;
    }
    const c10::IValue& when = stack_[first_argument_ + facts_.unmarked_writes_when];
    return when.isBool() && !when.toBool() ? facts_.unmarked_writes : 0;
  }

  // One walk over the call's tensors, which every later step reads instead of the stack (Note
  // [Recording an op]).
  void scan_arguments() {
    graph_ = tls_graph.get();
    const uint32_t not_written = writes_not_made();
    for (size_t i = first_argument_; i < stack_.size(); ++i) {
      const size_t position = i - first_argument_;
      const bool written =
          facts_.written[position] && (position >= 32 || (not_written >> position & 1u) == 0);
      for_each_tensor(stack_[i], [&](const at::Tensor& t) {
        SeenTensor& seen = seen_.emplace_back(SeenTensor{&t, fake_impl(t), nullptr});
        if (!t.defined()) {
          return;
        }
        if (seen.fake == nullptr) {
          has_real_ = true;
          if (written) {
            written_real_.push_back(t);
          }
          return;
        }
        has_fake_ = true;
        seen.recorded = recorded(*seen.fake);
        if (written) {
          written_.push_back(WrittenFake{t, seen.fake, seen.recorded});
        }
        if (graph_ == nullptr && seen.recorded != nullptr) {
          // Held: the call may pop the only reference to this fake before record().
          graph_owner_ = seen.recorded->shared_graph();
          graph_ = seen.recorded->graph;
        }
      });
    }
  }

  // Note [Reading values while recording]: a data-dependent op on fakes of one recording only: the
  // one in progress on this thread, or, outside any, the one that recorded them.
  bool reads_values_of_recording() const {
    if (graph_ == nullptr || !has_fake_ || !facts_.may_read_values ||
        !value_reading_api(op_, arguments())) {
      return false;
    }
    std::vector<at::Tensor> fakes;
    for (const SeenTensor& seen : seen_) {
      if (seen.fake != nullptr) {
        fakes.push_back(*seen.tensor);
      }
    }
    if (answer_without_values(schema_.name(), fakes)) {
      return false;  // the Fake layer answers it without data
    }
    return all_fakes_recorded_by(graph_);
  }

  // Note [Real tensors written while recording]: an op writing values of this recording into
  // a real tensor.
  bool writes_recorded_values_into_real() const {
    return tls_graph != nullptr && has_fake_ && !written_real_.empty() &&
           all_fakes_recorded_by(tls_graph.get());
  }

  bool all_fakes_recorded_by(const OpGraph* graph) const {
    return std::all_of(seen_.begin(), seen_.end(), [&](const SeenTensor& seen) {
      return seen.fake == nullptr || (seen.recorded != nullptr && seen.recorded->graph == graph);
    });
  }

  // Note [Real tensors written while recording]: recorded nodes that read a real tensor this op
  // is about to write get a copy of what they read.
  void keep_what_recorded_nodes_read() {
    if (written_real_.empty()) {
      return;
    }
    for (OpenRecording& recording : tls_open_recordings) {
      for (const at::Tensor& t : written_real_) {
        if (t.has_storage()) {
          keep_reads_of(recording, t.storage().unsafeGetStorageImpl());
        }
      }
    }
  }

  static void keep_reads_of(OpenRecording& recording, const c10::StorageImpl* storage) {
    const auto found = recording.real_reads.find(storage);
    if (found == recording.real_reads.end()) {
      return;
    }
    OpGraph& graph = *recording.graph;
    const auto lock = graph.lock();
    for (const RealRead& read : found->second) {
      const RecordedInput& held = graph.nodes()[read.node].inputs[read.input];
      if (held.tensor.is_inference() || held.tensor._version() == held.version) {
        RealOnlyGuard real_only;
        RecordedInput copy;
        copy.kind = RecordedInput::Kind::kConstant;
        copy.tensor = held.tensor.detach().clone();
        graph.replace_input(read.node, read.input, std::move(copy));
      }
    }
    recording.real_reads.erase(found);
  }

  void run_on_values() {
    // Values are read on CPU. A write lands in the real tensor where it lives; other results
    // belong on the fakes' device.
    const std::optional<c10::Device> destination =
        written_real_.empty() ? std::nullopt
                              : std::optional<c10::Device>(written_real_[0].device());
    std::optional<c10::Device> device;
    try {
      for (size_t i = first_argument_; i < stack_.size(); ++i) {
        stack_[i] = map_tensors(stack_[i], [&](const at::Tensor& t) {
          if (!is_fake(t)) {
            return t;
          }
          device = device.value_or(t.device());
          const at::Tensor values = detail::read_values(t);
          return destination && !destination->is_cpu() ? values.to(*destination) : values;
        });
      }
    } catch (c10::Error& e) {
      e.add_context(c10::str(
          "torchdefer: while reading values for ",
          value_reading_api(op_, arguments()).value_or(std::string("a write into a real tensor")),
          " (", schema_.name(), ")", recorded_where(*graph_)));
      throw;
    }
    if (facts_.random) {
      settle_before_a_real_draw();  // it draws now, where eager would have drawn
    }
    RealOnlyGuard real_only;
    op_.callBoxed(&stack_);
    if (destination || device->is_cpu()) {
      return;
    }
    // The values were read on CPU; tensor results belong on the fakes' device.
    for (size_t i = stack_.size() - schema_.returns().size(); i < stack_.size(); ++i) {
      stack_[i] = map_tensors(stack_[i], [&](const at::Tensor& t) { return t.to(*device); });
    }
  }

  RecordedInput classify(const SeenTensor& seen) const {
    RecordedInput input;
    const at::Tensor& t = *seen.tensor;
    if (!t.defined()) {
      return input;
    }
    if (seen.fake != nullptr) {
      if (seen.recorded != nullptr && seen.recorded->graph == graph_) {
        input.kind = RecordedInput::Kind::kValue;
        input.value = seen.recorded->value;
      } else {
        input.kind = RecordedInput::Kind::kForeignFake;
        input.tensor = t;
      }
      return input;
    }
    if (t.is_meta()) {
      // Note [Factories of meta templates]: only its geometry is read, and it has nothing else to
      // capture; a tensor of its own keeps the call from seeing later changes to the template.
      RealOnlyGuard real_only;
      input.kind = RecordedInput::Kind::kConstant;
      input.tensor = at::empty_strided(t.sizes(), t.strides(), t.options());
      return input;
    }
    if (is_borrowed_memory(t)) {
      RealOnlyGuard real_only;
      input.kind = RecordedInput::Kind::kConstant;
      input.tensor = t.clone();
      return input;
    }
    input.kind = RecordedInput::Kind::kReal;
    input.tensor = t;
    input.version = t.is_inference() ? 0 : t._version();
    return input;
  }

  // Copies the call's arguments, each tensor replaced by a placeholder and classified, into the
  // recorder's buffers (the graph takes them in record()), before the call pops its arguments.
  void describe_call() {
    ambient_ = AmbientState::current();
    const bool random = facts_.random;
    if (random) {
      arguments_.reserve(seen_.size());
      for (const SeenTensor& seen : seen_) {
        arguments_.push_back(*seen.tensor);
      }
    }
    described_inputs_.reserve(seen_.size());
    for (const SeenTensor& seen : seen_) {
      described_inputs_.push_back(classify(seen));
    }
    for (size_t i = first_argument_; i < stack_.size(); ++i) {
      const c10::IValue& argument = stack_[i];
      if (argument.isTensor()) {
        described_arguments_.emplace_back(at::Tensor());  // without map_tensors' copy
        continue;
      }
      if (!argument.isList() || is_private_list_of_no_tensors(argument)) {
        described_arguments_.push_back(argument);  // holds no tensor
        continue;
      }
      described_arguments_.push_back(
          map_tensors(argument, [](const at::Tensor&) { return at::Tensor(); }));
    }
  }

  // The call describe_call() saw, as a node not yet in the graph (a view of this recorder's
  // buffers).
  RecordedNode described_node() const {
    return RecordedNode{op_, described_arguments_, described_inputs_, {}, nullptr, ambient_};
  }

  // The graph's owner: the recording in progress, or the one that recorded the fakes of a call
  // after its deferred_init returned.
  const std::shared_ptr<OpGraph>& graph_owner() {
    return graph_ == tls_graph.get() ? tls_graph : graph_owner_;
  }

  // Note [Ops on real tensors run for real]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // An op whose tensor arguments are all real is a real computation, recorded or not: it runs
  // with both of torchdefer's keys excluded. Excluding only kDeferredInitKey is not enough: a
  // composite kernel may call a factory for an argument that is not a tensor
  // (`torch.where(cond, t, 1.5)` wraps 1.5 into a 0-dim tensor), and under the FakeMode of the
  // recording that factory would return a fake that nothing records, turning the whole result
  // into a fake with no recorded origin.
  void run_real(c10::DispatchKeySet keys) {
    if (facts_.random && !only_meta_tensors()) {
      // An unrecorded op is about to draw: the generator must be where eager would have it. On
      // meta tensors (a meta build's reset_parameters) it draws nothing, and settling there would
      // pay an owed generator at eager's cost of every sampler it waits for.
      settle_before_a_real_draw();
    }
    RealOnlyGuard real_only;
    run_below(keys);
  }

  // The generators an unrecorded random op may draw from, where eager has them: the CPU's, and
  // CUDA's when it touches a CUDA tensor (Note [Torch-mode draws on CUDA]).
  void settle_before_a_real_draw() const {
    detail::settle_generator_exactly();
    const bool on_cuda = std::any_of(seen_.begin(), seen_.end(), [](const SeenTensor& seen) {
      return seen.tensor->defined() && seen.tensor->is_cuda();
    });
    if (on_cuda) {
      detail::pay_cuda_generator_debts();
    }
  }

  bool only_meta_tensors() const {
    return std::all_of(seen_.begin(), seen_.end(), [](const SeenTensor& seen) {
      return !seen.tensor->defined() || seen.tensor->is_meta();
    });
  }

  // Runs the call as if the recorder were not there: the kernels below its position.
  void run_below(c10::DispatchKeySet keys) {
    if (position_ == Position::kAtFakeKey) {
      detail::fake_fallback(op_, keys, &stack_, &facts_);
      return;
    }
    op_.redispatchBoxed(
        keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kDeferredInitKey), &stack_);
  }

  void redispatch(c10::DispatchKeySet keys) {
    c10::impl::ExcludeDispatchKeyGuard no_recording(kDeferredInitKey);
    BelowRecordedCall below;
    try {
      run_below(keys);
    } catch (c10::Error& e) {
      if (inference_ && facts_.returns_view) {
        refuse_view_in_inference_mode(op_, graph_, &e);  // a composite's view, made below it
      }
      if (graph_ != nullptr) {
        e.add_context(while_recording(schema_, *graph_));
      }
      throw;
    }
  }

  // The value the fake `impl` was recorded as in this graph, or -1 (Note [Finding a fake's
  // storage]).
  int64_t value_in_graph(const RecordedFake* rec) const {
    return rec != nullptr && rec->graph == graph_ ? rec->value : -1;
  }

  void record() {
    // Each output fake where the stack holds it (no reference count taken), or nullptr.
    c10::SmallVector<const at::Tensor*, 2> fake_outputs;
    const size_t first_return = stack_.size() - schema_.returns().size();
    bool produces_fakes = false;
    for (size_t i = first_return; i < stack_.size(); ++i) {
      for_each_tensor(stack_[i], [&](const at::Tensor& t) {
        const bool fake = fake_impl(t) != nullptr;
        produces_fakes = produces_fakes || fake;
        fake_outputs.push_back(fake ? &t : nullptr);
      });
    }
    if (!produces_fakes && written_.empty()) {
      return;
    }
    // Placing may read values or run the op (Note [Torch-mode draw offsets]), which takes the
    // graph's lock itself: it comes before the lock (Note [Recording an op]).
    std::optional<RecordedDraws> draws;
    if (facts_.random) {
      const at::Tensor& target =
          written_.empty() ? first_fake(fake_outputs) : written_.front().tensor;
      draws = detail::place_random_node(graph_owner(), described_node(), target, arguments_,
                                        tls_graph != nullptr);
    }
    const std::shared_ptr<OpGraph>& owner = graph_owner();
    const auto lock = graph_->lock();
    // One pass under the lock: the node's writes and outputs, which name it, then the node.
    const int64_t index = graph_->next_node();
    // Writes first: an in-place op on a fake this graph did not create returns that fake, which
    // must not become a value created by this node (its storage has no recorded origin).
    for (const WrittenFake& written : written_) {
      graph_->add_write(index, *written.fake, value_in_graph(written.recorded));
    }
    c10::SmallVector<int64_t, 2> outputs;
    for (const at::Tensor* t : fake_outputs) {
      if (t == nullptr) {
        outputs.push_back(-1);
        continue;
      }
      outputs.push_back(output_value(*graph_, owner, index, *fake_impl(*t), *t));
    }
    if (C10_UNLIKELY(inference_ && !facts_.returns_view)) {
      mark_inference_values(*graph_, index, outputs);
    }
    graph_->add_node(op_, described_arguments_, described_inputs_, outputs, ambient_);
    if (has_real_) {
      remember_real_reads(index);
    }
    if (draws) {
      graph_->set_draws(index, std::move(*draws));
    }
  }

  // Note [Real tensors written while recording]: which real tensors the recording in progress
  // holds by reference.
  void remember_real_reads(int64_t index) {
    if (tls_open_recordings.empty() || tls_open_recordings.back().graph != graph_) {
      return;  // recorded after deferred_init returned: later writes do not pass the recorder
    }
    auto& reads = tls_open_recordings.back().real_reads;
    const c10::ArrayRef<RecordedInput> inputs = graph_->nodes()[index].inputs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].kind == RecordedInput::Kind::kReal && inputs[i].tensor.has_storage()) {
        reads[inputs[i].tensor.storage().unsafeGetStorageImpl()].push_back({index, i});
      }
    }
  }

  static const at::Tensor& first_fake(c10::ArrayRef<const at::Tensor*> tensors) {
    return **std::find_if(tensors.begin(), tensors.end(),
                          [](const at::Tensor* t) { return t != nullptr; });
  }

  const Position position_;
  const c10::OperatorHandle& op_;
  const c10::FunctionSchema& schema_;
  const OperatorFacts& facts_;
  torch::jit::Stack& stack_;
  const size_t first_argument_;
  OpGraph* graph_ = nullptr;              // alive while the fakes of this call refer to it
  std::shared_ptr<OpGraph> graph_owner_;  // graph_'s owner after its deferred_init returned
  // describe_call(): the node's arguments, inputs and ambient state, until record() moves them
  // into the graph (Note [Where the graph keeps its lists]).
  c10::SmallVector<c10::IValue, 8> described_arguments_;
  c10::SmallVector<RecordedInput, 4> described_inputs_;
  AmbientState ambient_;
  // The call's tensor arguments (map_tensors order), as scan_arguments() found them.
  c10::SmallVector<SeenTensor, 4> seen_;
  c10::SmallVector<WrittenFake, 2> written_;  // the fakes the call writes, in map_tensors order
  bool inference_ = false;                    // Note [Inference mode while recording]
  c10::SmallVector<at::Tensor, 1> written_real_;
  std::vector<at::Tensor> arguments_;  // a random op's tensor arguments, in input order
  bool has_fake_ = false;
  bool has_real_ = false;  // a defined tensor that is no fake
};

// Note [The common call]
// ~~~~~~~~~~~~~~~~~~~~~~
// Nearly every call of a model's construction is a factory (empty, zeros) or an in-place
// initialization (uniform_, normal_, mul_, clamp_), made inside a Recording with fakes of
// that recording as its only tensors. The Recorder's general path asks every call what only rare
// calls need (real tensors read or written, values read, fakes of another recording, calls after
// deferred_init returned, composite ops, bit views), each a walk over the arguments or a look at
// the thread's state, and those walks were most of what recording added to a FakeMode
// construction (docs/results.md). So a call at the Fake key, on a thread with a Recording
// open, whose operator has none of the rare traits and a simple shape (OperatorFacts::common), is
// first described by CommonCall in one walk that checks as it goes that every tensor is absent
// or a fake of that recording. The first one that is not abandons the description, and the call
// goes the general way with nothing done. A described call is recorded exactly as the general
// path records it: the same node, writes, values and annotations. (A Python number arrives as a
// real 0-dim tensor, `w.mul_(0.5)` calling mul_.Tensor: such calls take the general path, which
// holds the real tensor as it holds any; C++'s `mul_(0.5)` is mul_.Scalar, a common call.)
class CommonCall {
 public:
  CommonCall(const c10::OperatorHandle& op, const OperatorFacts& facts, torch::jit::Stack& stack,
             OpGraph& graph)
      : op_(op), facts_(facts), stack_(stack), graph_(graph) {}
  CommonCall(const CommonCall&) = delete;
  CommonCall& operator=(const CommonCall&) = delete;
  // A description no node took is destroyed where it was constructed.
  ~CommonCall() {
    if (!kept_) {
      std::destroy_n(arguments_, argument_count_);
      std::destroy_n(inputs_, input_count_);
    }
  }

  // Describes the call in the graph's own lists (Note [A recording's own lists]); false, with
  // nothing else done, when it is not a common one.
  bool describe() {
    const size_t count = facts_.written.size();
    const size_t first = stack_.size() - count;
    arguments_ = graph_.own_arguments().room_for(count);
    inputs_ = graph_.own_inputs().room_for(count);  // a tensor list is no common call
    for (size_t i = 0; i < count; ++i) {
      const c10::IValue& argument = stack_[first + i];
      if (argument.isTensor()) {
        if (!describe_tensor(argument.toTensor(), facts_.written[i] != 0)) {
          return false;
        }
        continue;
      }
      if (argument.isList() && !is_private_list_of_no_tensors(argument)) {
        return false;  // a tensor list, or a list someone else holds (Recorder::describe_call)
      }
      new (arguments_ + argument_count_++) c10::IValue(argument);
    }
    ambient_ = AmbientState::current();
    return true;
  }

  void run(c10::DispatchKeySet keys) {
    inference_ = makes_inference_tensor(op_, facts_, &graph_, /*at_fake_key=*/true);
    {
      c10::impl::ExcludeDispatchKeyGuard no_recording(kDeferredInitKey);
      BelowRecordedCall below;
      try {
        detail::fake_fallback(op_, keys, &stack_, &facts_);
      } catch (c10::Error& e) {
        e.add_context(while_recording(op_.schema(), graph_));
        throw;
      }
    }
    record();
  }

 private:
  // Note [The written fake]
  // ~~~~~~~~~~~~~~~~~~~~~~~~
  // A common call that writes writes its first argument and returns it (OperatorFacts::common),
  // and for such an output the Fake layer returns the argument fake itself (fake_fallback.cpp,
  // step 5): after the call the stack's output holds the written fake. So CommonCall keeps that
  // fake by pointer, and a random op's written tensor is the output, with no reference of its own:
  // a reference taken and dropped per call is two atomic operations, and they were 1.8% of the
  // time of recording a Llama-70B (docs/results.md). The pointers are compared after the call,
  // before the fake is used; an output the call made cannot have the written fake's address,
  // since the Fake layer holds its arguments until it has made its outputs (FakeCall's tensors),
  // which a path of its own that let go of them earlier would have to keep true. A random op's
  // other tensor arguments (bernoulli's p) are held, since the call may pop their last reference.
  bool describe_tensor(const at::Tensor& t, bool written) {
    RecordedInput& input = *new (inputs_ + input_count_++) RecordedInput();
    new (arguments_ + argument_count_++) c10::IValue(at::Tensor());
    if (facts_.random) {
      if (written && t.defined()) {
        written_position_ = static_cast<int64_t>(random_tensors_.size());  // the call returns it
      } else {
        random_tensors_.push_back(t);
      }
    }
    if (!t.defined()) {
      return true;
    }
    FakeTensorImpl* fake = fake_impl(t);
    const RecordedFake* rec = fake != nullptr ? recorded(*fake) : nullptr;
    if (rec == nullptr || rec->graph != &graph_) {
      return false;
    }
    input.kind = RecordedInput::Kind::kValue;
    input.value = rec->value;
    if (written) {
      written_fake_ = fake;
      written_value_ = rec->value;
    }
    return true;
  }

  // A random op's tensor arguments in order, the written one being `output` (Note [The written
  // fake]); held copies only where an argument besides the written one needs them.
  c10::ArrayRef<at::Tensor> random_tensors(const at::Tensor& output) {
    if (written_position_ < 0) {
      return random_tensors_;
    }
    if (random_tensors_.empty()) {
      return c10::ArrayRef<at::Tensor>(output);
    }
    random_tensors_.insert(random_tensors_.begin() + written_position_, output);
    return random_tensors_;
  }

  void record() {
    const at::Tensor* output = facts_.returns_tensor ? &stack_.back().toTensor() : nullptr;
    FakeTensorImpl* const written_fake = written_fake_;
    // Note [The written fake]: the call returned the fake it wrote.
    TORCH_INTERNAL_ASSERT(written_fake == nullptr || output->unsafeGetTensorImpl() == written_fake,
                          "torchdefer: ", op_.schema().operator_name(),
                          " did not return the fake it wrote");
    FakeTensorImpl* const output_fake = written_fake != nullptr ? written_fake
                                        : output != nullptr     ? fake_impl(*output)
                                                                : nullptr;
    if (output_fake == nullptr) {
      return;
    }
    const std::shared_ptr<OpGraph>& owner = tls_graph;
    std::optional<RecordedDraws> draws;
    if (facts_.random) {
      // Before the lock, which placing may take (Note [Recording an op]).
      draws = detail::place_random_node(
          owner, RecordedNode{op_, arguments(), inputs(), {}, nullptr, ambient_}, *output,
          random_tensors(*output), true);
    }
    const auto lock = graph_.lock();
    const int64_t index = graph_.next_node();
    int64_t written_storage = -1;
    if (written_fake != nullptr) {
      written_storage = graph_.add_write(index, *written_fake, written_value_);
    }
    c10::SmallVector<int64_t, 1> outputs;
    if (written_fake != nullptr) {
      // add_write() found the storage the fake views now: the value's, or another one.
      const RecordedValue& value = graph_.values()[written_value_];
      outputs.push_back(
          value.storage == written_storage && same_geometry(value, *output)
              ? written_value_  // Note [An output that is its input's value]
              : add_recorded_output(graph_, owner, index, *output_fake, *output, written_value_));
    } else {
      outputs.push_back(output_value(graph_, owner, index, *output_fake, *output));
    }
    if (C10_UNLIKELY(inference_ && !facts_.returns_view)) {
      mark_inference_values(graph_, index, outputs);
    }
    graph_.add_described_node(op_, arguments(), inputs(), outputs, ambient_);
    graph_.own_arguments().keep(arguments_ + argument_count_);
    graph_.own_inputs().keep(inputs_ + input_count_);
    kept_ = true;
    if (draws) {
      graph_.set_draws(index, std::move(*draws));
    }
  }

  // Not `return {pointer, count}`: that would be an initializer list of two IValues.
  c10::ArrayRef<c10::IValue> arguments() const {
    return c10::ArrayRef<c10::IValue>(arguments_, argument_count_);
  }
  c10::ArrayRef<RecordedInput> inputs() const {
    return c10::ArrayRef<RecordedInput>(inputs_, input_count_);
  }

  const c10::OperatorHandle& op_;
  const OperatorFacts& facts_;
  torch::jit::Stack& stack_;
  OpGraph& graph_;  // the recording in progress on this thread
  // The description, constructed at the end of the graph's own lists.
  c10::IValue* arguments_ = nullptr;
  size_t argument_count_ = 0;
  RecordedInput* inputs_ = nullptr;
  size_t input_count_ = 0;
  bool kept_ = false;  // a node took it
  AmbientState ambient_;
  FakeTensorImpl* written_fake_ = nullptr;  // the written argument, if any
  int64_t written_value_ = -1;
  // A random op's tensor arguments but the written one, in order, and where that one goes.
  c10::SmallVector<at::Tensor, 2> random_tensors_;
  int64_t written_position_ = -1;
  bool inference_ = false;  // Note [Inference mode while recording]
};

// Whether a tensor argument of the call on `stack` is a recorded fake (they carry the key).
bool carries_deferred_init_key(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  bool carries = false;
  for (size_t i = stack.size() - op.schema().arguments().size(); i < stack.size(); ++i) {
    for_each_tensor(stack[i], [&](const at::Tensor& t) {
      carries = carries || t.key_set().has(kDeferredInitKey);
    });
  }
  return carries;
}

}  // namespace

namespace detail {

at::Tensor read_values(const at::Tensor& t) {
  if (!is_fake(t)) {
    return t;
  }
  const RecordedFake* rec = recorded(t);
  TORCH_CHECK(rec != nullptr, "torchdefer: cannot read the values of ", describe(t),
              ": it was made under a FakeMode, which records nothing, so it has no values. Create "
              "it inside deferred_init, or use a real tensor.");
  TORCH_CHECK(tls_graph == nullptr || rec->graph == tls_graph.get(),
              "torchdefer: cannot read the values of ", describe(t),
              " inside another deferred_init than the one that recorded it (",
              rec->graph->context(),
              "): a recording reads only its own values. Read it before or after this "
              "deferred_init, or materialize it first (materialize_tensor).");
  return rec->graph->value_reader()(t);  // Note [Who reads values]
}

bool made_in_inference_mode(const at::Tensor& t) {
  const RecordedFake* rec = recorded(t);
  if (rec == nullptr) {
    return false;
  }
  const OpGraph& graph = *rec->graph;
  const auto lock = rec->graph->lock();
  if (graph.is_inference_value(rec->value)) {
    return true;
  }
  // A view or detached alias of an inference tensor is one too, wherever it was taken: the value
  // that made its storage decides.
  const int64_t base = graph.storages()[graph.values()[rec->value].storage].base_value;
  return base >= 0 && graph.is_inference_value(base);
}

uint64_t inference_tensors_made() { return inference_values.load(std::memory_order_relaxed); }

void refuse_inference_tensor(const std::string& what) {
  TORCH_CHECK(false, "torchdefer: ", what,
              " was made under torch.inference_mode() while recording, where eager makes an "
              "inference tensor, and materialization makes ordinary tensors. Make it outside "
              "inference_mode (torch.no_grad() records the same values), or after materializing.");
}

void settle_default_generator(bool about_to_read) {
  if (about_to_read) {
    settle_generator_exactly();
    return;
  }
  settle_generator();
}

void deferred_init_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                            torch::jit::Stack* stack) {
  Recorder(op, facts_of(op), stack, Position::kAboveAutograd).run(keys);
}

void recording_fake_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                             torch::jit::Stack* stack) {
  // Note [Where an op is recorded]: the recorder takes a call that no recorded call runs below,
  // if it is a factory while a recording is open on this thread or an op on a recorded fake.
  // Cheapest first: under a plain FakeMode every call asks the first question.
  if (!detail::any_recording_alive() || tls_below_recorded_call) {
    fake_fallback(op, keys, stack);
    return;
  }
  OpGraph* const graph = tls_graph.get();
  if (graph == nullptr && !carries_deferred_init_key(op, *stack)) {
    fake_fallback(op, keys, stack);
    return;
  }
  const OperatorFacts& facts = facts_of(op);
  if (facts.common && graph != nullptr) {
    CommonCall call(op, facts, *stack, *graph);
    if (call.describe()) {
      call.run(keys);
      return;
    }
  }
  Recorder(op, facts, stack, Position::kAtFakeKey).run(keys);
}

Recording::Recording(std::string context, bool exact_generator, bool cuda_generator,
                     ValueReader reader)
    : include_deferred_init_(kDeferredInitKey),
      saved_graph_(tls_graph),
      exact_generator_(exact_generator) {
  enter_recording();  // Note [Replays that lend themselves the default generator]
  try {
    auto graph = std::make_shared<OpGraph>(std::move(context), default_generator_digest(), reader,
                                           exact_generator, cuda_generator);
    tls_open_recordings.push_back({graph.get(), {}});
    tls_graph = std::move(graph);
  } catch (...) {
    leave_recording();
    throw;
  }
}

Recording::~Recording() {
  leave_recording();
  tls_open_recordings.pop_back();
  const std::weak_ptr<OpGraph> ended = tls_graph;
  tls_graph = std::move(saved_graph_);
  if (autocast_on_now()) {
    forget_autocast_casts();
  }
  if (!exact_generator_) {
    settle_generator();
    // Note [Samplers nothing keeps]: a recording that ends with no fake left pays now.
    pay_generator_debt_of_finished({ended});
    return;
  }
  // A destructor must not throw; a generator that cannot be paid stays owed, and the warning says
  // why.
  try {
    settle_generator_exactly();
  } catch (const c10::Error& e) {
    TORCH_WARN("torchdefer: exact_generator: could not resolve the random ops of this recording: ",
               e.what_without_backtrace());
  }
  try {
    pay_cuda_generator_debts();  // Note [Torch-mode draws on CUDA]
  } catch (const c10::Error& e) {
    TORCH_WARN(
        "torchdefer: exact_generator: could not resolve the CUDA random ops of this "
        "recording: ",
        e.what_without_backtrace());
  }
}

}  // namespace detail
}  // namespace torchdefer
