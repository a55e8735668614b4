// The boxed fallback registered for kFakeKey: runs every operator on fake tensors as the same
// operator on their meta shadows, and wraps the results as fakes on the right device.
#include <torchdefer/boxed_arguments.h>
#include <torchdefer/core_kernels.h>
#include <torchdefer/data_dependent_ops.h>
#include <torchdefer/fake_tensor.h>
#include <torchdefer/fake_tensor_impl.h>
#include <torchdefer/op_table.h>
#include <torchdefer/torch_compat.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchdefer {
namespace {

// Note [The Fake fallback]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Every op that has a fake tensor among its arguments, and every factory called under a FakeMode,
// reaches fake_fallback() after autograd and ADInplaceOrView ran above it (Note [Dispatch keys]).
// The fallback never touches data. It
//
//  1. refuses data-dependent ops (item, nonzero, unique, ...; value_reading_api()) with a message
//     naming the op and the tensor: their result depends on values a fake does not have (inside
//     deferred_init the recorder answers them first: Note [Reading values while recording]);
//  2. refuses writes of fake results into real tensors (`real.add_(fake)`): the real tensor would
//     end up with values nobody computed;
//  3. decides the output device the way a real kernel would: an explicit `device=` argument wins,
//     then the common device of the tensor arguments (0-dim CPU tensors, like real CPU scalars,
//     mix with any device), then the FakeMode's default device, then CPU; tensors on two devices
//     raise the error a real kernel raises;
//  4. swaps fakes for their meta shadows, real tensors for meta tensors of the same geometry, and a
//     factory's device for meta, drops an explicit generator, then calls the op again with kFakeKey
//     and autograd excluded, so the op's meta kernel computes every output's shape, strides and
//     aliasing (or, for the few ops LibTorch has no C++ meta kernel for, a rule does: Note [Meta
//     rules]);
//  5. returns, for each output, the input fake it aliases (in-place and out= ops return their
//     argument, as real kernels do) or a new fake around the meta output.
//
// Ops whose tensor arguments are all real (possible only under a FakeMode) run for real: FakeMode
// makes *factories* return fakes, it does not fake the arithmetic on tensors the user already has.
// A factory given meta tensors as templates is a factory (Note [Factories of meta templates]).

struct TensorUse {
  at::Tensor tensor;
  std::string_view argument;
  bool written = false;
};

bool is_cpu_scalar(const at::Tensor& t) { return t.dim() == 0 && t.device().is_cpu(); }

// Ops whose real kernels accept tensors on different devices (cross-device copies, CPU index
// tensors into an accelerator tensor) and apply their own device rules.
bool allows_mixed_devices(std::string_view op) {
  static constexpr std::string_view kOps[] = {
      "aten::copy_",
      "aten::_copy_from",
      "aten::_copy_from_and_resize",
      "aten::_to_copy",
      "aten::index",
      "aten::index_put_",
      "aten::_index_put_impl_",
      "aten::index_put",
      "aten::set_",
      "aten::_has_compatible_shallow_copy_type",
      "aten::is_pinned",
      "aten::_pin_memory",
      "aten::is_same_size",
  };
  for (std::string_view name : kOps) {
    if (name == op) {
      return true;
    }
  }
  return false;
}

// Note [A caller that knows the operator]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Two questions of steps 1 and 5 depend on the operator alone: may it read values (an op table
// lookup by name: ~230 instructions a call, the largest part of the Fake layer's own work per
// call of a Llama construction) and does it draw (a tag lookup). The recorder asks both once per
// operator and thread (its OperatorFacts) before it calls the fallback, so it hands the answers
// down (detail::KnownOperator) instead of having them asked again per call; a FakeMode call with
// no recording asks them here. The answers are the same: the recorder's come from is_random() and
// value_reading_api() too, and are forgotten when any operator is deregistered (Note [Operators
// known by their schema's address]), so an operator defined again with other tags is asked anew
// (tests/python/test_operator_facts.py); a stale "reads no values" would run a data-dependent op
// on meta shadows.
class FakeCall {
 public:
  FakeCall(const c10::OperatorHandle& op, torch::jit::Stack* stack,
           const detail::KnownOperator* known)
      : op_(op),
        schema_(op.schema()),
        stack_(*stack),
        first_argument_(stack_.size() - schema_.arguments().size()),
        known_(known) {
    collect_tensors();
  }

