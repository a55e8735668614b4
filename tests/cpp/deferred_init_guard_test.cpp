// DeferredInitGuard: deferred_init for a block of code (Note [A guard is a scope]).
#include <torchdefer/torch_compat.h>
#include <torchdefer/torchdefer.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/cpp/test_util.h"

#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>

namespace torchdefer {
namespace {

namespace nn = torch::nn;

using testing::bitwise_equal;
using testing::error_of;

using ::testing::HasSubstr;

bool recording_on_this_thread() {
  return c10::impl::tls_is_dispatch_key_included(kDeferredInitKey) || FakeMode::is_active();
}

void expect_same_tensors(const nn::Module& eager, const nn::Module& deferred) {
  const auto eager_state = eager.named_parameters(), deferred_state = deferred.named_parameters();
  ASSERT_EQ(eager_state.size(), deferred_state.size());
  for (const auto& item : eager_state) {
    const at::Tensor& mine = deferred_state[item.key()];
    EXPECT_FALSE(is_fake(mine)) << item.key();
    EXPECT_TRUE(bitwise_equal(item.value(), mine)) << item.key();
  }
}

static_assert(!std::is_copy_constructible_v<DeferredInitGuard> &&
                  !std::is_move_constructible_v<DeferredInitGuard>,
              "a guard that could be moved could end outside its block, or on another thread");

TEST(DeferredInitGuard, ModulesBuiltWhileItLivesMaterializeToEagerBitwise) {
  torch::manual_seed(5);
  nn::Sequential eager(nn::Linear(6, 8), nn::LayerNorm(nn::LayerNormOptions({8})));
  nn::Embedding eager_embedding(11, 4);
  const at::Tensor eager_next = torch::rand({4});

  torch::manual_seed(5);
  nn::Sequential deferred(nullptr);
  nn::Embedding deferred_embedding(nullptr);
  {
    DeferredInitGuard guard;
    EXPECT_TRUE(recording_on_this_thread());
    deferred = nn::Sequential(nn::Linear(6, 8), nn::LayerNorm(nn::LayerNormOptions({8})));
    deferred_embedding = nn::Embedding(11, 4);
  }
  EXPECT_FALSE(recording_on_this_thread());
  EXPECT_TRUE(bitwise_equal(torch::rand({4}), eager_next))
      << "the guard left the generator elsewhere than eager construction";
  EXPECT_TRUE(is_deferred(*deferred));
  EXPECT_TRUE(is_deferred(*deferred_embedding));

  materialize_module(*deferred_embedding);
  materialize_module(*deferred);
  expect_same_tensors(*eager, *deferred);
  expect_same_tensors(*eager_embedding, *deferred_embedding);
}

TEST(DeferredInitGuard, WithExactGeneratorLeavesTheGeneratorWhereEagerDoesAtOnce) {
  // trunc_normal_'s draws depend on its values, so without exact_generator the generator is owed
  // until materialization (Note [The generator after deferred_init]); with it, the guard pays.
  const auto build = [] {
    at::Tensor w = torch::empty({64, 32});
    testing::trunc_normal_(w, 0.0, 0.02, -0.04, 0.04);
    return w;
  };
  torch::manual_seed(31);
  const at::Tensor eager = build();
  const at::Tensor eager_next = torch::rand({4});

  torch::manual_seed(31);
  at::Tensor deferred;
  {
    DeferredInitGuard guard("exact", DeferredInitOptions().exact_generator(true));
    deferred = build();
  }
  EXPECT_TRUE(bitwise_equal(torch::rand({4}), eager_next));
  EXPECT_TRUE(is_fake(deferred));
  materialize_tensor(deferred);
  EXPECT_TRUE(bitwise_equal(eager, deferred));
}

TEST(DeferredInitGuard, RecordsWhatDeferredInitRecords) {
  nn::Linear by_call = deferred_init<nn::Linear>(8, 4);
  nn::Linear by_guard(nullptr);
  {
    DeferredInitGuard guard;
    by_guard = nn::Linear(8, 4);
  }
  EXPECT_EQ(explain(by_guard->weight), explain(by_call->weight));
  EXPECT_EQ(explain(by_guard->bias), explain(by_call->bias));
}

TEST(DeferredInitGuard, NestsWithGuardsAndDeferredInitEachRecordingSeparately) {
  torch::manual_seed(2);
  nn::Linear eager_outer(5, 5), eager_inner(5, 3), eager_called(3, 3), eager_after(5, 2);

  torch::manual_seed(2);
  nn::Linear outer(nullptr), inner(nullptr), called(nullptr), after(nullptr);
  {
    DeferredInitGuard outer_guard("outer");
    outer = nn::Linear(5, 5);
    {
      DeferredInitGuard inner_guard("inner");
      inner = nn::Linear(5, 3);
      called = deferred_init<nn::Linear>(3, 3);
    }
    EXPECT_TRUE(is_fake(torch::zeros({1}))) << "the outer guard still records";
    after = nn::Linear(5, 2);
  }
  for (nn::Linear* linear : {&after, &called, &inner, &outer}) {
    materialize_module(**linear);
  }
  expect_same_tensors(*eager_outer, *outer);
  expect_same_tensors(*eager_inner, *inner);
  expect_same_tensors(*eager_called, *called);
  expect_same_tensors(*eager_after, *after);
}

TEST(DeferredInitGuard, AnExceptionUnwindsItAndLeavesNothingRecording) {
  nn::Linear half_built(nullptr);
  EXPECT_THROW(
      {
        DeferredInitGuard guard;
        half_built = nn::Linear(4, 4);
        throw std::runtime_error("construction failed");
      },
      std::runtime_error);
  EXPECT_FALSE(recording_on_this_thread());
  EXPECT_TRUE(is_fake(half_built->weight));
  EXPECT_FALSE(is_fake(torch::zeros({2})));
}

TEST(DeferredInitGuard, LeavesOtherThreadsBuildingRealTensors) {
  bool other_thread_fake = true;
  {
    DeferredInitGuard guard;
    std::thread other([&] { other_thread_fake = is_fake(nn::Linear(2, 2)->weight); });
    other.join();
    EXPECT_TRUE(is_fake(torch::zeros({1})));
  }
  EXPECT_FALSE(other_thread_fake);
}

TEST(DeferredInitGuard, NamesItsContextInErrorsRecordedUnderIt) {
  const std::string error = error_of([] {
    DeferredInitGuard guard("building the encoder");
    nn::Linear(2, 2)->weight.view({3});
  });
  EXPECT_THAT(error, HasSubstr("in deferred_init of building the encoder"));
}

}  // namespace
}  // namespace torchdefer
