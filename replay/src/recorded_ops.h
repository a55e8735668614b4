// Reading recorded nodes: their arguments, and which counter distribution a random op is.
#pragma once

#include <torchdefer/boxed_arguments.h>
#include <torchdefer/counter_rng.h>
#include <torchdefer/op_graph.h>

#include <optional>
#include <string_view>

namespace torchdefer::detail {

// The value of a float or int argument of `node` named `name`, if it has one.
std::optional<double> double_argument(const RecordedNode& node, std::string_view name);

// The counter distribution of a random op, if it has one (Note [Counter RNG]).
std::optional<CounterDistributionParams> counter_params(const RecordedNode& node);

}  // namespace torchdefer::detail
