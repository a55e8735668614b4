// Recording: the boxed fallback on kDeferredInitKey that appends every operator on fakes to an
// OpGraph, and the RecordingScope that deferred_init opens.
#include <torchdefer/boxed_arguments.h>
#include <torchdefer/data_dependent_ops.h>
#include <torchdefer/deferred_init.h>
#include <torchdefer/fake_tensor_impl.h>
#include <torchdefer/op_graph.h>
#include <torchdefer/torch_compat.h>
#include <torchdefer/value_reader.h>

#include "torch_rng.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchdefer {
namespace {

// The graph the innermost RecordingScope on this thread records into.
thread_local std::shared_ptr<OpGraph> tls_graph;

// Provided by the replay engine (value_reader.h).
detail::ValueReader value_reader = nullptr;

// Note [Reading values while recording]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Model code reads small tensors while it builds itself: drop-path schedules are
// `[x.item() for x in torch.linspace(0, rate, depth)]` in timm and in many transformers vision
// models, and a constructor may branch on `torch::rand({1}).item<double>()`. Under deferred_init
// those tensors are fakes and have no values, so the Fake layer would refuse such an op
// (data_dependent_api()). Instead, when a data-dependent op's fake arguments are all fakes of the
// recording in progress on this thread, the recorder asks the value reader for a real, private
// copy of each, runs the op on the copies with both of torchdefer's keys excluded, and returns the
// real result: a Scalar for item(), a real tensor for nonzero() (which later recorded ops capture
// as any real input). The op itself is not recorded: whatever it produced is real.
//
// The reader (the replay engine's, installed through value_reader.h so that the recorder does not
// depend on replay) replays the history of that value once, on CPU, in torch RNG mode, into
// storages nobody else sees, and commits nothing: the fakes stay fake, the recording is unchanged,
// and the default generator is restored to where the recorder keeps it (Note [Torch-mode draw
// offsets]), so materialization and code after deferred_init see exactly what they would have
// without the read. The cost is that replay, per read: fine for the small tensors model code
// reads, a full computation for a large one.
//
// The value read is always the torch-mode one, eager's values on CPU, even for a model that will
// be materialized in counter RNG mode: the read decides control flow during construction, which
// must follow eager's so that the recording is the one eager construction would have made. (A
// value that came from a random op on an accelerator device is eager's CPU value, not that
// device's.) Fakes of a plain FakeMode, or of another recording, record nothing to replay here,
// and data-dependent ops on them are refused as before.

// A real tensor whose memory nobody owns (at::from_blob without a deleter) may be freed or
// rewritten by its owner at any time after construction; the recorder keeps a copy instead.
bool is_borrowed_memory(const at::Tensor& t) {
  return t.has_storage() && t.storage().data() != nullptr &&
         t.storage().data_ptr().get_context() == nullptr;
}

// Note [Recording an op]
// ~~~~~~~~~~~~~~~~~~~~~~
// The DeferredInit fallback sees an operator before autograd and before any composite kernel
// decomposed it, so a node is the call the model's code made (aten::linear, not aten::addmm).
// It records the call only when the call involves fakes: a factory under a RecordingScope, or an
// op with a fake argument, before or after deferred_init returned (every recorded fake carries
// kDeferredInitKey, so `m->to(torch::kBFloat16)` or tying weights afterwards is recorded too).
// Ops on real tensors alone are real computations and run unrecorded. The op then runs below
// kDeferredInitKey with the key excluded, so the ops a composite kernel calls are not recorded a
// second time; the Fake layer computes the outputs, and the recorder annotates each output fake
// with its value and adds kDeferredInitKey to it. Arguments are classified before the op runs:
// an in-place op must be recorded reading the input's old value and the real tensors' versions
// as they were.
class Recorder {
 public:
  Recorder(const c10::OperatorHandle& op, torch::jit::Stack* stack)
      : op_(op),
        schema_(op.schema()),
        stack_(*stack),
        first_argument_(stack_.size() - schema_.arguments().size()) {}

  void run(c10::DispatchKeySet keys) {
    scan_arguments();
    if (reads_values_of_recording()) {
      run_on_values();
      return;
    }
    if (graph_ == nullptr || (!has_fake_ && has_tensor_)) {
      if (detail::is_random(op_)) {
        // An unrecorded op is about to draw: the generator must be where eager would have it.
        detail::settle_generator_exactly();
      }
      redispatch(keys);
      return;
    }
    RecordedNode node = describe_call();
    redispatch(keys);
    record(std::move(node));
  }