  void run(c10::DispatchKeySet keys) {
    if (!has_fake_ && !tensors_.empty() && !makes_tensor_from_meta_template(op_, arguments())) {
      run_real(keys);
      return;
    }
    if (answer_or_refuse_data_dependent_op()) {
      return;
    }
    reject_writes_into_real_tensors();
    if (answer_in_place_random_fill()) {
      return;
    }
    const c10::Device device = output_device();
    run_on_meta();
    if (needs_iterator_layout()) {
      lay_out_as_tensor_iterator();
    }
    wrap_outputs(device);
  }

 private:
  // Note [Random fills of empty fakes]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // ATen's CPU random kernels return early for a tensor with no elements, before checking its
  // dtype: `torch.empty(0, dtype=torch.int64).normal_()` does nothing, while the meta kernel
  // refuses an integer dtype. An in-place random op whose written tensor is empty is therefore
  // asked of the real CPU kernel on empty tensors of the same geometry: whatever that says
  // (nothing, or the error eager raises) is the answer, and the fake is returned as it is; the
  // generator is left as it was, for the recorder to place. Only random fills: other in-place
  // ops (resize_, set_) change the fake's geometry.
  //
  // Note [Random fills skip the meta kernel]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A random fill of a non-empty CPU fake (normal_, uniform_, random_, exponential_, ...; self
  // its only tensor, no explicit generator) returns self with self's metadata: the meta kernel has
  // nothing to compute, only arguments to check. In a Python process those kernels are torch's
  // Python decompositions (torch._refs.normal runs prims and broadcasting helpers: ~0.9 ms a call,
  // most of a Hugging Face init_weights() under deferred_init; uniform_ ~50 us), registered over
  // the C++ ones. The arguments are checked instead by the real CPU kernel on a one-element tensor
  // of self's dtype drawing from a private generator, which raises exactly eager's errors (an
  // integer dtype, std < 0, from > to, p outside [0, 1]) in a few microseconds; the default
  // generator is untouched. Written elements that share memory get eager's error from the
  // geometry, which a one-element tensor cannot show. Fakes on other devices keep the meta
  // kernel: their eager kernels are not the CPU's.
  bool answer_in_place_random_fill() {
    const bool random = known_ != nullptr ? known_->random : is_random(op_);
    if (!random || !writes_first_argument(schema_) || schema_.returns().size() != 1 ||
        !argument(0).isTensor() || !is_fake(argument(0).toTensor())) {
      return false;
    }
    const at::Tensor self = argument(0).toTensor();
    const std::optional<size_t> generator = generator_argument();
    if (self.numel() == 0) {
      ask_cpu_kernel(std::nullopt);
    } else if (checks_only_its_arguments_on_cpu(generator)) {
      at::assert_no_internal_overlap(fake_impl(self)->meta());
      ask_cpu_kernel(generator);
    } else {
      return false;
    }
    torch::jit::drop(stack_, schema_.arguments().size());
    torch::jit::push(stack_, self);
    return true;
  }

  // Whether a fill of the fake self (non-empty) is Note [Random fills skip the meta kernel]'s
  // case: a CPU fake, the only tensor, and its generator argument `generator` left unset.
  bool checks_only_its_arguments_on_cpu(std::optional<size_t> generator) {
    if (tensors_.size() != 1 || !argument(0).toTensor().device().is_cpu()) {
      return false;
    }
    return generator.has_value() && argument(*generator).isNone();
  }

  std::optional<size_t> generator_argument() const {
    const auto& arguments = schema_.arguments();
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (generator_argument_kind(arguments[i]) == GeneratorArgument::kOne) {
        return i;
      }
    }
    return std::nullopt;
  }

