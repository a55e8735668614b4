#include "recorded_ops.h"

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

// The counter distribution of a random op, if it has one (Note [Counter RNG]).
std::optional<CounterDistributionParams> counter_params(const RecordedNode& node) {
  const std::string& name = node.op.schema().name();
  const std::string& overload = node.op.schema().overload_name();
  auto arg = [&](std::string_view n, double fallback) {
    return double_argument(node, n).value_or(fallback);
  };
  using D = CounterDistribution;
  if (name == "aten::uniform_") {
    return CounterDistributionParams{D::kUniform, arg("from", 0), arg("to", 1)};
  }
  if (name == "aten::rand" || name == "aten::rand_like") {
    return CounterDistributionParams{D::kUniform, 0, 1};
  }
  if (name == "aten::normal_") {
    return CounterDistributionParams{D::kNormal, arg("mean", 0), arg("std", 1)};
  }
  if (name == "aten::randn" || name == "aten::randn_like") {
    return CounterDistributionParams{D::kNormal, 0, 1};
  }
  if (name == "aten::bernoulli_" && overload == "float") {
    return CounterDistributionParams{D::kBernoulli, arg("p", 0.5)};
  }
  if (name == "aten::exponential_") {
    return CounterDistributionParams{D::kExponential, arg("lambd", 1)};
  }
  if (name == "aten::log_normal_") {
    return CounterDistributionParams{D::kLogNormal, arg("mean", 1), arg("std", 2)};
  }
  if (name == "aten::cauchy_") {
    return CounterDistributionParams{D::kCauchy, arg("median", 0), arg("sigma", 1)};
  }
  if (name == "aten::geometric_") {
    return CounterDistributionParams{D::kGeometric, arg("p", 0.5)};
  }
  const bool random = name == "aten::random_";
  const bool randint = name == "aten::randint" || name == "aten::randint_like";
  if (random || randint) {
    // Read as ints: bounds beyond 2^53 do not survive a trip through double.
    const auto& schema = node.op.schema();
    const auto low = int_argument(schema, node.arguments, random ? "from" : "low");
    const auto high = int_argument(schema, node.arguments, random ? "to" : "high");
    if (random && low && !high) {
      return std::nullopt;  // [from, 2^63): not a counter distribution
    }
    CounterDistributionParams params{D::kRandom};
    if (high) {
      params.from = low.value_or(0);
      params.range = static_cast<uint64_t>(*high - params.from);
    }
    return params;
  }
  return std::nullopt;
}

struct TruncatedNormalParams {
  double mean = 0.0;
  double std = 1.0;
  double a = -2.0;
  double b = 2.0;
};

std::optional<TruncatedNormalParams> truncated_normal_params(const RecordedNode& node) {
  if (node.op.schema().name() != "torchdefer::trunc_normal_") {
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

bool counter_fill_node(const RecordedNode& node, const at::Tensor& out, uint64_t seed,
                       const CounterRegion& region) {
  const uint64_t stream = node.draws->stream;
  if (const auto truncated = truncated_normal_params(node)) {
    counter_fill_truncated_normal(out, *truncated, seed, stream, region);
    return true;
  }
  if (const auto params = counter_params(node)) {
    counter_fill(out, *params, seed, stream, region);
    return true;
  }
  return false;
}

}  // namespace torchdefer::detail
