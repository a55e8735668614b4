// Each thread places its random ops on a chain of its own (Note [Reaching the chain] in
// recorder/src/torch_rng.cpp), whatever other threads record meanwhile.
#include <torchdefer/op_graph.h>
#include <torchdefer/torchdefer.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <future>
#include <optional>
#include <thread>
#include <tuple>
#include <vector>

namespace torchdefer {
namespace {

// The draws of `graph`'s random ops, in program order.
std::vector<RecordedDraws> draws_of_random_ops(const OpGraph& graph) {
  std::vector<RecordedDraws> draws;
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    if (const RecordedDraws* node_draws = graph.nodes()[i].draws) {
      draws.push_back(*node_draws);
    }
  }
  return draws;
}

TEST(RngChain, ARecordingOnAnotherThreadLeavesThisThreadsChainInPlace) {
  // The other thread records a random op between this thread's two, and is still recording when
  // the second is placed: the second continues this thread's chain from the first's anchor.
  std::promise<void> other_recorded;
  std::promise<void> second_recorded;
  std::thread other;
  const auto [first, second] = deferred_init([&] {
    at::Tensor first = torch::rand({8});
    other = std::thread([&] {
      deferred_init([&] {
        at::Tensor t = torch::rand({5});
        other_recorded.set_value();
        second_recorded.get_future().wait();
        return t;
      });
    });
    other_recorded.get_future().wait();
    at::Tensor second = torch::rand({8});
    second_recorded.set_value();
    return std::make_tuple(first, second);
  });
  other.join();
  const std::vector<RecordedDraws> draws = draws_of_random_ops(*recorded(second)->shared_graph());
  ASSERT_EQ(draws.size(), 2u);
  EXPECT_EQ(draws[1].anchor, draws[0].anchor);
  EXPECT_EQ(draws[1].offset, draws[0].offset + 8);
}

}  // namespace
}  // namespace torchdefer
