// Materialization in torch RNG mode: bitwise equal to eager construction, for whole modules and
// for any subset in any order; in place; tied and nested; all or nothing on failure.
#include <torchdefer/counter_rng.h>
#include <torchdefer/op_graph.h>
#include <torchdefer/torchdefer.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/cpp/test_util.h"

#include "bench/models/llama.h"

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace torchdefer {
namespace {

using testing::bitwise_equal;
using testing::error_of;

namespace nn = torch::nn;
using ::testing::HasSubstr;

void expect_same_tensors(const nn::Module& eager, const nn::Module& deferred) {
  const auto eager_params = eager.named_parameters();
  const auto deferred_params = deferred.named_parameters();
  ASSERT_EQ(eager_params.keys(), deferred_params.keys());
  for (const auto& item : eager_params) {
    const at::Tensor& d = deferred_params[item.key()];
    EXPECT_FALSE(is_fake(d)) << item.key();
    EXPECT_TRUE(bitwise_equal(item.value(), d)) << item.key();
    EXPECT_EQ(item.value().requires_grad(), d.requires_grad()) << item.key();
  }
  const auto eager_buffers = eager.named_buffers();
  const auto deferred_buffers = deferred.named_buffers();
  ASSERT_EQ(eager_buffers.keys(), deferred_buffers.keys());
  for (const auto& item : eager_buffers) {
    EXPECT_TRUE(bitwise_equal(item.value(), deferred_buffers[item.key()])) << item.key();
  }
}

// A GPT-2 block stack with tied input and output embeddings and a causal-mask buffer, initialized
// the way GPT-2 does (normal(0, 0.02), zero biases, residual projections scaled by depth).
struct Gpt2Impl : nn::Module {
  explicit Gpt2Impl(int64_t vocab = 97, int64_t dim = 32, int64_t layers = 2,
                    int64_t context = 16) {
    wte = register_module("wte", nn::Embedding(vocab, dim));
    wpe = register_module("wpe", nn::Embedding(context, dim));
    blocks = register_module("blocks", nn::ModuleList());
    for (int64_t i = 0; i < layers; ++i) {
      auto block = std::make_shared<nn::Module>();
      block->register_module("ln_1", nn::LayerNorm(nn::LayerNormOptions({dim})));
      block->register_module("c_attn", nn::Linear(dim, 3 * dim));
      block->register_module("c_proj", nn::Linear(dim, dim));
      block->register_module("ln_2", nn::LayerNorm(nn::LayerNormOptions({dim})));
      block->register_module("c_fc", nn::Linear(dim, 4 * dim));
      block->register_module("mlp_proj", nn::Linear(4 * dim, dim));
      block->register_buffer(
          "bias", torch::tril(torch::ones({context, context})).view({1, 1, context, context}));
      blocks->push_back(block);
    }
    ln_f = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({dim})));
    lm_head = register_module("lm_head", nn::Linear(nn::LinearOptions(dim, vocab).bias(false)));
    lm_head->weight = wte->weight;  // tie after construction, as GPT-2 does
    lm_head->named_parameters(false)["weight"].set_data(wte->weight);
    torch::NoGradGuard no_grad;
    for (auto& module : modules(/*include_self=*/false)) {
      if (auto* linear = module->as<nn::Linear>()) {
        linear->weight.normal_(0, 0.02);
        if (linear->bias.defined()) {
          linear->bias.zero_();
        }
      } else if (auto* embedding = module->as<nn::Embedding>()) {
        embedding->weight.normal_(0, 0.02);
      }
    }
    for (const auto& p : named_parameters()) {
      if (p.key().find("proj.weight") != std::string::npos) {
        p.value().normal_(0, 0.02 / std::sqrt(2.0 * layers));
      }
    }
  }
  nn::Embedding wte{nullptr}, wpe{nullptr};
  nn::ModuleList blocks{nullptr};
  nn::LayerNorm ln_f{nullptr};
  nn::Linear lm_head{nullptr};
};
TORCH_MODULE(Gpt2);

// Writes into slices and transposed views of its parameters.
struct SliceWriterImpl : nn::Module {
  SliceWriterImpl() {
    w = register_parameter("w", torch::empty({8, 12}));
    torch::NoGradGuard no_grad;
    w.zero_();
    w.narrow(1, 0, 5).normal_();
    w.t()[3].uniform_(-1, 1);
    w.t().narrow(0, 6, 6).narrow(1, 2, 4).normal_(1, 2);
    w.select(0, 7).fill_(0.5);
    w.index_put_({torch::indexing::Slice(0, 8, 3), 11}, 4.0);
    v = register_buffer("v", w.sum(0) * 3);
  }
  at::Tensor w, v;
};
TORCH_MODULE(SliceWriter);

struct InitFunctionsImpl : nn::Module {
  InitFunctionsImpl() {
    a = register_parameter("a", torch::empty({6, 10}));
    b = register_parameter("b", torch::empty({16, 4, 3, 3}));
    c = register_parameter("c", torch::empty({5, 7}));
    d = register_parameter("d", torch::empty({33}));
    e = register_parameter("e", torch::empty({3, 17}));
    nn::init::orthogonal_(a);
    nn::init::kaiming_normal_(b, 0, torch::kFanOut, torch::kReLU);
    nn::init::xavier_uniform_(c);
    torch::NoGradGuard no_grad;
    d.normal_(0, 0.5);  // 33 elements: the normal_ kernel's tail block
    e.t().normal_();    // non-contiguous: the cached Box-Muller path
    models::trunc_normal_(c, 0.02, -0.04, 0.04);
  }
  at::Tensor a, b, c, d, e;
};
TORCH_MODULE(InitFunctions);

