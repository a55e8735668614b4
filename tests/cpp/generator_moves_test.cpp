// Whoever moves the default generator between two recorded random ops from C++ (drawing from it,
// setting its engine) is noticed, however little of its state changed, and nothing else is taken
// for a move (Note [Noticing a moved generator] in recorder/src/torch_rng.cpp).
#include <torchdefer/op_graph.h>
#include <torchdefer/torchdefer.h>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/cpp/test_util.h"

#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <optional>
#include <tuple>
#include <vector>

namespace torchdefer {
namespace {

using testing::bitwise_equal;

// Runs `f` on the default CPU generator's implementation, holding its mutex.
void with_generator(const std::function<void(at::CPUGeneratorImpl&)>& f) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(generator.mutex());
  f(*at::check_generator<at::CPUGeneratorImpl>(generator));
}

at::mt19937 default_engine() {
  at::mt19937 engine;
  with_generator([&](at::CPUGeneratorImpl& impl) { engine = impl.engine(); });
  return engine;
}

void set_default_engine(const at::mt19937& engine) {
  with_generator([&](at::CPUGeneratorImpl& impl) { impl.set_engine(engine); });
}

// Two random ops with `between` run between them, eagerly and under deferred_init (from the same
// generator state); the deferred ones are materialized.
struct TwoRandomOps {
  at::Tensor eager_first, eager_second, first, second;
  std::shared_ptr<OpGraph> graph;
};

TwoRandomOps two_random_ops(const std::function<void()>& between) {
  auto program = [&] {
    at::Tensor first = torch::rand({8});
    between();
    return std::make_tuple(first, torch::rand({8}));
  };
  TwoRandomOps ops;
  torch::manual_seed(21);
  torch::rand({3});  // the chain starts in the middle of a block of 624 words
  std::tie(ops.eager_first, ops.eager_second) = program();
  torch::manual_seed(21);
  torch::rand({3});
  std::tie(ops.first, ops.second) = deferred_init(program);
  ops.graph = recorded(ops.second)->shared_graph();
  materialize_tensor(ops.first);
  materialize_tensor(ops.second);
  return ops;
}

// Whether both deferred ops materialized to eager's bits.
::testing::AssertionResult gives_eager_bits(const TwoRandomOps& ops) {
  if (!bitwise_equal(ops.first, ops.eager_first)) {
    return ::testing::AssertionFailure() << "the first random op differs from eager's";
  }
  if (!bitwise_equal(ops.second, ops.eager_second)) {
    return ::testing::AssertionFailure() << "the second random op differs from eager's";
  }
  return ::testing::AssertionSuccess();
}

// The anchors the recording's random ops were placed from, in program order.
std::vector<int64_t> anchors_of_random_ops(const OpGraph& graph) {
  std::vector<int64_t> anchors;
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    if (const RecordedDraws* draws = graph.nodes()[i].draws) {
      anchors.push_back(draws->anchor);
    }
  }
  return anchors;
}

// Records two random ops with `draws` direct draws from the default generator between them: the
// second gets an anchor of its own and materializes to what it draws from where those draws left
// the generator. The recorder has not applied the first op's draws when they are made, so they
// start where eager's do not (Note [The owed generator's mark]).
void expect_direct_draws_noticed(int draws) {
  at::Tensor after_draws;
  torch::manual_seed(21);
  torch::rand({3});
  const auto [first, second] = deferred_init([&] {
    at::Tensor first = torch::rand({8});
    with_generator([&](at::CPUGeneratorImpl& impl) {
      for (int i = 0; i < draws; ++i) {
        impl.random();
      }
      after_draws = at::Tensor(impl.get_state());
    });
    return std::make_tuple(first, torch::rand({8}));
  });
  const std::vector<int64_t> anchors = anchors_of_random_ops(*recorded(second)->shared_graph());
  ASSERT_EQ(anchors.size(), 2u);
  EXPECT_NE(anchors[0], anchors[1]);
  materialize_tensor(second);
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  {
    const std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(after_draws);
  }
  EXPECT_TRUE(bitwise_equal(second, torch::rand({8})));
}