  // Runs the op's real CPU kernel for its verdict only, on CPU scratch tensors of the fakes'
  // geometry, or given `one_element_drawing_from` (the generator argument), on one element of
  // self's dtype drawing from a private generator. Otherwise whatever it draws from the default
  // generator is undone.
  void ask_cpu_kernel(std::optional<size_t> one_element_drawing_from) {
    const bool one_element = one_element_drawing_from.has_value();
    const auto& arguments = schema_.arguments();
    RealOnlyGuard real_only;
    c10::impl::ExcludeDispatchKeyGuard no_autograd(
        c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    torch::jit::Stack real_stack;
    if (one_element) {
      real_stack.push_back(at::empty({1}, argument(0).toTensor().options().device(c10::kCPU)));
    }
    for (size_t i = real_stack.size(); i < arguments.size(); ++i) {
      real_stack.push_back(map_tensors(argument(i), [](const at::Tensor& t) {
        return t.defined() && is_fake(t)
                   ? at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kCPU))
                   : t;
      }));
    }
    if (one_element) {
      real_stack[*one_element_drawing_from] = private_generator();
      op_.callBoxed(&real_stack);
      return;
    }
    // Only the kernel's verdict counts: whatever it draws is the recorder's to place.
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    const at::Tensor state = [&] {
      const std::lock_guard<std::mutex> lock(generator.mutex());
      return generator.get_state();
    }();
    op_.callBoxed(&real_stack);
    const std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }

  // This thread's generator for kernels run for their argument checks alone.
  static const at::Generator& private_generator() {
    thread_local const at::Generator generator = at::detail::createCPUGenerator();
    return generator;
  }

  c10::IValue& argument(size_t i) { return stack_[first_argument_ + i]; }

  c10::ArrayRef<c10::IValue> arguments() const {
    return c10::ArrayRef<c10::IValue>(stack_).slice(first_argument_, schema_.arguments().size());
  }

  void collect_tensors() {
    const auto& arguments = schema_.arguments();
    for (size_t i = 0; i < arguments.size(); ++i) {
      const bool written = is_written(arguments[i]);
      map_tensors(argument(i), [&](const at::Tensor& t) {
        if (t.defined()) {
          tensors_.push_back({t, arguments[i].name(), written});
          has_fake_ = has_fake_ || is_fake(t);
        }
        return t;
      });
    }
  }

  std::string op_name() const { return c10::toString(schema_.operator_name()); }

  std::string describe_inputs() const {
    std::ostringstream out;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      out << (i ? ", " : "") << tensors_[i].argument << ": " << describe(tensors_[i].tensor);
    }
    return out.str();
  }

  void run_real(c10::DispatchKeySet keys) {
    c10::impl::ExcludeDispatchKeyGuard no_fake(kFakeKey);
    op_.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kFakeKey),
                        &stack_);
  }

  // A data-dependent op is answered when its result is known without data
  // (answer_without_values()), and refused otherwise; returns whether it was answered.
  bool answer_or_refuse_data_dependent_op() {
    if (known_ != nullptr && !known_->may_read_values) {
      return false;
    }
    const std::optional<std::string> api = value_reading_api(
        op_, c10::ArrayRef<c10::IValue>(stack_).slice(first_argument_, schema_.arguments().size()));
    if (!api) {
      return false;
    }
    std::vector<at::Tensor> tensors;
    for (const TensorUse& use : tensors_) {
      tensors.push_back(use.tensor);
    }
    std::optional<c10::IValue> answer = answer_without_values(schema_.name(), tensors);
    TORCH_CHECK(answer.has_value(), "torchdefer: ", *api, " (", schema_.name(),
                ") needs the values of ", describe_inputs(),
                ", but a fake tensor has no data. Materialize it first (materialize_tensor or "
                "materialize_module); only the fakes of a deferred_init in progress can be read, "
                "while it runs. Printing a fake reads its values: print describe(t) instead.");
    torch::jit::drop(stack_, schema_.arguments().size());
    torch::jit::push(stack_, std::move(*answer));
    return true;
  }

  void reject_writes_into_real_tensors() const {
    for (const TensorUse& use : tensors_) {
      TORCH_CHECK(!use.written || is_fake(use.tensor), "torchdefer: ", op_name(),
                  " would write into the real tensor '", use.argument, "' (", describe(use.tensor),
                  ") values computed from fake tensors, which have no data. ",
                  "Materialize the fake inputs first (", describe_inputs(), ").");
    }
  }

  std::optional<c10::Device> requested_device() {
    const auto& arguments = schema_.arguments();
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (is_device_argument(arguments[i]) && argument(i).isDevice()) {
        return argument(i).toDevice();
      }
    }
    return std::nullopt;
  }

  c10::Device output_device() {
    if (std::optional<c10::Device> requested = requested_device()) {
      return requested->is_meta() ? *requested : normalize_fake_device(*requested);
    }
    if (tensors_.empty()) {
      return FakeMode::default_device().value_or(c10::Device(c10::kCPU));
    }
    std::optional<c10::Device> common;
    for (const TensorUse& use : tensors_) {
      if (is_cpu_scalar(use.tensor)) {
        continue;
      }
      if (!common) {
        common = use.tensor.device();
        continue;
      }
      TORCH_CHECK(*common == use.tensor.device() || allows_mixed_devices(schema_.name()),
                  "Expected all tensors to be on the same device, but found at least two devices, ",
                  *common, " and ", use.tensor.device(), "! (torchdefer: ", op_name(),
                  " on fake tensors; argument '", use.argument, "' is on ", use.tensor.device(),
                  ")");
    }
    return common.value_or(tensors_.front().tensor.device());
  }

  // Replaces every tensor argument by its meta counterpart and a factory's device by meta.
  void substitute_meta_arguments() {
    const auto& arguments = schema_.arguments();
    for (size_t i = 0; i < arguments.size(); ++i) {
      c10::IValue& value = argument(i);
      if (is_device_argument(arguments[i])) {
        if (value.isDevice() || tensors_.empty()) {
          value = c10::Device(c10::kMeta);
        }
        continue;
      }
      if (arguments[i].name() == "pin_memory" && value.isBool()) {
        value = false;
        continue;
      }
      if (value.isGenerator()) {
        // A meta kernel draws nothing, and torch's Python ones refuse a generator
        // (torch._refs.exponential asserts that it is None).
        value = c10::IValue();
        continue;
      }
      value = map_tensors(value, [&](const at::Tensor& t) { return to_meta(t); });
    }
  }

  at::Tensor to_meta(const at::Tensor& t) {
    if (!t.defined() || t.is_meta()) {
      return t;
    }
    if (const FakeTensorImpl* fake = fake_impl(t)) {
      shadows_.emplace_back(fake->meta().unsafeGetTensorImpl(), t);
      return fake->meta();
    }
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
      // A Python number or NumPy scalar arrives as a 0-dim CPU "wrapped number", which type
      // promotion treats like a Python scalar (int64 fake * np.float64 is float32). Meta kernels
      // take CPU scalars as they are, and a meta copy would lose that status.
      return t;
    }
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
  }

  // A factory's sizes are checked as its real kernels check them, so that a negative size gets
  // eager's message ("Trying to create tensor with negative dimension -1: [-1]") and not the bare
  // one of a meta kernel torch writes in Python (torch._refs.randn checks with torch._check).
  void check_factory_sizes() {
    if (!tensors_.empty()) {
      return;
    }
    const auto& arguments = schema_.arguments();
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (arguments[i].name() == "size" && argument(i).isIntList()) {
        at::detail::check_size_nonnegative(argument(i).toDimVector());
      }
    }
  }

  void run_on_meta() {
    check_factory_sizes();
    c10::impl::ExcludeDispatchKeyGuard no_fake(c10::DispatchKeySet(kFakeKey) |
                                               c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    substitute_meta_arguments();
    try {
      op_.callBoxed(&stack_);
    } catch (const c10::NotImplementedError& e) {
      // Note [Refusals are RuntimeErrors]
      // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
      // Library code catches some exception classes to take another branch: torch's parametrize
      // treats NotImplementedError from right_inverse as "no right_inverse" (orthogonal's geqrf
      // had no meta kernel: the parametrization silently started from the identity), hasattr
      // swallows AttributeError. A refusal of torchdefer's is always a RuntimeError (c10::Error)
      // naming the op and what to do, so that it propagates to the user instead of changing what
      // the model computes; the Python package's refusals follow the same rule.
      TORCH_CHECK(
          false, "torchdefer: ", op_name(),
          " cannot run on fake tensors: it has no meta kernel, and fake tensors compute every "
          "result's shape on the meta device. Inputs: ",
          describe_inputs(),
          ". Run this op after materialization, or register a Meta kernel for it. Original error: ",
          e.msg());
    }
  }

  // Note [Pointwise results take TensorIterator's layout]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // In a Python process the Meta kernels of pointwise ops are torch's Python references, which
  // torch/_meta_registrations.py registers over the C++ ones; they order a result's dimensions by
  // their own rule, the CPU kernels by TensorIterator's. The two agree while every input has the
  // strides of a fresh contiguous tensor. Otherwise a size-1 dimension whose stride ties with
  // another's can make them disagree on the layout of the result (`x.t()[None, None] * col`:
  // strides (4, 4, 1, 8) on the CPU, (32, 16, 1, 4) on meta), and replay, which views the real
  // result through the fake's strides, read the values scrambled (Kornia's MKD descriptor). So
  // for such inputs the result of a functional pointwise op is laid out by a TensorIterator built
  // on the inputs' meta shadows, the CPU kernel's own computation (but for the op table's
  // contiguous_result ops, masked_fill, whose kernels do not use TensorIterator's layout); fresh
  // contiguous inputs, nearly every call while building a model, skip it.
  bool needs_iterator_layout() const {
    if (schema_.returns().size() != 1 || schema_.is_mutable() || tensors_.size() < 2) {
      return false;
    }
    for (const TensorUse& use : tensors_) {
      if (!has_fresh_contiguous_strides(use.tensor)) {
        return lays_out_like_tensor_iterator(op_);
      }
    }
    return false;
  }

  static bool has_fresh_contiguous_strides(const at::Tensor& t) {
    int64_t expected = 1;
    for (int64_t d = t.dim() - 1; d >= 0; --d) {
      if (t.stride(d) != expected) {
        return false;
      }
      expected *= std::max<int64_t>(t.size(d), 1);
    }
    return true;
  }

  // Called after run_on_meta(): the op's single output is on the stack.
  void lay_out_as_tensor_iterator() {
    c10::IValue& output = stack_.back();
    if (!output.isTensor() || !output.toTensor().is_meta()) {
      return;
    }
    const at::Tensor meta_output = output.toTensor();
    at::TensorIteratorConfig config;
    config.set_check_mem_overlap(false)
        .check_all_same_dtype(false)
        .declare_static_dtype_and_device(meta_output.scalar_type(), meta_output.device())
        .add_owned_output(at::Tensor());
    for (const TensorUse& use : tensors_) {
      if (use.tensor.dim() > 0) {  // 0-dim operands broadcast and order no dimension
        const FakeTensorImpl* fake = fake_impl(use.tensor);
        config.add_owned_const_input(fake != nullptr ? fake->meta()
                                                     : at::empty_strided(use.tensor.sizes(),
                                                                         use.tensor.strides(),
                                                                         meta_output.options()));
      }
    }
    at::TensorIterator iterator = config.build();
    const at::Tensor& laid_out = iterator.output(0);
    if (laid_out.sizes() == meta_output.sizes() && laid_out.strides() != meta_output.strides()) {
      output = laid_out;
    }
  }

  at::Tensor wrap(const at::Tensor& meta_output, c10::Device device) const {
    if (!meta_output.defined() || !meta_output.is_meta()) {
      return meta_output;
    }
    for (const auto& [shadow, fake] : shadows_) {
      if (shadow == meta_output.unsafeGetTensorImpl()) {
        return fake;
      }
    }
    if (device.is_meta()) {
      return meta_output;
    }
    return make_fake(meta_output, device);
  }

  void wrap_outputs(c10::Device device) {
    for (size_t i = stack_.size() - schema_.returns().size(); i < stack_.size(); ++i) {
      stack_[i] = map_tensors(stack_[i], [&](const at::Tensor& t) { return wrap(t, device); });
    }
    for (const TensorUse& use : tensors_) {
      if (use.written) {
        fake_impl(use.tensor)->sync_from_meta();
      }
    }
  }

  const c10::OperatorHandle& op_;
  const c10::FunctionSchema& schema_;
  torch::jit::Stack& stack_;
  const size_t first_argument_;
  std::vector<TensorUse> tensors_;
  std::vector<std::pair<const c10::TensorImpl*, at::Tensor>> shadows_;
  const detail::KnownOperator* known_;  // null: ask (Note [A caller that knows the operator])
  bool has_fake_ = false;
};

}  // namespace

namespace detail {

void fake_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                   torch::jit::Stack* stack, const KnownOperator* known) {
  FakeCall(op, stack, known).run(keys);
}

}  // namespace detail
}  // namespace torchdefer
