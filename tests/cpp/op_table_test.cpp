// The op table against ATen: every entry names an operator this LibTorch has, and the meta rules
// loading registered are Meta kernels only for ops torch had none for.
#include <torchdefer/boxed_arguments.h>
#include <torchdefer/op_table.h>
#include <torchdefer/torchdefer.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "recorder/src/recorder_kernels.h"

namespace torchdefer {
namespace {

c10::OperatorName operator_name(std::string_view key) {
  const size_t dot = key.find('.');
  return c10::OperatorName(std::string(key.substr(0, dot)), dot == std::string_view::npos
                                                                ? std::string()
                                                                : std::string(key.substr(dot + 1)));
}

// The operators an entry describes: its overload, or every overload of its name.
std::vector<c10::OperatorHandle> ops_of(std::string_view key) {
  std::vector<c10::OperatorHandle> ops;
  const bool one_overload = key.find('.') != std::string_view::npos;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    const bool matches = one_overload ? name == operator_name(key) : name.name == key;
    if (matches) {
      ops.push_back(*c10::Dispatcher::singleton().findOp(name));
    }
  }
  return ops;
}

TEST(OpTable, EveryAtenEntryNamesAnOperatorOfThisLibTorch) {
  for (const OpInfo& info : op_table()) {
    if (info.name.substr(0, 6) != "aten::") {
      continue;  // torchdefer's own ops are defined where the package loads
    }
    EXPECT_FALSE(ops_of(info.name).empty()) << info.name;
  }
}

TEST(OpTable, EveryRandomEntryDescribesOpsTaggedNondeterministicSeeded) {
  for (const OpInfo& info : op_table()) {
    if (!info.draws || info.name.substr(0, 6) != "aten::") {
      continue;
    }
    for (const c10::OperatorHandle& op : ops_of(info.name)) {
      EXPECT_TRUE(is_random(op)) << op.operator_name();
    }
  }
}

TEST(OpTable, EveryOverwritesSelfEntryDescribesOpsThatWriteTheirFirstArgumentAlone) {
  int entries = 0;
  for (const OpInfo& info : op_table()) {
    if (!info.overwrites_self) {
      continue;
    }
    ++entries;
    for (const c10::OperatorHandle& op : ops_of(info.name)) {
      const auto& arguments = op.schema().arguments();
      EXPECT_TRUE(writes_first_argument(op.schema())) << op.operator_name();
      for (size_t i = 1; i < arguments.size(); ++i) {
        EXPECT_FALSE(is_written(arguments[i])) << op.operator_name() << " " << arguments[i].name();
      }
    }
  }
  EXPECT_GT(entries, 0);
}

TEST(OpTable, OverloadEntriesWinOverTheirNameEntry) {
  EXPECT_EQ(find_op_info(c10::OperatorName("aten::bernoulli_", "float"))->sampler,
            CounterSampler::kBernoulli);
  EXPECT_EQ(find_op_info(c10::OperatorName("aten::bernoulli_", "Tensor"))->draws,
            DrawRule::kBernoulliTensor);
  EXPECT_EQ(find_op_info(c10::OperatorName("aten::bernoulli", "p"))->draws, DrawRule::kOnScratch);
  EXPECT_EQ(find_op_info(c10::OperatorName("aten::bernoulli", ""))->draws,
            DrawRule::kBernoulliTensor);
  EXPECT_EQ(find_op_info(c10::OperatorName("aten::uniform_", ""))->sampler,
            CounterSampler::kUniform);
  EXPECT_EQ(find_op_info(c10::OperatorName("aten::sigmoid", "")), nullptr);
}

TEST(OpTable, IndexReadsValuesOnlyWithABooleanMask) {
  const auto index = c10::Dispatcher::singleton().findSchemaOrThrow("aten::index", "Tensor");
  const at::Tensor self = at::zeros({4});
  c10::List<std::optional<at::Tensor>> by_mask;
  by_mask.push_back(self > 0);
  c10::List<std::optional<at::Tensor>> by_position;
  by_position.push_back(at::arange(2));
  EXPECT_TRUE(value_reading_api(index, {self, by_mask}).has_value());
  EXPECT_FALSE(value_reading_api(index, {self, by_position}).has_value());
  const auto nonzero = c10::Dispatcher::singleton().findSchemaOrThrow("aten::nonzero", "");
  EXPECT_EQ(value_reading_api(nonzero, {self}), "Tensor::nonzero()");
  const auto add = c10::Dispatcher::singleton().findSchemaOrThrow("aten::add", "Tensor");
  EXPECT_FALSE(value_reading_api(add, {self, self, 1}).has_value());
}

TEST(Registrations, MetaRulesAreRegisteredInACxxProcessOnlyForOpsWithoutAMetaKernel) {
  // A C++-only process has no Python meta kernels, so some rules are needed; each one now serves
  // Meta, and ops whose Meta kernel is torch's kept it (their rule was not registered).
  EXPECT_GT(detail::registered_meta_rules(), 0);
  int with_rule = 0;
  for (const OpInfo& info : op_table()) {
    if (info.meta == nullptr) {
      continue;
    }
    ++with_rule;
    const auto op = c10::Dispatcher::singleton().findOp(operator_name(info.name));
    ASSERT_TRUE(op.has_value()) << info.name;
    EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::Meta)) << info.name;
  }
  EXPECT_LE(detail::registered_meta_rules(), with_rule);
}

TEST(TorchRngPlacement, BernoulliOfAnUnusedTensorLeavesTheGeneratorWhereEagerDoes) {
  const auto build = [] {
    torch::bernoulli(torch::rand({5}, torch::kDouble));  // two draws per element, then dropped
    return torch::randn({20});
  };
  torch::manual_seed(0);
  const at::Tensor eager = build();
  const at::Tensor eager_next = torch::rand({3});
  torch::manual_seed(0);
  at::Tensor deferred = deferred_init(build);
  const at::Tensor deferred_next = torch::rand({3});
  materialize_tensor(deferred);
  EXPECT_TRUE(torch::equal(deferred, eager));
  EXPECT_TRUE(torch::equal(deferred_next, eager_next));
}

TEST(TorchRngPlacement, ARandomFillOfAnEmptyIntegerTensorDoesNothingAsInEager) {
  for (const RngMode mode : {RngMode::kTorch, RngMode::kCounter}) {
    at::Tensor t = deferred_init([] { return torch::empty({0, 3}, torch::kLong).normal_(); });
    materialize_tensor(t, MaterializeOptions().rng(mode));
    EXPECT_FALSE(is_fake(t));
    EXPECT_EQ(t.sizes(), c10::IntArrayRef({0, 3}));
  }
}

}  // namespace
}  // namespace torchdefer