// Reads values while it builds itself (Note [Reading values while recording]): a drop-path
// schedule from linspace(...).item(), a branch on a random draw, a buffer from nonzero(), and
// random draws after each read.
struct ReadsValuesImpl : nn::Module {
  ReadsValuesImpl() {
    const at::Tensor rates = torch::linspace(0, 0.3, 4);
    torch::NoGradGuard no_grad;
    for (int64_t i = 0; i < 4; ++i) {
      const double rate = rates[i].item<double>();
      auto layer = register_module("layer" + std::to_string(i), nn::Linear(8, 8));
      layer->weight.mul_(1 - rate);
    }
    w = register_parameter("w", torch::randn({6, 5}));
    if (torch::rand({1}).item<double>() > 0.5) {
      w.mul_(2);
    } else {
      w.add_(1);
    }
    positive = register_buffer("positive", (w > 0).nonzero());
    b = register_parameter("b", torch::rand({7}) * static_cast<double>(positive.size(0)));
  }
  at::Tensor w, positive, b;
};
TORCH_MODULE(ReadsValues);

struct ModuleFactory {
  std::string name;
  std::function<std::shared_ptr<nn::Module>()> make;
};

void PrintTo(const ModuleFactory& factory, std::ostream* out) { *out << factory.name; }

std::vector<ModuleFactory> module_factories() {
  return {
      {"Linear", [] { return nn::Linear(64, 32).ptr(); }},
      {"Conv2d", [] { return nn::Conv2d(nn::Conv2dOptions(3, 16, 3)).ptr(); }},
      {"Embedding", [] { return nn::Embedding(100, 48).ptr(); }},
      {"LayerNorm", [] { return nn::LayerNorm(nn::LayerNormOptions({48})).ptr(); }},
      {"BatchNorm2d", [] { return nn::BatchNorm2d(16).ptr(); }},
      {"MultiheadAttention", [] { return nn::MultiheadAttention(64, 8).ptr(); }},
      {"TransformerEncoderLayer",
       [] { return nn::TransformerEncoderLayer(nn::TransformerEncoderLayerOptions(64, 4)).ptr(); }},
      {"LSTM", [] { return nn::LSTM(nn::LSTMOptions(32, 64).num_layers(2)).ptr(); }},
      {"Gpt2TiedEmbeddings", [] { return Gpt2().ptr(); }},
      {"LlamaTruncNormalAndRope",
       [] { return models::Llama(models::LlamaConfig::named("tiny")).ptr(); }},
      {"SlicesAndTransposedViews", [] { return SliceWriter().ptr(); }},
      {"OrthogonalKaimingFanOutXavierTruncNormal", [] { return InitFunctions().ptr(); }},
      {"ReadsValuesWhileConstructing", [] { return ReadsValues().ptr(); }},
  };
}

class TorchMode : public ::testing::TestWithParam<ModuleFactory> {};

TEST_P(TorchMode, MaterializingTheWholeModuleEqualsEagerBitwise) {
  torch::manual_seed(1234);
  std::shared_ptr<nn::Module> eager = GetParam().make();
  const at::Tensor eager_next = torch::rand({5});

  torch::manual_seed(1234);
  std::shared_ptr<nn::Module> deferred = deferred_init(GetParam().make);
  const at::Tensor deferred_next = torch::rand({5});
  EXPECT_TRUE(bitwise_equal(eager_next, deferred_next))
      << "recording left the generator elsewhere than eager construction";
  EXPECT_TRUE(is_deferred(*deferred));

  torch::randn({11});  // the generator is used in between: materialization must not care
  const at::Tensor before = torch::rand({3});
  torch::manual_seed(99);
  const at::Tensor expected_after = torch::rand({3});
  torch::manual_seed(99);
  materialize_module(*deferred);
  EXPECT_TRUE(bitwise_equal(torch::rand({3}), expected_after))
      << "materialization changed the caller's generator";
  EXPECT_FALSE(is_deferred(*deferred));
  expect_same_tensors(*eager, *deferred);
}

TEST_P(TorchMode, MaterializingOneTensorAtATimeInReverseOrderEqualsEagerBitwise) {
  torch::manual_seed(7);
  std::shared_ptr<nn::Module> eager = GetParam().make();
  torch::manual_seed(7);
  std::shared_ptr<nn::Module> deferred = deferred_init(GetParam().make);
  std::vector<at::Tensor> tensors = deferred->parameters();
  for (const at::Tensor& b : deferred->buffers()) {
    tensors.push_back(b);
  }
  std::reverse(tensors.begin(), tensors.end());
  for (const at::Tensor& t : tensors) {
    materialize_tensor(t);
  }
  expect_same_tensors(*eager, *deferred);
}

class TorchModeNested : public ::testing::TestWithParam<ModuleFactory> {};