 private:
  void scan_arguments() {
    graph_ = tls_graph;
    for (size_t i = first_argument_; i < stack_.size(); ++i) {
      map_tensors(stack_[i], [&](const at::Tensor& t) {
        if (!t.defined()) {
          return t;
        }
        has_tensor_ = true;
        if (is_fake(t)) {
          has_fake_ = true;
          const RecordedFake* rec = recorded(t);
          if (graph_ == nullptr && rec != nullptr) {
            graph_ = rec->graph;
          }
        }
        return t;
      });
    }
  }

  // Note [Reading values while recording]: a data-dependent op on fakes of this recording only.
  bool reads_values_of_recording() const {
    if (tls_graph == nullptr || !has_fake_ || data_dependent_api(schema_.name()) == nullptr) {
      return false;
    }
    std::vector<at::Tensor> fakes;
    for (size_t i = first_argument_; i < stack_.size(); ++i) {
      map_tensors(stack_[i], [&](const at::Tensor& t) {
        if (is_fake(t)) {
          fakes.push_back(t);
        }
        return t;
      });
    }
    if (answer_without_values(schema_.name(), fakes)) {
      return false;  // the Fake layer answers it without data
    }
    return std::all_of(fakes.begin(), fakes.end(), [](const at::Tensor& t) {
      const RecordedFake* rec = recorded(t);
      return rec != nullptr && rec->graph == tls_graph;
    });
  }

  void run_on_values() {
    std::optional<c10::Device> device;
    try {
      for (size_t i = first_argument_; i < stack_.size(); ++i) {
        stack_[i] = map_tensors(stack_[i], [&](const at::Tensor& t) {
          if (!is_fake(t)) {
            return t;
          }
          device = device.value_or(t.device());
          return read_values(t);
        });
      }
    } catch (c10::Error& e) {
      e.add_context(c10::str("torchdefer: while reading values for ",
                             data_dependent_api(schema_.name()), " (", schema_.name(),
                             ") in deferred_init of ", tls_graph->context()));
      throw;
    }
    RealOnlyGuard real_only;
    op_.callBoxed(&stack_);
    if (device->is_cpu()) {
      return;
    }
    // The values were read on CPU; tensor results belong on the fakes' device.
    for (size_t i = stack_.size() - schema_.returns().size(); i < stack_.size(); ++i) {
      stack_[i] = map_tensors(stack_[i], [&](const at::Tensor& t) { return t.to(*device); });
    }
  }

  RecordedInput classify(const at::Tensor& t) const {
    RecordedInput input;
    if (!t.defined()) {
      return input;
    }
    if (is_fake(t)) {
      const RecordedFake* rec = recorded(t);
      if (rec != nullptr && rec->graph == graph_) {
        input.kind = RecordedInput::Kind::kValue;
        input.value = rec->value;
      } else {
        input.kind = RecordedInput::Kind::kForeignFake;
        input.tensor = t;
      }
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

  // Also remembers the fakes the call writes, before the call pops its arguments.
  RecordedNode describe_call() {
    const auto& arguments = schema_.arguments();
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (is_written(arguments[i])) {
        map_tensors(stack_[first_argument_ + i], [&](const at::Tensor& t) {
          if (is_fake(t)) {
            written_.push_back(t);
          }
          return t;
        });
      }
    }
    RecordedNode node{op_, {}, {}, {}, std::nullopt};
    node.arguments.reserve(schema_.arguments().size());
    for (size_t i = first_argument_; i < stack_.size(); ++i) {
      node.arguments.push_back(map_tensors(stack_[i], [&](const at::Tensor& t) {
        node.inputs.push_back(classify(t));
        return at::Tensor();
      }));
    }
    return node;
  }

  void redispatch(c10::DispatchKeySet keys) {
    c10::impl::ExcludeDispatchKeyGuard no_recording(kDeferredInitKey);
    try {
      op_.redispatchBoxed(
          keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kDeferredInitKey), &stack_);
    } catch (c10::Error& e) {
      if (graph_ != nullptr) {
        e.add_context("torchdefer: while recording " + c10::toString(schema_.operator_name()) +
                      " in deferred_init of " + graph_->context());
      }
      throw;
    }
  }

