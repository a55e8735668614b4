// deferred_init and the op graph: what is recorded, when, and what is left behind.
#include <torchdefer/extension.h>
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
#include <tuple>

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

// Note [Ambient state is part of the recording]
TEST(DeferredInit, RecordsAndReplaysTheDefaultDtypeEachOpRanUnder) {
  auto build = [] {
    c10::set_default_dtype(caffe2::TypeMeta::Make<double>());
    at::Tensor w = torch::randn({20});
    at::Tensor ratio = torch::arange(5) / 3;  // integer division promotes to the default dtype
    c10::set_default_dtype(caffe2::TypeMeta::Make<float>());
    return std::make_tuple(w, ratio, torch::rand({3}));
  };
  torch::manual_seed(4);
  const auto [eager_w, eager_ratio, eager_after] = build();
  torch::manual_seed(4);
  const auto [w, ratio, after] = deferred_init(build);
  EXPECT_EQ(recorded(w)->graph->nodes().front().ambient.default_dtype, at::kDouble);
  EXPECT_EQ(ratio.scalar_type(), at::kDouble);
  EXPECT_EQ(after.scalar_type(), at::kFloat);
  materialize_tensor(w);
  materialize_tensor(ratio);
  materialize_tensor(after);
  EXPECT_EQ(c10::get_default_dtype(), caffe2::TypeMeta::Make<float>());
  EXPECT_TRUE(testing::bitwise_equal(w, eager_w));
  EXPECT_TRUE(testing::bitwise_equal(ratio, eager_ratio));
  EXPECT_TRUE(testing::bitwise_equal(after, eager_after));
}

// Note [Real tensors written while recording]. (C++ factories under deferred_init return fakes,
// so the real tensors here are made outside it.)
TEST(DeferredInit, WritesRecordedValuesIntoARealTensorAsEagerDoes) {
  auto build = [](at::Tensor real) {
    real.copy_(torch::randn({3}));
    return torch::randn({5});
  };
  at::Tensor eager_real = torch::tensor({1.0f, 2.0f, 3.0f});
  torch::manual_seed(7);
  const at::Tensor eager_after = build(eager_real);
  const at::Tensor eager_next = torch::rand({2});
  at::Tensor real = torch::tensor({1.0f, 2.0f, 3.0f});
  torch::manual_seed(7);
  const at::Tensor after = deferred_init(build, real);
  EXPECT_TRUE(torch::equal(torch::rand({2}), eager_next));
  EXPECT_TRUE(testing::bitwise_equal(real, eager_real));
  materialize_tensor(after);
  EXPECT_TRUE(testing::bitwise_equal(after, eager_after));
}