TEST_P(TorchModeNested, MaterializingAChildFirstLeavesItExactlyAsItWas) {
  torch::manual_seed(3);
  std::shared_ptr<nn::Module> eager = GetParam().make();
  torch::manual_seed(3);
  std::shared_ptr<nn::Module> deferred = deferred_init(GetParam().make);
  const auto children = deferred->children();
  ASSERT_FALSE(children.empty());
  materialize_module(*children.back());
  std::vector<at::Tensor> child_tensors;
  std::vector<const void*> child_storages;
  for (const at::Tensor& p : children.back()->parameters()) {
    child_tensors.push_back(p.clone());
    child_storages.push_back(p.data_ptr());
  }
  materialize_module(*deferred);
  const auto after = children.back()->parameters();
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].data_ptr(), child_storages[i]);
    EXPECT_TRUE(bitwise_equal(after[i], child_tensors[i]));
  }
  expect_same_tensors(*eager, *deferred);
}

std::vector<ModuleFactory> factories_with_children() {
  std::vector<ModuleFactory> nested;
  for (const ModuleFactory& factory : module_factories()) {
    if (!factory.make()->children().empty()) {
      nested.push_back(factory);
    }
  }
  return nested;
}

INSTANTIATE_TEST_SUITE_P(Models, TorchMode, ::testing::ValuesIn(module_factories()),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Models, TorchModeNested, ::testing::ValuesIn(factories_with_children()),
                         [](const auto& info) { return info.param.name; });

TEST(Materialize, KeepsTheSameTensorImplAndParameterFlags) {
  auto linear = deferred_init<nn::Linear>(4, 3);
  const c10::TensorImpl* impl = linear->weight.unsafeGetTensorImpl();
  at::Tensor alias = linear->named_parameters()["weight"];
  materialize_module(*linear);
  EXPECT_EQ(linear->weight.unsafeGetTensorImpl(), impl);
  EXPECT_FALSE(is_fake(alias));
  EXPECT_TRUE(alias.requires_grad());
  EXPECT_TRUE(alias.is_leaf());
  EXPECT_EQ(alias.device(), c10::Device(c10::kCPU));
}

TEST(Materialize, KeepsTiedWeightsTiedInOneStorage) {
  Gpt2 model = deferred_init([] { return Gpt2(); });
  ASSERT_TRUE(model->lm_head->weight.is_same(model->wte->weight));
  materialize_module(*model->lm_head);
  materialize_module(*model);
  EXPECT_EQ(model->lm_head->weight.data_ptr(), model->wte->weight.data_ptr());
  const auto params = model->named_parameters();
  EXPECT_EQ(params["lm_head.weight"].data_ptr(), params["wte.weight"].data_ptr());
}

TEST(Materialize, SharesStorageBetweenAFakeAndItsViewsMaterializedLater) {
  at::Tensor base = deferred_init([] { return torch::randn({4, 4}); });
  at::Tensor view = base.t();
  materialize_tensor(base);
  materialize_tensor(view);
  EXPECT_EQ(view.data_ptr(), base.data_ptr());
  EXPECT_TRUE(bitwise_equal(view, base.t()));
}

// #11 class 8: the child's weight is real when the parent is materialized, and the parent's
// replay recomputes it only to read it as it was before normal_().
struct ChildFirstAliasImpl : nn::Module {
  ChildFirstAliasImpl() {
    c0 = register_module("c0", nn::Linear(3, 3));
    const at::Tensor t0 = c0->weight.detach() * 2;
    c0->weight.data().normal_();
    b0 = register_buffer("b0", c0->weight.detach());
    p0 = register_parameter("p0", t0.clone());
  }
  nn::Linear c0{nullptr};
  at::Tensor b0;
  at::Tensor p0;
};
TORCH_MODULE(ChildFirstAlias);

TEST(Materialize, KeepsABufferAliasingAChildsWeightWhenTheChildIsMaterializedFirst) {
  torch::manual_seed(3);
  ChildFirstAlias eager;
  torch::manual_seed(3);
  auto model = deferred_init([] { return ChildFirstAlias(); });
  materialize_module(*model->c0);
  materialize_module(*model);
  EXPECT_EQ(model->b0.data_ptr(), model->c0->weight.data_ptr());
  expect_same_tensors(*eager, *model);
}

TEST(Materialize, WhereWithAScalarOnRealTensorsIsRealAndAnInPlaceOpOnItRunsEagerly) {
  // torch.where(cond, t, 1.5) wraps 1.5 into a tensor inside its composite kernel; with only real
  // inputs the whole op is real (Note [Ops on real tensors run for real]).
  const at::Tensor t = torch::tensor({1.0f, -1.0f, 2.0f});
  const auto program = [&] {
    at::Tensor t1 = torch::where(t > 0, t, 1.5);
    t1.pow_(2);
    return t1;
  };
  const at::Tensor eager = program();
  const at::Tensor deferred = deferred_init(program);
  EXPECT_FALSE(is_fake(deferred));
  EXPECT_TRUE(bitwise_equal(deferred, eager));
}