  void record(RecordedNode node) {
    std::vector<at::Tensor> fake_outputs;
    const size_t first_return = stack_.size() - schema_.returns().size();
    for (size_t i = first_return; i < stack_.size(); ++i) {
      map_tensors(stack_[i], [&](const at::Tensor& t) {
        fake_outputs.push_back(is_fake(t) ? t : at::Tensor());
        return t;
      });
    }
    const bool produces_fakes = std::any_of(fake_outputs.begin(), fake_outputs.end(),
                                            [](const at::Tensor& t) { return t.defined(); });
    if (!produces_fakes && written_.empty()) {
      return;
    }
    const std::lock_guard<std::mutex> lock(graph_->mutex());
    const int64_t index = graph_->add_node(std::move(node));
    std::vector<int64_t> outputs;
    outputs.reserve(fake_outputs.size());
    for (const at::Tensor& t : fake_outputs) {
      if (!t.defined()) {
        outputs.push_back(-1);
        continue;
      }
      const int64_t value = graph_->add_output(index, t);
      FakeTensorImpl* impl = fake_impl(t);
      impl->set_annotation(std::make_shared<RecordedFake>(graph_, value));
      impl->include_dispatch_key(kDeferredInitKey);
      outputs.push_back(value);
    }
    for (const at::Tensor& t : written_) {
      graph_->add_write(index, t);
    }
    graph_->set_outputs(index, std::move(outputs));
    if (detail::is_random(op_)) {
      const at::Tensor& target = written_.empty() ? first_fake(fake_outputs) : written_.front();
      graph_->set_draws(index, detail::place_random_node(graph_, graph_->nodes()[index], target,
                                                         tls_graph != nullptr));
    }
  }

  static const at::Tensor& first_fake(const std::vector<at::Tensor>& tensors) {
    return *std::find_if(tensors.begin(), tensors.end(),
                         [](const at::Tensor& t) { return t.defined(); });
  }

  const c10::OperatorHandle& op_;
  const c10::FunctionSchema& schema_;
  torch::jit::Stack& stack_;
  const size_t first_argument_;
  std::shared_ptr<OpGraph> graph_;
  std::vector<at::Tensor> written_;
  bool has_fake_ = false;
  bool has_tensor_ = false;
};

void deferred_init_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                            torch::jit::Stack* stack) {
  Recorder(op, stack).run(keys);
}

// A namespace-scope Library rather than TORCH_LIBRARY_IMPL, so that the key comes from
// torch_compat.h (Note [Dispatch keys]).
torch::Library& deferred_init_registration() {
  static torch::Library library(torch::Library::IMPL, "_", kDeferredInitKey, __FILE__, __LINE__);
  return library.fallback(torch::CppFunction::makeFromBoxedFunction<&deferred_init_fallback>());
}

[[maybe_unused]] const torch::Library& kRegistered = deferred_init_registration();

}  // namespace

at::Tensor read_values(const at::Tensor& t) {
  if (!is_fake(t)) {
    return t;
  }
  const RecordedFake* rec = recorded(t);
  TORCH_CHECK(rec != nullptr, "torchdefer: cannot read the values of ", describe(t),
              ": it was made under a FakeMode, which records nothing, so it has no values. Create "
              "it inside deferred_init, or use a real tensor.");
  TORCH_CHECK(rec->graph == tls_graph, "torchdefer: cannot read the values of ", describe(t),
              " outside the deferred_init that recorded it (", rec->graph->context(),
              "): values are read only while construction runs. Materialize it first "
              "(materialize_tensor), then read the real tensor.");
  TORCH_INTERNAL_ASSERT(value_reader != nullptr, "torchdefer: no value reader is installed");
  return value_reader(t);
}

namespace detail {

void set_value_reader(ValueReader reader) {
  TORCH_INTERNAL_ASSERT(value_reader == nullptr, "torchdefer: the value reader is set twice");
  value_reader = reader;
}

RecordingScope::RecordingScope(std::string context, DeferredInitOptions options)
    : include_deferred_init_(kDeferredInitKey),
      saved_graph_(tls_graph),
      exact_generator_(options.exact_generator()) {
  auto graph = std::make_shared<OpGraph>(std::move(context));
  graph->set_counter_seed(default_generator_digest());
  tls_graph = std::move(graph);
}

RecordingScope::~RecordingScope() {
  tls_graph = std::move(saved_graph_);
  if (!exact_generator_) {
    settle_generator();
    return;
  }
  try {
    settle_generator_exactly();
  } catch (const c10::Error& e) {
    // A destructor must not throw; the generator stays owed, and the warning says why.
    TORCH_WARN("torchdefer: exact_generator: could not resolve the random ops of this recording: ",
               e.what_without_backtrace());
  }
}

}  // namespace detail
}  // namespace torchdefer
