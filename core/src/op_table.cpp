#include <torchdefer/op_table.h>

#include <torchdefer/boxed_arguments.h>
#include <torchdefer/fake_tensor.h>

#include <ATen/core/enum_tag.h>
#include <c10/util/Exception.h>

#include <string>
#include <unordered_map>

#include "meta_rules.h"

namespace torchdefer {
namespace {

constexpr OpInfo random(std::string_view name, DrawRule draws,
                        CounterSampler sampler = CounterSampler::kNone, CounterParameter first = {},
                        CounterParameter second = {}) {
  OpInfo info;
  info.name = name;
  info.draws = draws;
  info.sampler = sampler;
  info.first = first;
  info.second = second;
  return info;
}

constexpr OpInfo region(std::string_view name, RegionRule rule) {
  OpInfo info;
  info.name = name;
  info.region = rule;
  return info;
}

constexpr OpInfo exact(std::string_view name) { return region(name, RegionRule::kExactPointwise); }
constexpr OpInfo factory(std::string_view name) { return region(name, RegionRule::kFactory); }

// Note [Factories of meta templates]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Trainers build a model on the meta device, then `model.to_empty(device=...)` and their own
// init_weights() (torchtitan, and recommendation libraries). to_empty is
// `torch.empty_like(meta_param, device=...)` for every tensor: a call whose only tensor is a meta
// tensor, which the Fake layer and the recorder would run for real, as they run every op on real
// tensors only (Note [Ops on real tensors run for real]): the model would be real, built and
// initialized at eager's cost, under deferred_init. But the ops listed with this mark read nothing
// of a tensor argument but its metadata, and a meta tensor has nothing else: given meta tensors and
// a device that is not meta, such a call is a factory of a new tensor on that device, and a
// FakeMode makes it a fake, recorded as any factory. Without a device, or to the meta device, it
// makes a meta tensor, as in eager (a meta module never moved stays meta). Replay calls it with a
// meta tensor of the template's geometry (the recorder keeps its own: a meta tensor has no values
// to capture), which no device override moves.
constexpr OpInfo reads_metadata_only(OpInfo info) {
  info.reads_metadata_only = true;
  return info;
}

constexpr OpInfo reads_values(std::string_view name, const char* api,
                              ValueRule rule = ValueRule::kAlways) {
  OpInfo info;
  info.name = name;
  info.values = rule;
  info.api = api;
  return info;
}

constexpr OpInfo with_values(OpInfo info, const char* api, ValueRule rule) {
  info.values = rule;
  info.api = api;
  return info;
}

constexpr OpInfo overwrites_self(OpInfo info) {
  info.overwrites_self = true;
  return info;
}

constexpr OpInfo overwrites_self(std::string_view name) {
  OpInfo info;
  info.name = name;
  return overwrites_self(info);
}

constexpr OpInfo with_meta(OpInfo info, MetaRule meta) {
  info.meta = meta;
  return info;
}

constexpr OpInfo meta(std::string_view name, MetaRule rule) {
  OpInfo info;
  info.name = name;
  info.meta = rule;
  return info;
}

// Note [Writes the schema does not show]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// native_batch_norm(input, weight, bias, running_mean, running_var, training, ...) updates the
// running statistics in place when training, but its schema marks no argument written; so do the
// composite ops above it that the recorder may record whole (batch_norm, instance_norm, ...). A
// recording that trusted the schema would drop the update (BatchNorm's forward in train mode
// during construction, what PyTorch Geometric's and MONAI's lazy modules and instance norm with
// tracked statistics do), and the materialized buffers would silently keep their initial values.
// The recorder treats the arguments listed here as written, as if the schema said so, in the
// calls that write them: when not training (`training`, instance_norm's `use_input_stats`) the
// kernel reads them only, and a call that writes nothing must not enter their history. A model
// that runs an eval-mode forward while it is built (detectors finding their strides) would
// otherwise replay that forward at every materialization, for each buffer and each shard.
constexpr OpInfo with_unmarked_writes(OpInfo info, uint32_t arguments, std::string_view when) {
  info.unmarked_writes = arguments;
  info.unmarked_writes_when = when;
  return info;
}

constexpr OpInfo with_unmarked_writes(std::string_view name, uint32_t arguments,
                                      std::string_view when) {
  OpInfo info;
  info.name = name;
  return with_unmarked_writes(info, arguments, when);
}

// Note [Composite ops that read values inside]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The recorder records a call before any composite kernel decomposes it, then runs the kernel with
// recording off (Note [Recording an op]): the ops inside run on fakes nothing records. A few
// composite kernels read values of such inner tensors: quantile checks its `q` with `equal` on a
// scalar tensor it made itself. Under deferred_init that inner fake has no recorded origin, so
// its values cannot be read and the call fails where eager succeeds. Those ops are recorded as
// the ops their kernel calls instead: the recorder runs the kernel with recording on, each inner
// op is recorded (or, if it reads values, reads them) as if model code had called it, and
// materializing replays the same sequence of ATen calls eager made.
constexpr OpInfo records_its_parts(std::string_view name) {
  OpInfo info;
  info.name = name;
  info.records_its_parts = true;
  return info;
}

// Note [Conjugate and negative views of fakes] in recorder/src/recording.cpp.
constexpr OpInfo makes_bit_view(std::string_view name, BitView when) {
  OpInfo info;
  info.name = name;
  info.bit_view = when;
  return info;
}

constexpr OpInfo contiguous_result(OpInfo info) {
  info.contiguous_result = true;
  return info;
}

// running_mean and running_var, arguments 3 and 4 of every op below.
constexpr uint32_t kRunningStats = (1u << 3) | (1u << 4);

// Filled by ATen's distribution kernel on CUDA, one launch over the tensor it fills (functional
// forms included: normal(mean, std) fills its output with normal_ and then scales it).
constexpr OpInfo distribution_kernel_on_cuda(OpInfo info) {
  info.cuda_draws = CudaDrawRule::kDistributionKernel;
  return info;
}

namespace rules = detail::meta_rules;
using D = DrawRule;
using S = CounterSampler;

// Keyed by "name" (every overload, unless one has its own entry) or "name.overload". Region rules
// are looked up by name, with an in-place op's trailing underscore dropped: they hold for the
// functional op, its in-place form and every overload.
constexpr OpInfo kOps[] = {
    // Random ops. Counter parameters name the op's arguments; the rest of Note [Counter RNG].
    distribution_kernel_on_cuda(overwrites_self(
        random("aten::uniform_", D::kUniform, S::kUniform, {"from", 0}, {"to", 1}))),
    distribution_kernel_on_cuda(random("aten::rand", D::kUniform, S::kUniform, {"", 0}, {"", 1})),
    distribution_kernel_on_cuda(
        reads_metadata_only(random("aten::rand_like", D::kUniform, S::kUniform, {"", 0}, {"", 1}))),
    distribution_kernel_on_cuda(
        overwrites_self(random("aten::normal_", D::kNormal, S::kNormal, {"mean", 0}, {"std", 1}))),
    distribution_kernel_on_cuda(random("aten::normal", D::kNormal)),
    distribution_kernel_on_cuda(random("aten::randn", D::kNormal, S::kNormal, {"", 0}, {"", 1})),
    distribution_kernel_on_cuda(
        reads_metadata_only(random("aten::randn_like", D::kNormal, S::kNormal, {"", 0}, {"", 1}))),
    overwrites_self(random("aten::random_", D::kRandom, S::kRandom)),
    random("aten::randint", D::kRandom, S::kRandint),
    reads_metadata_only(random("aten::randint_like", D::kRandom, S::kRandint)),
    distribution_kernel_on_cuda(overwrites_self(
        random("aten::cauchy_", D::kTwoPerElement, S::kCauchy, {"median", 0}, {"sigma", 1}))),
    distribution_kernel_on_cuda(
        overwrites_self(random("aten::geometric_", D::kTwoPerElement, S::kGeometric, {"p", 0.5}))),
    distribution_kernel_on_cuda(overwrites_self(
        random("aten::exponential_", D::kOnScratch, S::kExponential, {"lambd", 1}))),
    distribution_kernel_on_cuda(overwrites_self(
        random("aten::log_normal_", D::kOnScratch, S::kLogNormal, {"mean", 1}, {"std", 2}))),
    distribution_kernel_on_cuda(overwrites_self(
        random("aten::bernoulli_.float", D::kOnScratch, S::kBernoulli, {"p", 0.5}))),
    overwrites_self(random("aten::bernoulli_.Tensor", D::kBernoulliTensor)),
    random("aten::bernoulli", D::kBernoulliTensor),
    distribution_kernel_on_cuda(random("aten::bernoulli.p", D::kOnScratch)),
    random("aten::multinomial", D::kOnScratch),
    with_meta(random("aten::poisson", D::kValueDependent), rules::same_shape),
    random("aten::binomial", D::kValueDependent),
    random("aten::_standard_gamma", D::kValueDependent),
    random("aten::_sample_dirichlet", D::kValueDependent),
    random("aten::rrelu", D::kOnScratchWithValues),  // draws only for negative elements
    random("aten::rrelu_", D::kOnScratchWithValues),
    with_meta(random("aten::rrelu_with_noise", D::kOnScratchWithValues), rules::same_shape),
    random("aten::rrelu_with_noise_", D::kOnScratchWithValues),
    overwrites_self(random("torchdefer::trunc_normal_", D::kValueDependent, S::kTruncatedNormal)),
    with_meta(random("aten::randperm", D::kOnScratch), rules::randperm),
    with_meta(random("aten::randperm.generator", D::kOnScratch), rules::randperm),

    // Region-replay factories and region-exact pointwise ops.
    factory("aten::zeros"),
    factory("aten::ones"),
    factory("aten::full"),
    factory("aten::empty"),
    factory("aten::empty_strided"),
    reads_metadata_only(factory("aten::zeros_like")),
    reads_metadata_only(factory("aten::ones_like")),
    reads_metadata_only(factory("aten::full_like")),
    reads_metadata_only(factory("aten::empty_like")),
    reads_metadata_only(factory("aten::new_zeros")),
    reads_metadata_only(factory("aten::new_ones")),
    reads_metadata_only(factory("aten::new_full")),
    reads_metadata_only(factory("aten::new_empty")),
    // In-place writes of every element that read none (Note [Dead writes]); the random ones are
    // marked where they are listed above.
    overwrites_self("aten::fill_"),
    overwrites_self("aten::zero_"),
    overwrites_self("aten::copy_"),
    region("aten::cat", RegionRule::kJoinsInputs),
    region("aten::concat", RegionRule::kJoinsInputs),
    region("aten::concatenate", RegionRule::kJoinsInputs),
    region("aten::stack", RegionRule::kJoinsInputs),
    region("aten::add", RegionRule::kExactUnitAlpha),
    region("aten::sub", RegionRule::kExactUnitAlpha),
    exact("aten::rsub"),
    exact("aten::mul"),
    exact("aten::div"),
    exact("aten::neg"),
    with_meta(exact("aten::abs"), rules::abs),
    exact("aten::sqrt"),
    exact("aten::exp"),
    exact("aten::log"),
    exact("aten::log1p"),
    exact("aten::expm1"),
    exact("aten::sin"),
    exact("aten::cos"),
    exact("aten::tanh"),
    exact("aten::erf"),
    exact("aten::erfinv"),
    exact("aten::atan"),
    exact("aten::clamp"),
    exact("aten::clamp_min"),
    exact("aten::clamp_max"),
    // torch.where(condition) is nonzero(condition), composite: it reads values (Note [Reading
    // values while recording]); the other overloads are pointwise.
    with_values(exact("aten::where"), "torch::where(condition)", ValueRule::kConditionOnly),
    exact("aten::sign"),
    exact("aten::maximum"),
    exact("aten::minimum"),
    exact("aten::fmod"),
    exact("aten::remainder"),
    exact("aten::square"),
    exact("aten::reciprocal"),
    exact("aten::floor"),
    exact("aten::ceil"),
    exact("aten::round"),
    exact("aten::trunc"),
    contiguous_result(exact("aten::masked_fill")),
    exact("aten::fill"),
    exact("aten::zero"),
    exact("aten::addcmul"),
    exact("aten::addcdiv"),
    exact("aten::lerp"),
    exact("aten::eq"),
    exact("aten::ne"),
    exact("aten::lt"),
    exact("aten::le"),
    exact("aten::gt"),
    exact("aten::ge"),
    exact("aten::to"),
    exact("aten::_to_copy"),
    exact("aten::clone"),
    exact("aten::contiguous"),
    exact("aten::copy"),

    // Ops that read values (Note [Reading values while recording]). ATen's tags mark most; these
    // entries name them for messages, add the untagged ones, and narrow aten::index (tagged for
    // its boolean masks) and repeat_interleave to the calls whose shapes depend on values.
    reads_values("aten::_local_scalar_dense", "Tensor::item()"),
    reads_values("aten::item", "Tensor::item()"),
    reads_values("aten::is_nonzero", "bool(Tensor)"),
    reads_values("aten::equal", "torch::equal"),
    reads_values("aten::allclose", "torch::allclose"),
    reads_values("aten::nonzero", "Tensor::nonzero()"),
    reads_values("aten::nonzero_numpy", "Tensor::nonzero()"),
    reads_values("aten::argwhere", "torch::argwhere"),
    reads_values("aten::masked_select", "torch::masked_select"),
    reads_values("aten::unique_consecutive", "torch::unique_consecutive"),
    reads_values("aten::unique_dim", "torch::unique"),
    reads_values("aten::unique_dim_consecutive", "torch::unique_consecutive"),
    reads_values("aten::_unique", "torch::unique"),
    reads_values("aten::_unique2", "torch::unique"),
    reads_values("aten::bincount", "torch::bincount"),
    reads_values("aten::histc", "torch::histc"),
    reads_values("aten::one_hot", "torch::nn::functional::one_hot"),
    reads_values("aten::_assert_async", "torch::_assert_async"),
    reads_values("aten::index", "indexing with a boolean mask (t[mask])",
                 ValueRule::kWithBoolIndex),
    reads_values("aten::repeat_interleave", "torch::repeat_interleave with tensor repeats",
                 ValueRule::kWithFakeRepeats),

    // Note [Composite ops that read values inside]
    records_its_parts("aten::quantile"),
    records_its_parts("aten::nanquantile"),

    // Note [Conjugate and negative views of fakes]
    makes_bit_view("aten::_conj", BitView::kAlways),
    makes_bit_view("aten::_neg_view", BitView::kAlways),
    makes_bit_view("aten::mH", BitView::kOfComplexInput),
    makes_bit_view("aten::adjoint", BitView::kOfComplexInput),
    makes_bit_view("aten::matrix_H", BitView::kOfComplexInput),

    // Meta rules (Note [Meta rules]).
    meta("aten::abs_", rules::in_place),
    meta("aten::relu", rules::same_shape),
    meta("aten::hardtanh", rules::same_shape),
    meta("aten::hardswish", rules::same_shape),
    meta("aten::_prelu_kernel", rules::same_shape),
    meta("aten::log_sigmoid_forward", rules::with_empty_buffer),
    meta("aten::where.self", rules::where_self),
    meta("aten::index_select", rules::index_select),
    with_unmarked_writes(meta("aten::native_batch_norm", rules::batch_norm), kRunningStats,
                         "training"),
    with_unmarked_writes("aten::batch_norm", kRunningStats, "training"),
    with_unmarked_writes("aten::_batch_norm_impl_index", kRunningStats, "training"),
    with_unmarked_writes("aten::instance_norm", kRunningStats, "use_input_stats"),
    with_unmarked_writes(meta("aten::cudnn_batch_norm", rules::cudnn_batch_norm), kRunningStats,
                         "training"),
    with_unmarked_writes("aten::miopen_batch_norm", kRunningStats, "training"),
    meta("aten::_native_batch_norm_legit", rules::batch_norm),
    meta("aten::_native_batch_norm_legit.no_stats", rules::batch_norm_no_stats),
    meta("aten::_batch_norm_with_update", rules::batch_norm_with_update),
    meta("aten::native_dropout", rules::native_dropout),
    meta("aten::_adaptive_avg_pool2d", rules::adaptive_avg_pool2d),
    meta("aten::convolution", rules::convolution),
    meta("aten::_convolution", rules::convolution),
    meta("aten::_thnn_fused_lstm_cell", rules::fused_lstm_cell),
    meta("aten::mkldnn_rnn_layer", rules::mkldnn_rnn_layer),
    meta("aten::geqrf", rules::geqrf),
    // Note [Meta rules of value-reading reductions]
    meta("aten::max", rules::full_extremum),
    meta("aten::min", rules::full_extremum),
    meta("aten::median", rules::full_reduction),
    meta("aten::nanmedian", rules::full_reduction),
    meta("aten::prod", rules::full_reduction_to_long),
    meta("aten::trace", rules::trace),
    meta("aten::std.correction", rules::variance),
    meta("aten::var.correction", rules::variance),
    meta("aten::std_mean.correction", rules::variance_and_mean),
    meta("aten::var_mean.correction", rules::variance_and_mean),
    meta("aten::median.dim", rules::values_and_indices),
    meta("aten::nanmedian.dim", rules::values_and_indices),
    meta("aten::kthvalue", rules::values_and_indices),
    meta("aten::mode", rules::values_and_indices),
    meta("aten::cummax", rules::cumulative_values_and_indices),
    meta("aten::cummin", rules::cumulative_values_and_indices),
    meta("aten::count_nonzero.dim_IntList", rules::count_nonzero),
    meta("aten::nansum", rules::nansum),
    meta("aten::isnan", rules::same_shape_bool),
    meta("aten::logical_not", rules::same_shape_bool),
    meta("aten::logical_not_", rules::in_place),
    meta("aten::logical_and", rules::broadcast_bool),
    meta("aten::logical_and_", rules::in_place),
    meta("aten::logical_or", rules::broadcast_bool),
    meta("aten::logical_or_", rules::in_place),
    meta("aten::logical_xor", rules::broadcast_bool),
    meta("aten::logical_xor_", rules::in_place),
    meta("aten::searchsorted.Tensor", rules::searchsorted),
    meta("aten::searchsorted.Scalar", rules::searchsorted),
    meta("aten::_cdist_forward", rules::cdist_forward),
};

const std::unordered_map<std::string_view, const OpInfo*>& index() {
  static const auto* const by_key = [] {
    auto* map = new std::unordered_map<std::string_view, const OpInfo*>();
    for (const OpInfo& info : kOps) {
      TORCH_INTERNAL_ASSERT(map->emplace(info.name, &info).second,
                            "torchdefer: the op table lists ", info.name, " twice");
    }
    return map;
  }();
  return *by_key;
}

const OpInfo* lookup(std::string_view key) {
  const auto& by_key = index();
  const auto found = by_key.find(key);
  return found == by_key.end() ? nullptr : found->second;
}

bool has_bool_index(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> arguments) {
  for (size_t i = 0; i < schema.arguments().size() && i < arguments.size(); ++i) {
    if (schema.arguments()[i].name() != "indices" || !arguments[i].isList()) {
      continue;
    }
    for (const c10::IValue& index : arguments[i].toListRef()) {
      if (index.isTensor() && index.toTensor().defined() &&
          (index.toTensor().scalar_type() == at::kBool ||
           index.toTensor().scalar_type() == at::kByte)) {
        return true;
      }
    }
  }
  return false;
}

bool has_fake_repeats_without_output_size(const c10::FunctionSchema& schema,
                                          c10::ArrayRef<c10::IValue> arguments) {
  bool fake_repeats = false;
  for (size_t i = 0; i < schema.arguments().size() && i < arguments.size(); ++i) {
    const std::string& name = schema.arguments()[i].name();
    if (name == "output_size" && !arguments[i].isNone()) {
      return false;
    }
    const bool repeats_tensor =
        (name == "repeats" || (name == "self" && schema.overload_name() == "Tensor")) &&
        arguments[i].isTensor();
    fake_repeats = fake_repeats || (repeats_tensor && is_fake(arguments[i].toTensor()));
  }
  return fake_repeats;
}

}  // namespace

const OpInfo* find_op_info(const c10::OperatorName& op) {
  if (!op.overload_name.empty()) {
    if (const OpInfo* info = lookup(op.name + "." + op.overload_name)) {
      return info;
    }
  }
  return lookup(op.name);
}

const OpInfo* find_op_info(std::string_view name) { return lookup(name); }

c10::ArrayRef<OpInfo> op_table() { return kOps; }

bool writes_argument(const c10::FunctionSchema& schema, size_t index) {
  const c10::Argument& argument = schema.arguments()[index];
  if (argument.alias_info() != nullptr && argument.alias_info()->isWrite()) {
    return true;
  }
  const OpInfo* info = find_op_info(schema.operator_name());
  return info != nullptr && index < 32 && (info->unmarked_writes >> index & 1u) != 0;
}

bool makes_tensor_from_meta_template(const c10::OperatorHandle& op,
                                     c10::ArrayRef<c10::IValue> arguments) {
  // Cheapest first: a call on real tensors asks this, and nearly none holds a meta tensor.
  bool template_given = false;
  for (const c10::IValue& argument : arguments) {
    if (argument.isTensor()) {
      const at::Tensor& t = argument.toTensor();
      if (t.defined() && !t.is_meta()) {
        return false;
      }
      template_given = template_given || t.defined();
    }
  }
  if (!template_given) {
    return false;
  }
  const c10::FunctionSchema& schema = op.schema();
  const OpInfo* info = find_op_info(schema.operator_name());
  if (info == nullptr || !info->reads_metadata_only) {
    return false;
  }
  for (size_t i = 0; i < schema.arguments().size() && i < arguments.size(); ++i) {
    if (is_device_argument(schema.arguments()[i]) && arguments[i].isDevice()) {
      return !arguments[i].toDevice().is_meta();
    }
  }
  return false;
}

bool is_random(const c10::OperatorHandle& op) {
  return op.hasTag(at::Tag::nondeterministic_seeded);
}

bool lays_out_like_tensor_iterator(const c10::OperatorHandle& op) {
  if (!op.hasTag(at::Tag::pointwise)) {
    return false;
  }
  const OpInfo* info = find_op_info(op.schema().operator_name());
  return info == nullptr || !info->contiguous_result;
}

std::optional<std::string> value_reading_api(const c10::OperatorHandle& op,
                                             c10::ArrayRef<c10::IValue> arguments) {
  const c10::FunctionSchema& schema = op.schema();
  const OpInfo* info = lookup(schema.name());
  const ValueRule rule = info != nullptr ? info->values : ValueRule::kFromTags;
  bool reads = false;
  switch (rule) {
    case ValueRule::kFromTags:
      reads = op.hasTag(at::Tag::data_dependent_output) || op.hasTag(at::Tag::dynamic_output_shape);
      break;
    case ValueRule::kAlways:
      reads = true;
      break;
    case ValueRule::kWithBoolIndex:
      reads = has_bool_index(schema, arguments);
      break;
    case ValueRule::kWithFakeRepeats:
      reads = has_fake_repeats_without_output_size(schema, arguments);
      break;
    case ValueRule::kConditionOnly:
      reads = schema.arguments().size() == 1;
      break;
  }
  if (!reads) {
    return std::nullopt;
  }
  return info != nullptr && info->api != nullptr ? std::string(info->api) : schema.name();
}

}  // namespace torchdefer