TEST(Materialize, WhereWithAScalarAndAnInPlaceOpOnARecordedConstantMaterializesToEager) {
  // The program of #10 that recursed until the stack overflowed.
  const auto program = [] {
    const at::Tensor t = torch::tensor({1.0f, -1.0f, 2.0f});
    at::Tensor t1 = torch::where(t > 0, t, 1.5);
    t1.pow_(2);
    return t1;
  };
  const at::Tensor eager = program();
  const at::Tensor deferred = deferred_init(program);
  materialize_tensor(deferred);
  EXPECT_TRUE(bitwise_equal(deferred, eager));
}

TEST(Materialize, ReadsAFakeOfAnotherRecordingAndCommitsBothTogether) {
  torch::manual_seed(5);
  const at::Tensor eager_a = torch::randn({4});
  const at::Tensor eager_b = eager_a * 2 + 1;
  torch::manual_seed(5);
  at::Tensor a = deferred_init([] { return torch::randn({4}); });
  at::Tensor b = deferred_init([&] { return a * 2 + 1; });
  MaterializeOptions throwing;
  throwing.progress([](const MaterializeProgress& p) {
    if (p.done == p.total) {
      throw std::runtime_error("stop at the last op");
    }
  });
  EXPECT_THROW(materialize_tensor(b, throwing), std::runtime_error);
  EXPECT_TRUE(is_fake(a));
  EXPECT_TRUE(is_fake(b));
  materialize_tensor(b);
  EXPECT_FALSE(is_fake(a));
  EXPECT_FALSE(is_fake(b));
  EXPECT_TRUE(bitwise_equal(a, eager_a));
  EXPECT_TRUE(bitwise_equal(b, eager_b));
}

TEST(MaterializeErrors, RecordingsThatReadEachOthersFakesAreRefusedAndLoseNothing) {
  at::Tensor a = deferred_init([] { return torch::ones({3}); });
  at::Tensor b = deferred_init([&] { return a * 2; });
  a.add_(b);  // recorded into a's recording, reading b
  const std::string message = error_of([&] { materialize_tensor(a); });
  EXPECT_THAT(message, HasSubstr("none of them can be replayed first"));
  EXPECT_TRUE(is_fake(a));
  EXPECT_TRUE(is_fake(b));
}

TEST(MaterializeErrors, AWriteIntoAFakeModeFakeDuringRecordingIsRefusedAtMaterialization) {
  at::Tensor plain;
  {
    FakeMode fake;
    plain = torch::ones({3});
  }
  at::Tensor written = deferred_init([&] { return plain.pow_(2); });
  EXPECT_THAT(error_of([&] { materialize_tensor(written); }),
              HasSubstr("wrote into a fake that deferred_init did not create"));
  EXPECT_TRUE(is_fake(written));
}

TEST(Materialize, CheckFnSkipsSubtrees) {
  auto model = deferred_init([] {
    return nn::ModuleList(nn::Linear(4, 4), nn::ModuleList(nn::Linear(4, 4), nn::Linear(4, 2)));
  });
  MaterializeOptions options;
  options.check_fn([](const nn::Module& m) { return m.as<nn::ModuleListImpl>() == nullptr; });
  materialize_module(*model, options);
  EXPECT_FALSE(is_fake(model[0]->as<nn::Linear>()->weight));
  EXPECT_TRUE(is_deferred(*model[1]));
  materialize_module(*model);
  EXPECT_FALSE(is_deferred(*model));
}

TEST(Materialize, BuffersOnlyLeavesParametersFake) {
  auto norm = deferred_init<nn::BatchNorm1d>(8);
  materialize_module(*norm, MaterializeOptions().buffers_only());
  EXPECT_FALSE(is_fake(norm->running_mean));
  EXPECT_TRUE(is_fake(norm->weight));
}

TEST(Materialize, RecordedOnFakeCudaFromTheCpuGeneratorMaterializesOnTheCpu) {
  torch::manual_seed(5);
  nn::Linear eager(6, 5);
  torch::manual_seed(5);
  auto deferred = deferred_init(DeferredInitOptions().cuda_draws(CudaDraws::kCpuGenerator), [] {
    FakeMode on_cuda(at::kCUDA);
    return nn::Linear(6, 5);
  });
  EXPECT_TRUE(deferred->weight.is_cuda());
  materialize_module(*deferred, MaterializeOptions().device(at::kCPU));
  EXPECT_EQ(deferred->weight.device(), c10::Device(c10::kCPU));
  EXPECT_TRUE(bitwise_equal(deferred->weight, eager->weight));
}

TEST(Materialize, RecordsAndReplaysOpsAfterDeferredInitReturned) {
  torch::manual_seed(11);
  nn::Linear eager(8, 4);
  eager->to(torch::kBFloat16);
  std::vector<at::Tensor> eager_halves = eager->weight.chunk(2);
  torch::manual_seed(11);
  auto deferred = deferred_init<nn::Linear>(8, 4);
  deferred->to(torch::kBFloat16);
  std::vector<at::Tensor> halves = deferred->weight.chunk(2);
  materialize_tensor(halves[1]);
  materialize_module(*deferred);
  EXPECT_TRUE(bitwise_equal(deferred->weight, eager->weight));
  EXPECT_TRUE(bitwise_equal(halves[1], eager_halves[1]));
}

