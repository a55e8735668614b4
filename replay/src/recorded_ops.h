// Reading recorded nodes: their arguments, and which counter distribution a random op is.
#pragma once

#include <torchdefer/boxed_arguments.h>
#include <torchdefer/counter_rng.h>
#include <torchdefer/op_graph.h>
#include <torchdefer/op_table.h>

#include <optional>
#include <string_view>

namespace torchdefer::detail {

// The value of a float or int argument of `node` named `name`, if it has one.
std::optional<double> double_argument(const RecordedNode& node, std::string_view name);

// Note [Counter-mode truncated normal]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// torch.nn.init.trunc_normal_ is rejection sampling in PyTorch 2.13: how many numbers it draws
// depends on the values, so no element is a function of its index and no slice can be computed
// alone. Under deferred_init it is recorded as one op, torchdefer::trunc_normal_ (Note
// [trunc_normal_ as one operator]). Torch mode replays torch's sampler (eager's bits). Counter mode
// owes nothing to eager's bits, only to invariance, so it samples the same distribution by
// inverse CDF, element by element (Note [Counter RNG]): u ~ counter uniform over
// [erf(alpha / sqrt 2), erf(beta / sqrt 2)), x = clamp(mean + std * (sqrt 2 * erfinv(u)), a, b),
// with alpha, beta = (a or b - mean) / std (the sampler PyTorch used before 2.13), in double,
// then rounded to the dtype. erf and erfinv are torchdefer's own (replay/src/counter_math.h),
// built from IEEE + - * / and sqrt with contraction off, like the rest of the counter math, so
// the CPU fill and the CUDA kernel have the same bits, whatever the C library or the GPU. Every
// element is a function of its index alone, so a slice has the full tensor's bits, and shards of
// every world size agree. Accuracy (CounterMath tests, against the C library's erf and ATen's
// float64 erfinv): erf within 5 ulp, erfinv within 4 ulp on (-1, 1) (2.1 against mpmath).

// Whether the random op `node` has a counter-mode definition: a counter distribution (Note
// [Counter RNG]) or torchdefer's truncated normal.
bool has_counter_definition(const RecordedNode& node);

// Note [Counter keys of explicit generators]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A random op on the default generator is keyed (seed, stream) = (the recording's counter seed,
// the op's index among the recording's random ops): a digest of the default generator's state
// when recording began, or MaterializeOptions' counter_seed. A random op given its own CPU
// torch.Generator (trainers pass one, seeded from their init seed, to every init) follows that
// generator instead, as it does in eager: its seed names the op's place on the generator, and its
// stream is kExplicitGeneratorStream, apart from every default-generator op's index. The place is
// the op's anchor and offset (Note [Explicit generators]): at a state of the generator, the
// digest of that full state, which is the generator's seed and its position in its stream
// together; after a sampler the generator owes (Note [Followed generators]), a digest of the
// anchor the sampler started from, the draws between, and the sampler, since the state after it
// exists only once it has run, and counter mode runs no sampler. Anything that reads the
// generator in between (which pays it) leaves the place as it is. So two models built from
// torch.Generator().manual_seed(1) and manual_seed(2) get different counter weights, the same seed
// gives the same weights whatever the default generator's seed or the counter_seed option, and ops
// drawn one after another from one generator get different keys, as they get different numbers in
// eager. The key is a function of the recording alone: every world size and layout computes the
// same values.
inline constexpr uint64_t kExplicitGeneratorStream = uint64_t{1} << 63;

struct CounterKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
};

// The counter key of random op `node` of `graph`, given the recording's counter seed.
CounterKey counter_key(const OpGraph& graph, const RecordedNode& node, uint64_t recording_seed);

// A seed for a CPU generator from `key`, for random ops with no counter distribution (randperm,
// multinomial): still a function of the recording alone, but not element-addressable.
uint64_t generator_seed(const CounterKey& key);

// Fills `out` with the counter-mode values of random op `node` under `key` at the positions
// `region` places `out` in the op's output; false, touching nothing, if `node` has no counter-mode
// definition.
bool counter_fill_node(const RecordedNode& node, const at::Tensor& out, const CounterKey& key,
                       const CounterRegion& region = {});

// How region replay treats `node`: its op table RegionRule, looked up by name with an in-place
// op's trailing underscore dropped.
RegionRule region_rule(const RecordedNode& node);

// Note [Region-exact pointwise ops]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A pointwise op computed on a region must give the bits it gives on the whole tensor. ATen does
// not promise that: its CPU loops run a vectorized body and a scalar tail, and for some ops the
// two differ in the last bit (sigmoid, exp2, pow with a fractional exponent, gelu in float32 and
// float64; rsqrt in bfloat16; add/sub with alpha in float16 and bfloat16). Which elements land in
// the tail depends on where a region starts, so such an op would make shards disagree with the
// full tensor. Only ops whose results are exactly rounded or computed the same way on both paths
// are listed here; tests/cpp/shard_test.cpp checks every one of them, for every floating dtype,
// at region boundaries that are not vector aligned, so a PyTorch that changes a kernel fails CI
// instead of producing shards that do not concatenate. Everything else falls back. The op table
// (core/src/op_table.cpp) lists the ops, as RegionRule::kExactPointwise or kExactUnitAlpha. The
// whole-tensor replay relies on the same list to run in-place ops in a fill's parts (Note
// [Pointwise ops after a fill run in its parts]).
bool region_exact_pointwise(const RecordedNode& node, c10::ScalarType dtype);

}  // namespace torchdefer::detail
