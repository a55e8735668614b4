// What torchdefer knows about individual operators, in one table keyed by operator name: how a
// random op draws from PyTorch's generator, which counter distribution it samples, whether an op
// reads tensor values, how region replay treats it, and which ops get a meta rule. Each layer
// reads the part it needs; adding an op is one entry in core/src/op_table.cpp.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchdefer {

// How many 32-bit numbers a random op draws from PyTorch's default CPU generator (Note [Torch-mode
// draw offsets] in recorder/src/torch_rng.h says why each rule is what it is).
enum class DrawRule : uint8_t {
  kOnScratch,            // run at record time on a scratch copy whose fake inputs are ones
  kOnScratchWithValues,  // run at record time on a scratch copy of its inputs' values
  kValueDependent,       // draws depend on the values it draws: never run at record time
                         // (Note [Lazy RNG anchors]); run as kOnScratchWithValues when it
                         // reads fakes other than the tensor it fills
  kUniform,              // one per element, two for float64
  kNormal,               // normal fill: known for 16 or more contiguous elements, else scratch
  kRandom,               // random_/randint: one or two per element by range and dtype
  kTwoPerElement,        // cauchy_, geometric_
  kBernoulliTensor,      // one per element, two when the probabilities are float64
};

// How a random op on a CUDA tensor moves CUDA's Philox offset (Note [Torch-mode draws on CUDA] in
// recorder/internal/torchdefer/cuda_draws.h).
enum class CudaDrawRule : uint8_t {
  kRunTells,            // only a run tells (rejection loops, dropout, randperm, ...)
  kDistributionKernel,  // ATen's distribution kernel over the tensor it fills: computed
};

// The distribution a random op samples in counter RNG mode (Note [Counter RNG]); kNone for ops
// that have none (randperm, multinomial, dropout), which replay on a seeded generator instead.
enum class CounterSampler : uint8_t {
  kNone,
  kUniform,
  kNormal,
  kBernoulli,
  kExponential,
  kLogNormal,
  kCauchy,
  kGeometric,
  kRandom,           // random_: bounds `from`, `to`
  kRandint,          // randint/randint_like: bounds `low`, `high`
  kTruncatedNormal,  // Note [Counter-mode truncated normal]
};

// A distribution parameter: the value of argument `argument` (a float or int), or `fallback`
// when the op has no such argument or it was not given.
struct CounterParameter {
  std::string_view argument;
  double fallback = 0.0;
};

// How region replay computes a region of an op's output (Note [Region replay]).
enum class RegionRule : uint8_t {
  kFallsBack,       // computed whole, then sliced
  kFactory,         // a constant or uninitialized fill: computes just the region
  kExactPointwise,  // Note [Region-exact pointwise ops]
  kExactUnitAlpha,  // exact unless `alpha` is not 1 in float16 or bfloat16 (add, sub)
  kJoinsInputs,     // cat and stack: Note [Region rules for cat and stack]
};

// Whether a call reads tensor values to decide its output's shape or a host value.
enum class ValueRule : uint8_t {
  kFromTags,  // as ATen tags it: data_dependent_output or dynamic_output_shape
  kAlways,
  kWithBoolIndex,    // aten::index with a boolean or byte mask among its indices
  kWithFakeRepeats,  // repeat_interleave with tensor repeats that are fake and no output_size
  kConditionOnly,    // where(condition), torch.where's one-argument form: nonzero of it
};

// Whether an op makes a conjugate or negative view, which fakes cannot keep.
enum class BitView {
  kNone,
  kAlways,          // aten::_conj, aten::_neg_view
  kOfComplexInput,  // composites that call _conj below the recorder for a complex input (mH, ...)
};

// A meta rule: an op's meta outputs from its meta arguments (Note [Meta rules]).
using MetaRule = std::vector<c10::IValue> (*)(c10::ArrayRef<c10::IValue> arguments);

// One operator, or one overload of it.
struct OpInfo {
  std::string_view name;  // "aten::normal_", or "aten::where.self" for one overload
  std::optional<DrawRule> draws;
  CudaDrawRule cuda_draws = CudaDrawRule::kRunTells;
  CounterSampler sampler = CounterSampler::kNone;
  CounterParameter first;   // the sampler's first parameter (from, mean, p, lambda, median)
  CounterParameter second;  // its second (to, std, sigma), if any
  RegionRule region = RegionRule::kFallsBack;
  ValueRule values = ValueRule::kFromTags;
  const char* api = nullptr;  // how users call a value-reading op, for messages
  MetaRule meta = nullptr;
  // Writes every element of its first argument (`self`), writes nothing else, and reads none of
  // self's values: a write that replay may skip when the next one covers it (Note [Dead writes]).
  bool overwrites_self = false;
  // Arguments (bit i: the i-th of the schema) the kernel writes although the schema marks no
  // write: Note [Writes the schema does not show]. When `unmarked_writes_when` names a bool
  // argument, only in calls where it is true (batch_norm's `training`).
  uint32_t unmarked_writes = 0;
  std::string_view unmarked_writes_when;
  // A composite op recorded as the ops its kernel calls, not as one call: Note [Composite ops that
  // read values inside].
  bool records_its_parts = false;
  // Makes a view that sets a bit fakes do not keep (Note [Conjugate and negative views of fakes]).
  BitView bit_view = BitView::kNone;
  // A pointwise op whose kernel returns a contiguous result whatever its inputs' layout
  // (masked_fill clones self contiguous), not TensorIterator's (Note [Pointwise results take
  // TensorIterator's layout]).
  bool contiguous_result = false;
  // Reads only its tensor arguments' metadata (the `_like` and `new_*` factories): Note [Factories
  // of meta templates].
  bool reads_metadata_only = false;
};

// Whether `op`'s kernel may write its argument `index`: the schema marks it written, or the op
// table says the kernel writes it anyway.
bool writes_argument(const c10::FunctionSchema& schema, size_t index);

// The entry for `op`: its overload's own entry if the table has one, else its name's; nullptr if
// the table has neither.
const OpInfo* find_op_info(const c10::OperatorName& op);

// The entry for operator name `name` (no overload), or nullptr.
const OpInfo* find_op_info(std::string_view name);

// Every entry, for registering meta rules and for tests that check each entry against ATen.
c10::ArrayRef<OpInfo> op_table();

// True if a call of `op` with `arguments` (its boxed arguments, in schema order) makes a new tensor
// on a real device from the metadata of meta tensors alone (`torch.empty_like(meta, device="cpu")`,
// what Module.to_empty does): a factory, whose result is a fake under a FakeMode (Note [Factories
// of meta templates]).
bool makes_tensor_from_meta_template(const c10::OperatorHandle& op,
                                     c10::ArrayRef<c10::IValue> arguments);

// True if `op` draws random numbers: ATen tags those nondeterministic_seeded.
bool is_random(const c10::OperatorHandle& op);

// True if `op`'s kernel lays out its result as a TensorIterator over its tensor arguments does:
// ATen tags those ops pointwise, less the table's contiguous_result ones (Note [Pointwise results
// take TensorIterator's layout]).
bool lays_out_like_tensor_iterator(const c10::OperatorHandle& op);

// If a call of `op` with `arguments` (its boxed arguments, in schema order) reads tensor values
// to decide its output's shape or a host value, how users call it ("Tensor::nonzero()", or the
// schema name); nullopt otherwise.
std::optional<std::string> value_reading_api(const c10::OperatorHandle& op,
                                             c10::ArrayRef<c10::IValue> arguments);

}  // namespace torchdefer