TEST(Materialize, ReplaysWrappedNumbersWithTheirPromotion) {
  at::Tensor wrapped = at::scalar_tensor(-0.25, at::kDouble);
  wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
  auto program = [&] { return torch::exp(torch::arange(6) * wrapped); };
  const at::Tensor eager = program();
  const at::Tensor deferred = deferred_init(program);
  EXPECT_EQ(deferred.scalar_type(), at::kFloat);
  materialize_tensor(deferred);
  EXPECT_TRUE(bitwise_equal(deferred, eager));
}

// Every step of one call, in order, as (done, total, op).
std::vector<MaterializeProgress> steps_of(
    const std::function<void(const MaterializeOptions&)>& call, MaterializeOptions options = {}) {
  std::vector<MaterializeProgress> steps;
  call(options.progress([&](const MaterializeProgress& p) { steps.push_back(p); }));
  return steps;
}

void expect_counts_one_to_total(const std::vector<MaterializeProgress>& steps) {
  ASSERT_FALSE(steps.empty());
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].done, static_cast<int64_t>(i) + 1);
    EXPECT_EQ(steps[i].total, static_cast<int64_t>(steps.size()));
  }
}

TEST(Materialize, ReportsProgressPerOpAcrossEveryRecordingOfTheCall) {
  auto first = deferred_init<nn::Linear>(8, 8);
  auto second = deferred_init<nn::Linear>(4, 4);
  const auto steps = steps_of([&](const MaterializeOptions& options) {
    materialize_tensors({first->weight, first->bias, second->weight}, options);
  });
  expect_counts_one_to_total(steps);
  EXPECT_THAT(steps.front().op, HasSubstr("aten::"));
}

TEST(Materialize, ReportsProgressPerTensorWhenSharding) {
  auto model = deferred_init<nn::BatchNorm1d>(6);
  const auto steps =
      steps_of([&](const MaterializeOptions& options) { materialize_module(*model, options); },
               MaterializeOptions().shard(Shard{1, 2}));
  expect_counts_one_to_total(steps);
  std::vector<std::string> names;
  for (const MaterializeProgress& p : steps) {
    names.push_back(p.op);
  }
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("weight", "bias", "running_mean",
                                                     "running_var", "num_batches_tracked"));
}

TEST(Materialize, AProgressCallbackThatThrowsLeavesEverythingFake) {
  auto model = deferred_init<nn::Linear>(8, 8);
  for (const MaterializeOptions& options :
       {MaterializeOptions(), MaterializeOptions().shard(Shard{0, 2})}) {
    MaterializeOptions throwing = options;
    throwing.progress([](const MaterializeProgress&) { throw std::runtime_error("stop"); });
    EXPECT_THROW(materialize_module(*model, throwing), std::runtime_error);
    EXPECT_TRUE(is_fake(model->weight));
    EXPECT_TRUE(is_fake(model->bias));
  }
  materialize_module(*model);
  EXPECT_FALSE(is_deferred(*model));
}

TEST(Materialize, FreesTheGraphOnceEverythingIsReal) {
  const int64_t before = detail::live_recorded_nodes();
  auto model = deferred_init([] { return models::Llama(models::LlamaConfig::named("tiny")); });
  EXPECT_GT(detail::live_recorded_nodes(), before);
  materialize_module(*model);
  EXPECT_EQ(detail::live_recorded_nodes(), before);
}

TEST(MaterializeErrors, AnUnusableDeviceNamesItAndLosesNothing) {
  // No machine has a 100th GPU, and a CPU-only LibTorch has no first one.
  auto model = deferred_init<nn::Linear>(4, 4);
  const c10::Device missing(c10::kCUDA, 99);
  const std::string message =
      error_of([&] { materialize_module(*model, MaterializeOptions().device(missing)); });
  EXPECT_THAT(message, HasSubstr("cannot materialize"));
  EXPECT_THAT(message, HasSubstr("cuda:99"));
  EXPECT_THAT(message, HasSubstr("MaterializeOptions().device"));
  EXPECT_TRUE(is_fake(model->weight));
  EXPECT_TRUE(is_fake(model->bias));
  materialize_module(*model);
  EXPECT_FALSE(is_deferred(*model));
}

TEST(MaterializeErrors, ARealInputMutatedAfterRecordingNamesTheOpAndLosesNothing) {
  at::Tensor source = torch::ones({3});
  at::Tensor w = deferred_init([&] { return torch::empty({3}).copy_(source).mul_(2); });
  source.add_(1);
  const std::string message = error_of([&] { materialize_tensor(w); });
  EXPECT_THAT(message, HasSubstr("aten::copy_"));
  EXPECT_THAT(message, HasSubstr("modified in place after recording"));
  EXPECT_TRUE(is_fake(w));
  EXPECT_EQ(source[0].item<float>(), 2.0f);
}

TEST(Materialize, CanMaterializeOnlyARecordedFakeThatIsStillFake) {
  at::Tensor unrecorded;
  {
    FakeMode fake;
    unrecorded = torch::ones({2});
  }
  at::Tensor recorded = deferred_init([] { return torch::rand({3}); });
  EXPECT_FALSE(can_materialize(torch::ones({2})));
  EXPECT_FALSE(can_materialize(unrecorded));
  EXPECT_TRUE(can_materialize(recorded));
  materialize_tensor(recorded);
  EXPECT_FALSE(can_materialize(recorded));
}