TEST(DeferredInit, RecordedReadsOfARealTensorKeepWhatTheyReadWhenConstructionRewritesIt) {
  at::Tensor scale = torch::tensor({2.0f, 3.0f});
  at::Tensor w = deferred_init([&] {
    at::Tensor w = torch::ones({2}) * scale;
    scale.mul_(10);
    return w;
  });
  const RecordedNode& mul = recorded(w)->graph->nodes().back();
  EXPECT_EQ(mul.inputs[1].kind, RecordedInput::Kind::kConstant);
  materialize_tensor(w);
  EXPECT_TRUE(torch::equal(w, torch::tensor({2.0f, 3.0f})));
  EXPECT_TRUE(torch::equal(scale, torch::tensor({20.0f, 30.0f})));
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

// Note [Factories of meta templates]
TEST(DeferredInit, RecordsAFactoryOfAMetaTemplateOnARealDeviceAsAFake) {
  at::Tensor made = deferred_init([] {
    const at::Tensor meta = torch::empty({3, 2}, torch::kMeta);
    return torch::ones_like(meta, at::TensorOptions().device(c10::kCPU));
  });
  ASSERT_TRUE(is_fake(made));
  EXPECT_EQ(made.device(), c10::Device(c10::kCPU));
  materialize_tensor(made);
  EXPECT_TRUE(torch::equal(made, torch::ones({3, 2})));
}

TEST(DeferredInit, KeepsAFactoryOfAMetaTemplateWithoutADeviceMeta) {
  at::Tensor made =
      deferred_init([] { return torch::zeros_like(torch::empty({3}, torch::kMeta)); });
  EXPECT_FALSE(is_fake(made));
  EXPECT_TRUE(made.is_meta());
}

// Note [Writes the schema does not show]
TEST(DeferredInit, LeavesAnEvalModeBatchNormOutOfTheRunningStatisticsHistory) {
  torch::nn::BatchNorm1d norm = deferred_init([] {
    torch::nn::BatchNorm1d norm(4);
    norm->eval();
    norm->forward(torch::ones({2, 4}));
    return norm;
  });
  EXPECT_THAT(explain(norm->running_mean), Not(HasSubstr("batch_norm")));
  torch::nn::BatchNorm1d trained = deferred_init([] {
    torch::nn::BatchNorm1d norm(4);
    norm->forward(torch::ones({2, 4}));
    return norm;
  });
  EXPECT_THAT(explain(trained->running_mean), HasSubstr("batch_norm"));
}

// Note [Reading values while recording]
TEST(DeferredInit, DataDependentOpsReadTheValuesEagerComputed) {
  struct Reader : torch::nn::Module {
    Reader() {
      w = register_parameter("w", torch::randn({3}));
      torch::NoGradGuard no_grad;
      if (w.sum().item<float>() > 0) {
        w.zero_();
      }
      sum = w.sum().item<float>();
      signs = (w > 0).nonzero();
      is_positive = static_cast<bool>(w[0].gt(0).is_nonzero());
    }
    at::Tensor w, signs;
    float sum;
    bool is_positive;
  };
  for (uint64_t seed = 0; seed < 6; ++seed) {
    torch::manual_seed(seed);
    Reader eager;
    const at::Tensor eager_next = torch::rand({4});
    torch::manual_seed(seed);
    Reader deferred = deferred_init([] { return Reader(); });
    EXPECT_TRUE(torch::equal(torch::rand({4}), eager_next)) << "seed " << seed;
    EXPECT_TRUE(is_fake(deferred.w));
    EXPECT_FALSE(is_fake(deferred.signs));
    EXPECT_EQ(deferred.sum, eager.sum) << "seed " << seed;
    EXPECT_EQ(deferred.is_positive, eager.is_positive) << "seed " << seed;
    EXPECT_TRUE(torch::equal(deferred.signs, eager.signs)) << "seed " << seed;
    materialize_module(deferred);
    EXPECT_TRUE(torch::equal(deferred.w, eager.w)) << "seed " << seed;
  }
  EXPECT_FALSE(deferred_init_key_in_tls());
}

TEST(DeferredInit, ReadingValuesRecordsNothingAndCommitsNothing) {
  auto [w, before, after] = deferred_init([] {
    at::Tensor w = torch::randn({4});
    const std::string before = explain(w);
    const at::Tensor copy = read_values(w);
    EXPECT_FALSE(is_fake(copy));
    EXPECT_TRUE(is_fake(w));
    w.mul_(w.sum().item<double>());
    return std::make_tuple(w, before, explain(w));
  });
  EXPECT_EQ(before, "randn([4])");
  EXPECT_THAT(after, StartsWith("randn([4]) → mul_("));
  EXPECT_TRUE(is_fake(w));
}

TEST(DeferredInit, ReadValuesAreEagersEvenForCounterModeSoShapesFollowEager) {
  auto build = [] {
    const int64_t extra = torch::rand({1}).item<double>() > 0.5 ? 1 : 0;
    return torch::nn::Linear(4, 4 + extra);
  };
  for (uint64_t seed = 0; seed < 8; ++seed) {
    torch::manual_seed(seed);
    auto eager = build();
    torch::manual_seed(seed);
    auto deferred = deferred_init(build);
    materialize_module(*deferred, MaterializeOptions().rng(RngMode::kCounter));
    EXPECT_EQ(deferred->weight.sizes(), eager->weight.sizes()) << "seed " << seed;
  }
}

TEST(DeferredInitErrors, DataDependentOpsOnFakesOfAFakeModeAreStillRefused) {
  const std::string under_fake_mode = error_of([] {
    FakeMode fake;
    torch::linspace(0, 1, 4)[1].item<double>();
  });
  EXPECT_THAT(under_fake_mode, HasSubstr("Tensor::item()"));
  EXPECT_THAT(under_fake_mode, HasSubstr("needs the values of"));
  at::Tensor foreign;
  {
    FakeMode fake;
    foreign = torch::ones({3});
  }
  const std::string inside_deferred_init =
      error_of([&] { deferred_init([&] { return foreign.nonzero(); }); });
  EXPECT_THAT(inside_deferred_init, HasSubstr("Tensor::nonzero()"));
  EXPECT_THAT(inside_deferred_init, HasSubstr("while recording aten::nonzero in deferred_init of"));
  EXPECT_THAT(error_of([&] { read_values(foreign); }), HasSubstr("made under a FakeMode"));
  EXPECT_FALSE(deferred_init_key_in_tls());
  EXPECT_FALSE(FakeMode::is_active());
}

TEST(DeferredInitErrors, ValuesAreReadAfterTheirRecordingReturnedButNotInsideAnother) {
  torch::manual_seed(3);
  const at::Tensor eager = torch::randn({3});
  torch::manual_seed(3);
  at::Tensor w = deferred_init([] { return torch::randn({3}); });
  EXPECT_EQ(w.sum().item<float>(), eager.sum().item<float>());
  EXPECT_TRUE(testing::bitwise_equal(read_values(w), eager));
  EXPECT_THAT(error_of([&] { deferred_init([&] { return read_values(w); }); }),
              HasSubstr("inside another deferred_init than the one that recorded it"));
  EXPECT_TRUE(is_fake(w));
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

namespace torchdefer {
namespace {

TEST(DeferredInitOptions, AreTakenBeforeTheConstructorArgumentsOrTheCallable) {
  torch::manual_seed(4);
  torch::nn::Linear eager(6, 5);
  const at::Tensor eager_next = torch::rand({3});
  torch::manual_seed(4);
  auto linear = deferred_init<torch::nn::Linear>(DeferredInitOptions().exact_generator(true), 6, 5);
  EXPECT_TRUE(testing::bitwise_equal(torch::rand({3}), eager_next));
  EXPECT_TRUE(is_fake(linear->weight));
  const at::Tensor t = deferred_init(
      DeferredInitOptions(), [](int64_t n) { return torch::rand({n}); }, 7);
  EXPECT_TRUE(is_fake(t));
  EXPECT_EQ(t.numel(), 7);
  materialize_module(*linear);
  EXPECT_TRUE(testing::bitwise_equal(linear->weight, eager->weight));
}

}  // namespace
}  // namespace torchdefer

namespace torchdefer {
namespace {

// Note [Annotations live in the graph]: a fake's annotation points into its graph and shares the
// graph's ownership, so one fake alone keeps the whole recording (more nodes than one chunk of the
// graph's storage) alive and materializable.
TEST(DeferredInit, KeepsTheGraphAliveThroughOneFakeAfterTheModuleIsGone) {
  const int64_t nodes_before = detail::live_recorded_nodes();
  torch::manual_seed(11);
  torch::nn::Sequential eager;
  for (int i = 0; i < 100; ++i) {
    eager->push_back(torch::nn::Linear(4, 4));
  }
  torch::manual_seed(11);
  at::Tensor last_bias;
  {
    auto model = deferred_init([] {
      torch::nn::Sequential layers;
      for (int i = 0; i < 100; ++i) {
        layers->push_back(torch::nn::Linear(4, 4));
      }
      return layers;
    });
    last_bias = model->parameters().back();
  }
  ASSERT_TRUE(is_fake(last_bias));
  EXPECT_GT(detail::live_recorded_nodes() - nodes_before, 256);
  const at::Tensor real = materialize_tensor(last_bias);
  EXPECT_TRUE(testing::bitwise_equal(real, eager->parameters().back()));
  last_bias.reset();
  EXPECT_EQ(detail::live_recorded_nodes(), nodes_before);
}

// Note [Recording an op]: a node keeps a list argument without tensors as it is only when the
// stack alone holds it; a list its caller still holds is copied, so a later change to the
// caller's list does not reach the recording.
TEST(DeferredInit, CopiesAListArgumentTheCallerStillHolds) {
  c10::List<int64_t> sizes({2, 3});
  at::Tensor t = deferred_init([&] {
    const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::ones", "");
    torch::jit::Stack stack{c10::IValue(sizes), c10::IValue(), c10::IValue(), c10::IValue(),
                            c10::IValue()};
    op.callBoxed(&stack);
    return stack[0].toTensor();
  });
  sizes.set(0, 5);
  const RecordedFake* rec = recorded(t);
  ASSERT_NE(rec, nullptr);
  const RecordedNode& node = rec->graph->nodes()[rec->graph->values()[rec->value].node];
  EXPECT_EQ(node.arguments[0].toIntVector(), std::vector<int64_t>({2, 3}));
  EXPECT_EQ(t.sizes(), c10::IntArrayRef({2, 3}));
}

// Note [Inference mode while recording]: eager makes the buffer an inference tensor.
TEST(DeferredInit, MaterializationRefusesABufferMadeInInferenceModeNamingIt) {
  auto linear = deferred_init([] {
    torch::nn::Linear made(4, 4);
    c10::InferenceMode inference;
    made->register_buffer("table", torch::zeros({3}));
    made->weight.mul_(torch::full({4, 4}, 0.5));  // a temporary that only feeds a write
    return made;
  });
  EXPECT_TRUE(made_in_inference_mode(linear->named_buffers()["table"]));
  EXPECT_FALSE(made_in_inference_mode(linear->weight));
  EXPECT_THAT(error_of([&] { materialize_module(*linear); }),
              HasSubstr("cannot materialize table: it was made under torch.inference_mode()"));
}

}  // namespace
}  // namespace torchdefer
