#include "recorded_ops.h"

#include <torchdefer/op_table.h>
#include <torchdefer/rng_anchors.h>

#include <cmath>
#include <string>

namespace torchdefer::detail {

std::optional<double> double_argument(const RecordedNode& node, std::string_view name) {
  const auto& arguments = node.op.schema().arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (arguments[i].name() == name &&
        (node.arguments[i].isDouble() || node.arguments[i].isInt())) {
      return node.arguments[i].isDouble() ? node.arguments[i].toDouble()
                                          : static_cast<double>(node.arguments[i].toInt());
    }
  }
  return std::nullopt;
}

namespace {

double parameter(const RecordedNode& node, const CounterParameter& p) {
  return p.argument.empty() ? p.fallback : double_argument(node, p.argument).value_or(p.fallback);
}

std::optional<CounterDistribution> distribution_of(CounterSampler sampler) {
  using D = CounterDistribution;
  switch (sampler) {
    case CounterSampler::kUniform:
      return D::kUniform;
    case CounterSampler::kNormal:
      return D::kNormal;
    case CounterSampler::kBernoulli:
      return D::kBernoulli;
    case CounterSampler::kExponential:
      return D::kExponential;
    case CounterSampler::kLogNormal:
      return D::kLogNormal;
    case CounterSampler::kCauchy:
      return D::kCauchy;
    case CounterSampler::kGeometric:
      return D::kGeometric;
    case CounterSampler::kRandom:
    case CounterSampler::kRandint:
      return D::kRandom;
    case CounterSampler::kNone:
    case CounterSampler::kTruncatedNormal:
      return std::nullopt;
  }
  return std::nullopt;
}

// The counter distribution of a random op, if it has one (Note [Counter RNG]).
std::optional<CounterDistributionParams> counter_params(const RecordedNode& node) {
  const OpInfo* info = find_op_info(node.op.schema().operator_name());
  const std::optional<CounterDistribution> distribution =
      info != nullptr ? distribution_of(info->sampler) : std::nullopt;
  if (!distribution) {
    return std::nullopt;
  }
  if (*distribution != CounterDistribution::kRandom) {
    return CounterDistributionParams{*distribution, parameter(node, info->first),
                                     parameter(node, info->second)};
  }
  // Bounds are read as ints: beyond 2^53 they do not survive a trip through double.
  const bool random = info->sampler == CounterSampler::kRandom;
  const auto& schema = node.op.schema();
  const auto low = int_argument(schema, node.arguments, random ? "from" : "low");
  const auto high = int_argument(schema, node.arguments, random ? "to" : "high");
  if (random && low && !high) {
    return std::nullopt;  // [from, 2^63): not a counter distribution
  }
  CounterDistributionParams params{CounterDistribution::kRandom};
  if (high) {
    params.from = low.value_or(0);
    params.range = static_cast<uint64_t>(*high - params.from);
  }
  return params;
}

struct TruncatedNormalParams {
  double mean = 0.0;
  double std = 1.0;
  double a = -2.0;
  double b = 2.0;
};

std::optional<TruncatedNormalParams> truncated_normal_params(const RecordedNode& node) {
  const OpInfo* info = find_op_info(node.op.schema().operator_name());
  if (info == nullptr || info->sampler != CounterSampler::kTruncatedNormal) {
    return std::nullopt;
  }
  const auto mean = double_argument(node, "mean");
  const auto std = double_argument(node, "std");
  const auto a = double_argument(node, "a");
  const auto b = double_argument(node, "b");
  if (!mean || !std || !a || !b || !(*std > 0) || !(*a < *b)) {
    return std::nullopt;
  }
  return TruncatedNormalParams{*mean, *std, *a, *b};
}

void counter_fill_truncated_normal(const at::Tensor& out, const TruncatedNormalParams& params,
                                   uint64_t seed, uint64_t stream, const CounterRegion& region) {
  CounterDistributionParams distribution{CounterDistribution::kTruncatedNormal, params.mean,
                                         params.std};
  distribution.low = params.a;
  distribution.high = params.b;
  counter_fill(out, distribution, seed, stream, region);
}

}  // namespace

bool has_counter_definition(const RecordedNode& node) {
  return truncated_normal_params(node) || counter_params(node);
}

CounterKey counter_key(const OpGraph& graph, const RecordedNode& node, uint64_t recording_seed) {
  const RecordedDraws& draws = *node.draws;
  if (draws.generator_argument < 0) {
    return CounterKey{recording_seed, draws.stream};
  }
  return CounterKey{digest_position(graph.rng_anchor(draws.anchor)->digest(), draws.offset),
                    kExplicitGeneratorStream};
}

uint64_t generator_seed(const CounterKey& key) {
  // splitmix64's finalizer, applied to the stream and then to the seed mixed with it.
  const auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  return mix(key.seed ^ mix(key.stream));
}

bool counter_fill_node(const RecordedNode& node, const at::Tensor& out, const CounterKey& key,
                       const CounterRegion& region) {
  if (out.numel() == 0 && has_counter_definition(node)) {
    return true;  // nothing to fill, whatever the dtype (as eager's kernels return early)
  }
  if (const auto truncated = truncated_normal_params(node)) {
    counter_fill_truncated_normal(out, *truncated, key.seed, key.stream, region);
    return true;
  }
  if (const auto params = counter_params(node)) {
    counter_fill(out, *params, key.seed, key.stream, region);
    return true;
  }
  return false;
}

RegionRule region_rule(const RecordedNode& node) {
  std::string_view name = node.op.schema().name();
  if (!name.empty() && name.back() == '_') {
    name.remove_suffix(1);
  }
  const OpInfo* info = find_op_info(name);
  return info != nullptr ? info->region : RegionRule::kFallsBack;
}

bool region_exact_pointwise(const RecordedNode& node, c10::ScalarType dtype) {
  switch (region_rule(node)) {
    case RegionRule::kExactPointwise:
      return true;
    case RegionRule::kExactUnitAlpha: {
      const std::optional<double> alpha = double_argument(node, "alpha");
      return !alpha || *alpha == 1.0 ||
             (dtype != c10::ScalarType::Half && dtype != c10::ScalarType::BFloat16);
    }
    case RegionRule::kFallsBack:
    case RegionRule::kFactory:
    case RegionRule::kJoinsInputs:
      return false;
  }
  return false;
}

}  // namespace torchdefer::detail