TEST(MaterializeErrors, AFakeMadeUnderFakeModeCannotBeMaterialized) {
  at::Tensor t;
  {
    FakeMode fake;
    t = torch::ones({2});
  }
  EXPECT_THAT(error_of([&] { materialize_tensor(t); }), HasSubstr("made under a FakeMode"));
  EXPECT_TRUE(is_fake(t));
}

// Note [Explicit generators]: counted draws (normal_ of 20, uniform_, randn), draws only a run
// can count (normal_ of 5, scalar-p bernoulli_, randperm), eager's bits and eager's generator.
TEST(ExplicitGenerators, GiveEagerBitsAndLeaveTheGeneratorWhereEagerDoes) {
  auto program = [](at::Generator& g) {
    std::vector<at::Tensor> out = {
        torch::empty({20}).normal_(0, 1, g),  torch::empty({4, 3}).uniform_(-1, 1, g),
        torch::empty({5}).normal_(2, 3, g),   at::randn({7}, g, torch::kDouble),
        torch::empty({9}).bernoulli_(0.3, g), at::randperm(6, g, torch::kLong)};
    out.push_back(out[0] * 2);
    return out;
  };
  at::Generator eager_generator = at::detail::createCPUGenerator(3);
  torch::manual_seed(1);
  const std::vector<at::Tensor> eager = program(eager_generator);
  const at::Tensor default_after_eager = at::detail::getDefaultCPUGenerator().get_state();

  at::Generator generator = at::detail::createCPUGenerator(3);
  torch::manual_seed(1);
  std::vector<at::Tensor> deferred = deferred_init([&] { return program(generator); });
  EXPECT_TRUE(torch::equal(generator.get_state(), eager_generator.get_state()));
  EXPECT_TRUE(torch::equal(at::detail::getDefaultCPUGenerator().get_state(), default_after_eager));
  const at::Tensor generator_before = generator.get_state();
  std::reverse(deferred.begin(), deferred.end());  // any order
  for (const at::Tensor& t : deferred) {
    materialize_tensor(t);
  }
  std::reverse(deferred.begin(), deferred.end());
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_TRUE(torch::equal(deferred[i], eager[i])) << i;
  }
  EXPECT_TRUE(torch::equal(generator.get_state(), generator_before)) << "materializing drew";
  EXPECT_TRUE(torch::equal(at::detail::getDefaultCPUGenerator().get_state(), default_after_eager));
}

TEST(ExplicitGenerators, CounterModeDrawsFromNoUserGenerator) {
  at::Generator generator = at::detail::createCPUGenerator(3);
  std::vector<at::Tensor> fakes = deferred_init([&] {
    return std::vector<at::Tensor>{torch::empty({20}).normal_(0, 1, generator),
                                   at::randperm(6, generator, torch::kLong)};
  });
  const at::Tensor before = generator.get_state();
  materialize_tensors(fakes, MaterializeOptions().rng(RngMode::kCounter));
  EXPECT_TRUE(torch::equal(generator.get_state(), before));
  EXPECT_FALSE(is_fake(fakes[0]) || is_fake(fakes[1]));
}

// Random init programs: factories, views, in-place writes through views, random ops and casts,
// built from a seed; run eagerly and under deferred_init, then materialized one output at a time
// in a shuffled order, they must agree bit for bit.
class RandomProgram {
 public:
  explicit RandomProgram(uint32_t seed) : seed_(seed) {}

  std::vector<at::Tensor> run() const {
    std::mt19937 structure(seed_);
    auto pick = [&](int n) { return static_cast<int>(structure() % n); };
    std::vector<at::Tensor> tensors;
    const int steps = 4 + pick(10);
    for (int step = 0; step < steps; ++step) {
      const int64_t rows = 1 + pick(20);
      const int64_t cols = 1 + pick(40);
      if (tensors.empty() || pick(4) == 0) {
        tensors.push_back(make_factory(pick(7), rows, cols));
        continue;
      }
      at::Tensor& t = tensors[pick(static_cast<int>(tensors.size()))];
      at::Tensor target = view_of(t, pick(5), pick);
      torch::NoGradGuard no_grad;
      switch (pick(8)) {
        case 0:
          target.normal_(0.5, 2.0);
          break;
        case 1:
          target.uniform_(-3, 3);
          break;
        case 2:
          target.fill_(1.25);
          break;
        case 3:
          target.mul_(0.5).add_(1);
          break;
        case 4:
          target.clamp_(-0.5, 0.5);
          break;
        case 5:
          target.random_(0, 9);
          break;
        case 6:
          tensors.push_back(t.to(pick(2) ? at::kDouble : at::kBFloat16));
          break;
        default:
          tensors.push_back(t * 2 + torch::rand_like(t));
          break;
      }
    }
    return tensors;
  }

 private:
  static at::Tensor make_factory(int kind, int64_t rows, int64_t cols) {
    switch (kind) {
      case 0:
        return torch::zeros({rows, cols});
      case 1:
        return torch::ones({rows, cols}, torch::kDouble);
      case 2:
        return torch::rand({rows, cols});
      case 3:
        return torch::randn({rows, cols}, torch::kHalf).to(torch::kFloat);
      case 4:
        return torch::randn({rows, cols});
      case 5:
        return torch::arange(rows * cols, torch::kFloat).view({rows, cols});
      default:
        return torch::full({rows, cols}, 2.5);
    }
  }

