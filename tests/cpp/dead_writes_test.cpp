// Note [Dead writes]: a fill that a later write covers before anything reads it is not replayed,
// and materialization still gives eager construction's bits; anything less certain is replayed.
#include <torchdefer/torchdefer.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/cpp/test_util.h"

#include <functional>
#include <string>
#include <vector>

namespace torchdefer {
namespace {

using testing::bitwise_equal;
using ::testing::Contains;
using ::testing::Not;

// Builds tensors `t[0..]` with `build` eagerly and deferred from the same seed, materializes the
// deferred ones together, checks every one and the generator against eager, and returns the ops
// the materialization replayed.
std::vector<std::string> replayed_ops(const std::function<std::vector<at::Tensor>()>& build) {
  torch::manual_seed(5);
  const std::vector<at::Tensor> eager = build();
  const at::Tensor eager_next = torch::rand({3});
  torch::manual_seed(5);
  const std::vector<at::Tensor> deferred = deferred_init(build);
  std::vector<std::string> ops;
  materialize_tensors(deferred, MaterializeOptions().progress(
                                    [&](const MaterializeProgress& p) { ops.push_back(p.op); }));
  EXPECT_TRUE(bitwise_equal(torch::rand({3}), eager_next)) << "generator";
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(deferred[i], eager[i])) << "tensor " << i;
  }
  return ops;
}

TEST(DeadWrites, AFillOverwrittenBeforeAnyReadIsNotReplayed) {
  const auto ops = replayed_ops([] {
    torch::NoGradGuard no_grad;
    at::Tensor w = torch::empty({6, 5}).uniform_(-1, 1);
    at::Tensor after = torch::rand({7});  // placed after the skipped draws
    w.normal_(0, 0.1);
    return std::vector<at::Tensor>{w, after};
  });
  EXPECT_THAT(ops, Not(Contains("aten::uniform_")));
  EXPECT_THAT(ops, Contains("aten::normal_"));
}

TEST(DeadWrites, ALinearsKaimingFillIsSkippedWhenTheModelReinitializesItsWeight) {
  const auto ops = replayed_ops([] {
    torch::NoGradGuard no_grad;
    torch::nn::Linear linear(16, 12);
    linear->weight.normal_(0, 0.02);
    linear->bias.zero_();
    return std::vector<at::Tensor>{linear->weight, linear->bias};
  });
  EXPECT_THAT(ops, Not(Contains("aten::uniform_")));
}

TEST(DeadWrites, AFillCoveredByAValueDependentSamplerIsSkippedAndTheSamplerIsNot) {
  const auto ops = replayed_ops([] {
    torch::NoGradGuard no_grad;
    torch::nn::Linear linear(torch::nn::LinearOptions(24, 10).bias(false));
    testing::trunc_normal_(linear->weight, 0, 0.02, -0.04, 0.04);
    at::Tensor after = torch::randn({20});  // placed after the sampler's lazy anchor
    return std::vector<at::Tensor>{linear->weight, after};
  });
  EXPECT_THAT(ops, Not(Contains("aten::uniform_")));
  EXPECT_THAT(ops, Contains("torchdefer::trunc_normal_"));
}

TEST(DeadWrites, ACoveringWriteThroughAnEarlierViewOfAnotherShapeCounts) {
  const auto ops = replayed_ops([] {
    torch::NoGradGuard no_grad;
    at::Tensor w = torch::empty({4, 6});
    at::Tensor transposed = w.t();
    at::Tensor flat = w.view({24});
    w.uniform_();
    transposed.uniform_(2, 3);  // dense: covers every element
    flat.fill_(2);
    return std::vector<at::Tensor>{w};
  });
  EXPECT_THAT(ops, Not(Contains("aten::uniform_")));
  EXPECT_THAT(ops, Contains("aten::fill_.Scalar"));
}

TEST(DeadWrites, AFillReadBeforeTheNextWriteIsReplayed) {
  const auto ops = replayed_ops([] {
    torch::NoGradGuard no_grad;
    at::Tensor w = torch::empty({5, 3}).uniform_();
    at::Tensor twice = w * 2;
    w.normal_();
    return std::vector<at::Tensor>{w, twice};
  });
  EXPECT_THAT(ops, Contains("aten::uniform_"));
}

TEST(DeadWrites, APartialOverwriteKeepsTheFirstFill) {
  const auto ops = replayed_ops([] {
    torch::NoGradGuard no_grad;
    at::Tensor w = torch::empty({5, 3});
    at::Tensor rows = w.narrow(0, 0, 2);
    at::Tensor every_other = w.view({15}).slice(0, 0, 15, 2);
    w.uniform_();
    rows.normal_();
    every_other.zero_();  // not dense: covers only what it strides over
    return std::vector<at::Tensor>{w};
  });
  EXPECT_THAT(ops, Contains("aten::uniform_"));
  EXPECT_THAT(ops, Contains("aten::normal_"));
}

TEST(DeadWrites, AnOverwriteThatReadsTheStorageKeepsTheFirstFill) {
  const auto ops = replayed_ops([] {
    torch::NoGradGuard no_grad;
    at::Tensor w = torch::empty({4, 4});
    at::Tensor corner = w[0][0];
    w.uniform_();
    w.fill_(corner);
    return std::vector<at::Tensor>{w};
  });
  EXPECT_THAT(ops, Contains("aten::uniform_"));
}

TEST(DeadWrites, AWriteThroughAViewOfAnotherDtypeKeepsTheFirstFill) {
  const auto ops = replayed_ops([] {
    torch::NoGradGuard no_grad;
    at::Tensor w = torch::empty({8});
    at::Tensor halves = w.view(torch::kBFloat16);
    w.uniform_();
    halves.zero_();
    return std::vector<at::Tensor>{w};
  });
  EXPECT_THAT(ops, Contains("aten::uniform_"));
}

}  // namespace
}  // namespace torchdefer
