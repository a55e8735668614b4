// deferred_init and the op graph: what is recorded, when, and what is left behind.
#include <torchdefer/op_graph.h>
#include <torchdefer/torch_compat.h>
#include <torchdefer/torchdefer.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/cpp/test_util.h"

#include <stdexcept>
#include <string>
#include <thread>

namespace torchdefer {
namespace {

using testing::error_of;

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

bool deferred_init_key_in_tls() {
  return c10::impl::tls_is_dispatch_key_included(kDeferredInitKey);
}

TEST(DeferredInit, BuildsAModuleHolderWithRecordedFakeParameters) {
  auto linear = deferred_init<torch::nn::Linear>(8, 4);
  for (const at::Tensor& p : linear->parameters()) {
    EXPECT_TRUE(is_fake(p));
    EXPECT_NE(recorded(p), nullptr);
    EXPECT_TRUE(p.requires_grad());
  }
  EXPECT_EQ(linear->weight.sizes(), c10::IntArrayRef({4, 8}));
  EXPECT_EQ(explain(linear->weight), "empty([4, 8]) → uniform_(-0.353553, 0.353553)");
  EXPECT_FALSE(deferred_init_key_in_tls());
  EXPECT_FALSE(FakeMode::is_active());
}

TEST(DeferredInit, RunsAnyCallableWithItsArguments) {
  auto model = deferred_init(
      [](int64_t width) {
        return torch::nn::Sequential(torch::nn::Linear(width, 2 * width), torch::nn::ReLU());
      },
      16);
  EXPECT_EQ(model->parameters().size(), 2u);
  EXPECT_TRUE(is_fake(model->parameters()[0]));
  EXPECT_EQ(model->parameters()[0].sizes(), c10::IntArrayRef({32, 16}));
}

TEST(DeferredInit, RecordsWritesThroughViews) {
  at::Tensor w = deferred_init([] {
    at::Tensor t = torch::zeros({4, 6});
    t.narrow(1, 0, 2).normal_(0, 0.02);
    t.t()[5].fill_(3.0);
    return t;
  });
  const std::string history = explain(w);
  EXPECT_THAT(history, StartsWith("zeros([4, 6])"));
  EXPECT_THAT(history, HasSubstr("normal_(0, 0.02)"));
  EXPECT_THAT(history, HasSubstr("fill_(3)"));
  const RecordedFake* rec = recorded(w);
  ASSERT_NE(rec, nullptr);
  const RecordedStorage& storage = rec->graph->storages()[rec->graph->values()[rec->value].storage];
  EXPECT_EQ(storage.writers.size(), 3u);
}

TEST(DeferredInit, RecordsOutParameterWrites) {
  at::Tensor out = deferred_init([] {
    at::Tensor result = torch::empty({3});
    at::add_out(result, torch::ones({3}), torch::ones({3}));
    return result;
  });
  EXPECT_THAT(explain(out), HasSubstr("add("));
}

TEST(DeferredInit, RecordsDependenciesOfAValueInOrder) {
  at::Tensor scaled = deferred_init([] { return torch::randn({2, 2}).mul(2.0); });
  EXPECT_EQ(explain(scaled), "randn([2, 2]) → mul([2, 2], 2)");
}

TEST(DeferredInit, KeepsRecordingOpsOnFakesAfterItReturned) {
  auto linear = deferred_init<torch::nn::Linear>(8, 4);
  linear->to(torch::kBFloat16);
  EXPECT_EQ(linear->weight.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(is_fake(linear->weight));
  EXPECT_THAT(explain(linear->weight), HasSubstr("→ to([4, 8], BFloat16)"));

  std::vector<at::Tensor> halves = linear->weight.chunk(2, 0);
  ASSERT_EQ(halves.size(), 2u);
  EXPECT_NE(recorded(halves[1]), nullptr);
  EXPECT_EQ(recorded(halves[1])->graph, recorded(linear->weight)->graph);
  EXPECT_EQ(explain(halves[1]), explain(linear->weight));
}

TEST(DeferredInit, CapturesRealTensorsByReferenceWithTheirVersion) {
  at::Tensor source = torch::arange(4.0);
  at::Tensor w = deferred_init([&] { return torch::empty({4}).copy_(source); });
  const RecordedFake* rec = recorded(w);
  ASSERT_NE(rec, nullptr);
  const RecordedNode& copy = rec->graph->nodes().back();
  ASSERT_EQ(copy.inputs.size(), 2u);
  EXPECT_EQ(copy.inputs[1].kind, RecordedInput::Kind::kReal);
  EXPECT_TRUE(copy.inputs[1].tensor.is_same(source));
  EXPECT_EQ(copy.inputs[1].version, source._version());
  EXPECT_THAT(explain(w), HasSubstr("copy_(real Float[4] on cpu)"));
}

TEST(DeferredInit, CopiesTensorsOverBorrowedMemoryIntoConstants) {
  std::vector<float> host = {1, 2, 3};
  at::Tensor w =
      deferred_init([&] { return torch::empty({3}).copy_(torch::from_blob(host.data(), {3})); });
  const RecordedNode& copy = recorded(w)->graph->nodes().back();
  ASSERT_EQ(copy.inputs[1].kind, RecordedInput::Kind::kConstant);
  host[0] = 100;
  EXPECT_EQ(copy.inputs[1].tensor[0].item<float>(), 1.0f);
}

TEST(DeferredInit, DoesNotRecordComputationsOnRealTensors) {
  at::Tensor real = torch::ones({3});
  at::Tensor result = deferred_init([&] { return real * 2; });
  EXPECT_FALSE(is_fake(result));
  EXPECT_EQ(result[0].item<float>(), 2.0f);
}

TEST(DeferredInit, RecordsTheCallBeforeCompositeDecomposition) {
  at::Tensor y = deferred_init([] {
    torch::nn::Linear linear(4, 3);
    return at::linear(torch::ones({2, 4}), linear->weight, linear->bias);
  });
  EXPECT_THAT(explain(y), HasSubstr("linear("));
  EXPECT_THAT(explain(y), Not(HasSubstr("addmm")));
}

TEST(DeferredInitErrors, DataDependentOpNamesTheOpAndTheConstruction) {
  struct Bad : torch::nn::Module {
    Bad() {
      at::Tensor w = register_parameter("w", torch::randn({3}));
      if (w.sum().item<float>() > 0) {
        w.data().zero_();
      }
    }
  };
  const std::string message = error_of([] { deferred_init([] { return Bad(); }); });
  EXPECT_THAT(message, HasSubstr("item()"));
  EXPECT_THAT(message, HasSubstr("while recording aten::item in deferred_init of"));
  EXPECT_FALSE(deferred_init_key_in_tls());
  EXPECT_FALSE(FakeMode::is_active());
}

TEST(DeferredInitErrors, AThrowingConstructorLeavesNoKeyAndNoGraphBehind) {
  const int64_t nodes_before = detail::live_recorded_nodes();
  auto build = [] {
    torch::nn::Linear linear(64, 64);
    throw std::runtime_error("constructor failed");
    return linear;
  };
  EXPECT_THROW(deferred_init(build), std::runtime_error);
  EXPECT_FALSE(deferred_init_key_in_tls());
  EXPECT_FALSE(FakeMode::is_active());
  EXPECT_EQ(detail::live_recorded_nodes(), nodes_before);
  EXPECT_FALSE(is_fake(torch::ones({2})));
}

TEST(DeferredInit, FreesItsGraphWithTheLastFakeThatRefersToIt) {
  const int64_t nodes_before = detail::live_recorded_nodes();
  {
    auto model = deferred_init<torch::nn::Linear>(16, 16);
    EXPECT_GT(detail::live_recorded_nodes(), nodes_before);
  }
  EXPECT_EQ(detail::live_recorded_nodes(), nodes_before);
}

TEST(DeferredInit, NestsWithAGraphPerCall) {
  at::Tensor inner;
  at::Tensor outer = deferred_init([&] {
    inner = deferred_init([] { return torch::ones({2}); });
    return torch::zeros({2}) + inner;
  });
  ASSERT_NE(recorded(inner), nullptr);
  ASSERT_NE(recorded(outer), nullptr);
  EXPECT_NE(recorded(inner)->graph, recorded(outer)->graph);
  const RecordedNode& add = recorded(outer)->graph->nodes().back();
  EXPECT_EQ(add.inputs[1].kind, RecordedInput::Kind::kForeignFake);
}

TEST(DeferredInit, IsThreadLocal) {
  bool other_thread_fake = true;
  deferred_init([&] {
    std::thread other([&] { other_thread_fake = is_fake(torch::empty({2})); });
    other.join();
    return 0;
  });
  EXPECT_FALSE(other_thread_fake);
}

TEST(DeferredInit, RecordsBytesPerOpNotPerElement) {
  const int64_t nodes_before = detail::live_recorded_nodes();
  auto big = deferred_init<torch::nn::Linear>(1 << 16, 1 << 16);  // 16 GiB of fp32 weights
  EXPECT_EQ(big->weight.nbytes(), size_t{1} << 34);
  EXPECT_LE(detail::live_recorded_nodes() - nodes_before, 6);
}

}  // namespace
}  // namespace torchdefer