  template <typename Pick>
  static at::Tensor view_of(const at::Tensor& t, int kind, Pick& pick) {
    if (t.dim() != 2) {
      return t;
    }
    switch (kind) {
      case 0:
        return t.t();
      case 1:
        return t.narrow(1, pick(static_cast<int>(t.size(1))), 1);
      case 2:
        return t.select(0, pick(static_cast<int>(t.size(0))));
      case 3:
        return t.narrow(0, 0, 1 + pick(static_cast<int>(t.size(0))));
      default:
        return t;
    }
  }

  uint32_t seed_;
};

TEST(RandomPrograms, MaterializeInAnyOrderToTheEagerBits) {
  constexpr uint32_t kPrograms = 300;
  for (uint32_t seed = 0; seed < kPrograms; ++seed) {
    const RandomProgram program(seed);
    torch::manual_seed(seed);
    const std::vector<at::Tensor> eager = program.run();
    const at::Tensor eager_next = torch::rand({2});
    torch::manual_seed(seed);
    const std::vector<at::Tensor> deferred = deferred_init([&] { return program.run(); });
    ASSERT_TRUE(bitwise_equal(torch::rand({2}), eager_next)) << "program " << seed;
    std::vector<size_t> order(deferred.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(seed));
    for (size_t i : order) {
      materialize_tensor(deferred[i]);
    }
    for (size_t i = 0; i < eager.size(); ++i) {
      ASSERT_TRUE(bitwise_equal(eager[i], deferred[i]))
          << "program " << seed << ", output " << i << ": " << explain(eager[i]);
    }
  }
}

}  // namespace
}  // namespace torchdefer

namespace torchdefer {
namespace {

// The draw table of Note [Torch-mode draw offsets], checked against eager construction for every
// random op, floating dtype, size around the normal_ kernel's 16-element blocks, and layout.
struct RandomOp {
  std::string name;
  std::function<void(at::Tensor&)> apply;
  std::vector<c10::ScalarType> dtypes;
};

TEST(TorchModeDraws, EveryRandomOpDtypeSizeAndLayoutMatchesEager) {
  const std::vector<c10::ScalarType> floating = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};
  // A range wider than 2^32 takes 64-bit draws; only float64 represents it without a warning.
  const std::vector<RandomOp> ops = {
      {"uniform_", [](at::Tensor& t) { t.uniform_(-2, 3); }, floating},
      {"normal_", [](at::Tensor& t) { t.normal_(1, 2); }, floating},
      {"random_(0, 9)", [](at::Tensor& t) { t.random_(0, 9); }, floating},
      {"random_(0, 2^40)", [](at::Tensor& t) { t.random_(0, int64_t{1} << 40); }, {at::kDouble}},
      {"random_()", [](at::Tensor& t) { t.random_(); }, {at::kFloat, at::kDouble}},
      {"bernoulli_(0.3)", [](at::Tensor& t) { t.bernoulli_(0.3); }, floating},
      {"cauchy_", [](at::Tensor& t) { t.cauchy_(); }, floating},
      {"geometric_", [](at::Tensor& t) { t.geometric_(0.4); }, floating},
      {"exponential_", [](at::Tensor& t) { t.exponential_(); }, floating},
      {"log_normal_", [](at::Tensor& t) { t.log_normal_(); }, floating},
  };
  for (const RandomOp& op : ops) {
    for (const c10::ScalarType dtype : op.dtypes) {
      for (const int64_t n : {1, 2, 15, 16, 17, 33, 100}) {
        for (const bool transposed : {false, true}) {
          // Two ops in a row, so that the second starts where the first left the generator.
          auto build = [&] {
            std::vector<at::Tensor> out;
            for (int i = 0; i < 2; ++i) {
              at::Tensor base = torch::zeros({transposed ? 3 : 1, n}, dtype);
              at::Tensor target = transposed ? base.t() : base;
              torch::NoGradGuard no_grad;
              op.apply(target);
              out.push_back(base);
            }
            return out;
          };
          torch::manual_seed(17);
          const std::vector<at::Tensor> eager = build();
          const at::Tensor eager_next = torch::rand({3});
          torch::manual_seed(17);
          const std::vector<at::Tensor> deferred = deferred_init(build);
          const std::string where = op.name + " " + c10::toString(dtype) +
                                    " n=" + std::to_string(n) + (transposed ? " transposed" : "");
          ASSERT_TRUE(bitwise_equal(torch::rand({3}), eager_next)) << where << ": generator";
          materialize_tensor(deferred[1]);
          materialize_tensor(deferred[0]);
          EXPECT_TRUE(bitwise_equal(eager[0], deferred[0])) << where << ": first op";
          EXPECT_TRUE(bitwise_equal(eager[1], deferred[1])) << where << ": second op";
        }
      }
    }
  }
}

// Every op the recorder issue lists, in one constructor.
struct EveryListedOpImpl : nn::Module {
  EveryListedOpImpl() {
    torch::NoGradGuard no_grad;
    a = register_buffer("a", torch::empty({6, 8}).uniform_());
    b = register_buffer("b", torch::zeros({6, 8}).normal_(0, 3));
    c = register_buffer("c", torch::ones({8}).mul_(3).add_(torch::linspace(0, 1, 8)));
    d = register_buffer("d", torch::full({4, 4}, 2.0).fill_diagonal_(-1.0));
    e = register_buffer("e", torch::eye(5, 7) + torch::arange(35, torch::kFloat).view({5, 7}));
    f = register_buffer("f", torch::rand({3, 4}) + torch::randn({3, 4}));
    g = register_buffer("g", torch::randint(0, 100, {10}));
    h = register_buffer("h", torch::empty({4, 6}).zero_());
    h.copy_(torch::randn({6, 4}).t());
    h.narrow(1, 1, 2).clamp_(-0.1, 0.1);
    h.t()[2].erfinv_();
    i = register_buffer("i", torch::empty({30}).bernoulli_(0.25));
    j = register_buffer("j", torch::empty({5, 3}, torch::kLong).random_(-4, 4));
    at::Tensor k = torch::zeros({12, 6});
    k.flatten().narrow(0, 0, 36).normal_();
    k.reshape({6, 12}).select(1, 3).fill_(7);
    k.view({3, 4, 6}).unsqueeze(0)[0][1].uniform_(5, 6);
    k.chunk(3, 0)[2].mul_(-1);
    k.split(4, 1)[1].detach().add_(10);
    k.transpose(0, 1)[0].expand({12}).sum();
    k.slice(0, 1, 12, 3).zero_();
    register_buffer("k", k);
    register_buffer("l", torch::matmul(a.t(), b).to(torch::kDouble));
    register_buffer("m", torch::tensor({1.5, -2.5, 4.0}) * torch::ones({3}));
  }
  at::Tensor a, b, c, d, e, f, g, h, i, j;
};
TORCH_MODULE(EveryListedOp);

TEST(Materialize, ReplaysEveryListedOpBitwise) {
  torch::manual_seed(123);
  EveryListedOp eager;
  torch::manual_seed(123);
  auto deferred = deferred_init([] { return EveryListedOp(); });
  std::vector<at::Tensor> buffers = deferred->buffers();
  std::reverse(buffers.begin(), buffers.end());
  for (const at::Tensor& b : buffers) {
    materialize_tensor(b);
  }
  expect_same_tensors(*eager, *deferred);
}

}  // namespace
}  // namespace torchdefer