TEST(GeneratorMoves, AMultipleOf624DrawsBetweenTwoRandomOpsIsNoticed) {
  // 624 draws leave the engine's position where it was and regenerate every word.
  expect_direct_draws_noticed(624);
}

TEST(GeneratorMoves, AStateSetBetweenTwoRandomOpsIsNoticedWhenOneWordDiffers) {
  // The state the recording starts from, one word in the middle flipped: seed, position and every
  // other word are those the recorder left.
  torch::manual_seed(21);
  torch::rand({3});
  at::mt19937_data_pod flipped = default_engine().data();
  flipped.state_[400] ^= 1u << 7;
  at::mt19937 engine;
  engine.set_data(flipped);
  const TwoRandomOps ops = two_random_ops([&] { set_default_engine(engine); });
  EXPECT_TRUE(gives_eager_bits(ops));
  const std::vector<int64_t> anchors = anchors_of_random_ops(*ops.graph);
  ASSERT_EQ(anchors.size(), 2u);
  EXPECT_NE(anchors[0], anchors[1]);
}

TEST(GeneratorMoves, TheSameStateWrittenAgainWithOtherBytesKeepsTheChain) {
  // An engine equal in every field to the generator's, built field by field in storage filled
  // with another byte, so that its padding differs: the recording continues from its anchor.
  const TwoRandomOps ops = two_random_ops([] {
    const at::mt19937 now = default_engine();
    const at::mt19937_data_pod fields = now.data();
    alignas(at::mt19937_data_pod) unsigned char storage[sizeof(at::mt19937_data_pod)];
    std::memset(storage, 0xab, sizeof(storage));
    auto* rewritten = new (storage) at::mt19937_data_pod;
    rewritten->seed_ = fields.seed_;
    rewritten->left_ = fields.left_;
    rewritten->seeded_ = fields.seeded_;
    rewritten->next_ = fields.next_;
    rewritten->state_ = fields.state_;
    at::mt19937 engine;
    engine.set_data(*rewritten);
    set_default_engine(engine);
    const at::mt19937 after = default_engine();
    ASSERT_NE(std::memcmp(&after, &now, sizeof(at::mt19937)), 0)
        << "the test needs an engine whose bytes differ where its fields do not";
  });
  EXPECT_TRUE(gives_eager_bits(ops));
  const std::vector<int64_t> anchors = anchors_of_random_ops(*ops.graph);
  ASSERT_EQ(anchors.size(), 2u);
  EXPECT_EQ(anchors[0], anchors[1]);
}

TEST(GeneratorMoves, AReseedBetweenTwoRandomOpsIsNoticed) {
  const TwoRandomOps ops = two_random_ops([] { torch::manual_seed(22); });
  EXPECT_TRUE(gives_eager_bits(ops));
}

TEST(GeneratorMoves, ASingleDrawBetweenTwoRandomOpsIsNoticed) {
  // One draw moves the engine's position and changes no word of its state.
  expect_direct_draws_noticed(1);
}

TEST(GeneratorMoves, TwiceAMultipleOf624DrawsBetweenTwoRandomOpsIsNoticed) {
  expect_direct_draws_noticed(2 * 624);
}

TEST(GeneratorMoves, AStateSetThroughSetStateBetweenTwoRandomOpsIsNoticed) {
  torch::manual_seed(22);
  const at::Tensor state = at::detail::getDefaultCPUGenerator().get_state();
  const TwoRandomOps ops = two_random_ops([&] {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    const std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  });
  EXPECT_TRUE(gives_eager_bits(ops));
  const std::vector<int64_t> anchors = anchors_of_random_ops(*ops.graph);
  ASSERT_EQ(anchors.size(), 2u);
  EXPECT_NE(anchors[0], anchors[1]);
}

}  // namespace
}  // namespace torchdefer