namespace torchdefer {
namespace {

MaterializeOptions counter_mode() { return MaterializeOptions().rng(RngMode::kCounter); }

TEST(CounterMode, FillsEachRandomOpWithItsStreamsCounterValues) {
  auto program = [] {
    at::Tensor a = torch::empty({5, 7}).uniform_(-0.5, 0.5);  // random op 0
    at::Tensor b = torch::randn({3, 4}, torch::kDouble);      // random op 1
    at::Tensor c = torch::zeros({6});
    c.narrow(0, 2, 3).normal_(1, 2);  // random op 2, on a view
    return std::vector<at::Tensor>{a, b, c};
  };
  const std::vector<at::Tensor> deferred = deferred_init(program);
  materialize_tensors(deferred, counter_mode().counter_seed(42));

  at::Tensor a = torch::empty({5, 7});
  counter_fill(a, {CounterDistribution::kUniform, -0.5, 0.5}, 42, 0);
  at::Tensor b = torch::empty({3, 4}, torch::kDouble);
  counter_fill(b, {CounterDistribution::kNormal, 0, 1}, 42, 1);
  at::Tensor c = torch::zeros({6});
  counter_fill(c.narrow(0, 2, 3), {CounterDistribution::kNormal, 1, 2}, 42, 2);
  EXPECT_TRUE(bitwise_equal(deferred[0], a));
  EXPECT_TRUE(bitwise_equal(deferred[1], b));
  EXPECT_TRUE(bitwise_equal(deferred[2], c));
}

TEST(CounterMode, TakesItsDefaultSeedFromTheGeneratorWhenRecordingBegan) {
  auto record = [](uint64_t seed) {
    torch::manual_seed(seed);
    return deferred_init([] { return models::Llama(models::LlamaConfig::named("tiny")); });
  };
  models::Llama first = record(1);
  models::Llama again = record(1);
  models::Llama other = record(2);
  materialize_module(*first, counter_mode());
  materialize_module(*other, counter_mode());
  materialize_module(*again->layers[1], counter_mode());
  materialize_module(*again, counter_mode());
  expect_same_tensors(*first, *again);
  EXPECT_FALSE(torch::equal(first->output->weight, other->output->weight));
  const double bound = 3.0 / std::sqrt(64.0);
  EXPECT_LE(first->output->weight.abs().max().item<double>(), bound);
}

TEST(CounterMode, ReplaysOpsWithoutACounterDistributionDeterministically) {
  auto program = [] { return torch::randperm(50).to(torch::kFloat) * torch::rand({50}); };
  const at::Tensor first = deferred_init(program);
  const at::Tensor second = deferred_init(program);
  materialize_tensor(first, counter_mode().counter_seed(9));
  torch::rand({100});
  materialize_tensor(second, counter_mode().counter_seed(9));
  EXPECT_TRUE(bitwise_equal(first, second));
}

}  // namespace
}  // namespace torchdefer
