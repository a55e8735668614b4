// Random ops whose draws depend on their values (rejection samplers) are recorded, never run,
// and resolved when first needed; the default generator after deferred_init is exact or owed
// (Note [Lazy RNG anchors], Note [The generator after deferred_init]).
#include <torchdefer/extension.h>
#include <torchdefer/rng_anchors.h>
#include <torchdefer/torchdefer.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/cpp/test_util.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace torchdefer {
namespace {

using detail::same_engine;
using testing::bitwise_equal;
using ::testing::HasSubstr;
using testing::trunc_normal_;

// Collects the warnings raised while it lives.
class CapturedWarnings : public c10::WarningHandler {
 public:
  CapturedWarnings() : previous_(c10::WarningUtils::get_warning_handler()) {
    c10::WarningUtils::set_warning_handler(this);
  }
  ~CapturedWarnings() override { c10::WarningUtils::set_warning_handler(previous_); }
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  std::vector<std::string> messages;

 private:
  c10::WarningHandler* previous_;
};

at::Tensor current_state() { return at::detail::getDefaultCPUGenerator().get_state(); }

// What a generator in `state` draws next (from a copy, so the default generator is untouched). An
// owed generator is marked (Note [The owed generator's mark]) and draws what it drew before when
// recording started right after a seed.
at::Tensor draws_from(const at::Tensor& state) {
  at::Generator copy = at::detail::createCPUGenerator();
  copy.set_state(state);
  return at::rand({1000}, copy);
}

// Counted ops around two truncated normals and a scratch kernel that follows one, as a
// ViT-style initialization does.
std::vector<at::Tensor> program() {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> out;
  out.push_back(torch::randn({64}));
  at::Tensor weight = torch::empty({30, 10});
  out.push_back(trunc_normal_(weight, 0.0, 0.02, -0.04, 0.04));
  out.push_back(torch::empty({40}).uniform_(-1, 1));
  out.push_back(torch::empty({7}).normal_());  // a scratch kernel, after a lazy anchor
  at::Tensor bias = torch::empty({5, 24});
  out.push_back(trunc_normal_(bias, 1.0, 2.0, -1.0, 3.0));
  out.push_back(torch::rand({33}, torch::kDouble));
  return out;
}

TEST(LazyAnchors, DrawingBeforeTheDebtIsPaidWarnsNamingTheSampler) {
  torch::manual_seed(7);
  const std::vector<at::Tensor> eager = program();
  torch::manual_seed(7);
  const std::vector<at::Tensor> deferred = deferred_init(program);
  torch::rand({3});  // draws from an owed generator
  CapturedWarnings warnings;
  for (const at::Tensor& t : deferred) {
    materialize_tensor(t);
  }
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_THAT(warnings.messages[0], HasSubstr("torchdefer::trunc_normal_"));
  EXPECT_THAT(warnings.messages[0], HasSubstr("exact_generator"));
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(eager[i], deferred[i])) << i;  // the values are unaffected
  }
}

TEST(LazyAnchors, AReseedBeforeTheDebtIsPaidMakesItMootSilently) {
  torch::manual_seed(8);
  const std::vector<at::Tensor> deferred = deferred_init(program);
  torch::manual_seed(99);
  const at::Tensor reseeded = torch::rand({4});
  torch::manual_seed(99);
  CapturedWarnings warnings;
  for (const at::Tensor& t : deferred) {
    materialize_tensor(t);
  }
  EXPECT_TRUE(warnings.messages.empty());
  EXPECT_TRUE(bitwise_equal(torch::rand({4}), reseeded));
}

TEST(LazyAnchors, AReseedToTheSameSeedBetweenTwoRecordingsMakesTheDebtMoot) {
  // Both recordings start right after torch::manual_seed(10): the generator is in the same state
  // at both starts, and only the owed mark tells the reseed from an untouched generator.
  torch::manual_seed(10);
  const std::vector<at::Tensor> eager = program();
  torch::manual_seed(10);
  const std::vector<at::Tensor> first = deferred_init(program);
  for (const at::Tensor& t : first) {
    materialize_tensor(t, MaterializeOptions().rng(RngMode::kCounter));  // pays nothing
  }
  torch::manual_seed(10);
  const std::vector<at::Tensor> second = deferred_init(program);
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(materialize_tensor(second[i]), eager[i])) << i;
  }
}

TEST(LazyAnchors, ARecordingThatStartsOwingContinuesFromTheOwedState) {
  // Layer by layer, as FSDP-style code constructs: the second recording starts while the first
  // one owes the generator.
  torch::manual_seed(9);
  const std::vector<at::Tensor> eager_first = program();
  const std::vector<at::Tensor> eager_second = program();
  const at::Tensor eager_next = torch::rand({5});
  torch::manual_seed(9);
  const std::vector<at::Tensor> first = deferred_init(program);
  const std::vector<at::Tensor> second = deferred_init(program);
  for (const at::Tensor& t : second) {
    materialize_tensor(t);
  }
  EXPECT_TRUE(bitwise_equal(torch::rand({5}), eager_next));
  for (const at::Tensor& t : first) {
    materialize_tensor(t);
  }
  for (size_t i = 0; i < eager_first.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(eager_first[i], first[i])) << "first " << i;
    EXPECT_TRUE(bitwise_equal(eager_second[i], second[i])) << "second " << i;
  }
}

TEST(LazyAnchors, AnUnrecordedDrawInsideTheRecordingSeesTheEagerGenerator) {
  // A real tensor drawn into during construction is not recorded: it draws from the generator,
  // which must be where eager has it, so the owed anchors are resolved first.
  auto build = [](at::Tensor real) {
    std::vector<at::Tensor> out = program();
    torch::NoGradGuard no_grad;
    real.uniform_();
    out.push_back(torch::randn({20}));
    return out;
  };
  torch::manual_seed(10);
  const at::Tensor eager_real = torch::zeros({50});
  const std::vector<at::Tensor> eager = build(eager_real);
  torch::manual_seed(10);
  const at::Tensor real = torch::zeros({50});
  const std::vector<at::Tensor> deferred = deferred_init(build, real);
  EXPECT_TRUE(bitwise_equal(real, eager_real));
  for (size_t i = 0; i < eager.size(); ++i) {
    materialize_tensor(deferred[i]);
    EXPECT_TRUE(bitwise_equal(eager[i], deferred[i])) << i;
  }
}

TEST(LazyAnchors, OpsAfterDeferredInitReturnedContinueTheOwedChain) {
  torch::manual_seed(12);
  std::vector<at::Tensor> eager = program();
  {
    torch::NoGradGuard no_grad;
    eager[0].normal_();
    eager[2].uniform_();
  }
  const at::Tensor eager_next = torch::rand({5});
  torch::manual_seed(12);
  std::vector<at::Tensor> deferred = deferred_init(program);
  {
    torch::NoGradGuard no_grad;
    deferred[0].normal_();
    deferred[2].uniform_();
  }
  for (const at::Tensor& t : deferred) {
    materialize_tensor(t);
  }
  EXPECT_TRUE(bitwise_equal(torch::rand({5}), eager_next));
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(eager[i], deferred[i])) << i;
  }
}

// A torchtitan-style model: constructed first, initialized afterwards by init_weights(), which
// draws truncated normals and branches on values it reads.
struct TitanLike : torch::nn::Module {
  TitanLike()
      : embedding(register_module("embedding", torch::nn::Embedding(50, 16))),
        projection(register_module("projection", torch::nn::Linear(16, 24))),
        output(register_module("output", torch::nn::Linear(24, 50))) {}

  void init_weights() {
    torch::NoGradGuard no_grad;
    trunc_normal_(embedding->weight, 0.0, 1.0, -2.0, 2.0);
    trunc_normal_(projection->weight, 0.0, 0.02, -0.04, 0.04);
    // A data-dependent branch on a tensor recorded before and initialized after construction.
    if (projection->weight.sum().item<double>() > 0) {
      output->weight.normal_(0.0, 0.01);
    } else {
      output->weight.uniform_(-0.01, 0.01);
    }
    const int64_t nonzero = (embedding->weight.abs() > 1.5).nonzero().size(0);
    trunc_normal_(output->bias, 0.0, 0.02 * static_cast<double>(nonzero + 1), -2.0, 2.0);
  }

  torch::nn::Embedding embedding;
  torch::nn::Linear projection;
  torch::nn::Linear output;
};

TEST(LazyAnchors, InitWeightsAfterDeferredInitReturnedReadsValuesAndGivesTheEagerBits) {
  for (uint64_t seed = 40; seed < 44; ++seed) {
    torch::manual_seed(seed);
    TitanLike eager;
    eager.init_weights();
    const at::Tensor eager_next = torch::rand({5});
    torch::manual_seed(seed);
    auto deferred = deferred_init([] { return std::make_shared<TitanLike>(); });
    CapturedWarnings warnings;
    deferred->init_weights();  // recorded, its reads replayed privately
    EXPECT_TRUE(is_fake(deferred->output->weight));
    materialize_module(*deferred);
    EXPECT_TRUE(bitwise_equal(torch::rand({5}), eager_next)) << "seed " << seed;
    EXPECT_TRUE(warnings.messages.empty()) << "seed " << seed;
    const auto eager_parameters = eager.named_parameters();
    for (const auto& parameter : deferred->named_parameters()) {
      EXPECT_TRUE(bitwise_equal(parameter.value(), eager_parameters[parameter.key()]))
          << parameter.key() << ", seed " << seed;
    }
  }
}

TEST(LazyAnchors, CounterModeNeverResolvesAnAnchor) {
  torch::manual_seed(13);
  const at::Tensor before = current_state();
  const std::vector<at::Tensor> deferred = deferred_init(program);
  for (const at::Tensor& t : deferred) {
    materialize_tensor(t, MaterializeOptions().rng(RngMode::kCounter));
  }
  // The debt is still owed: nothing computed the samplers' torch-mode values.
  EXPECT_TRUE(bitwise_equal(draws_from(current_state()), draws_from(before)));
}

TEST(LazyAnchors, RecordingDoesNotRunTruncNormal) {
  torch::manual_seed(21);
  const at::Tensor before = current_state();
  const at::Tensor deferred = deferred_init([] {
    torch::NoGradGuard no_grad;
    at::Tensor t = torch::empty({1000});
    return trunc_normal_(t, 0.0, 1.0, -2.0, 2.0);
  });
  EXPECT_TRUE(is_fake(deferred));
  EXPECT_TRUE(bitwise_equal(draws_from(current_state()), draws_from(before)));
}

// Note [Explicit generators]: a sampler given its own generator runs at record time, on scratch
// of its target's geometry, so that the generator is where eager leaves it when deferred_init
// returns; the default generator stays exact.
TEST(LazyAnchors, TruncNormalGivenAGeneratorLeavesItWhereEagerDoesAtOnce) {
  const auto build = [] {
    at::Generator generator = at::detail::createCPUGenerator(5);
    torch::NoGradGuard no_grad;
    at::Tensor weight = torch::empty({30, 10});
    trunc_normal_(weight, 0.0, 1.0, -0.3, 0.3, generator);
    return std::make_pair(weight, generator);
  };
  torch::manual_seed(3);
  const auto [eager, eager_generator] = build();
  const at::Tensor eager_default = current_state();
  torch::manual_seed(3);
  const auto [deferred, generator] = deferred_init(build);
  EXPECT_TRUE(bitwise_equal(generator.get_state(), eager_generator.get_state()));
  EXPECT_TRUE(bitwise_equal(current_state(), eager_default));
  materialize_tensor(deferred);
  EXPECT_TRUE(bitwise_equal(deferred, eager));
  EXPECT_TRUE(bitwise_equal(generator.get_state(), eager_generator.get_state()));
}

// Note [Followed generators]: on a followed generator the sampler is recorded, not run, and paid
// when something reads the generator: here an op given it, which passes the generator's key.
TEST(LazyAnchors, TruncNormalOnAFollowedGeneratorIsPaidWhenAnOpDrawsFromIt) {
  const auto build = [](at::Generator generator) {
    torch::NoGradGuard no_grad;
    at::Tensor weight = torch::empty({30, 10});
    trunc_normal_(weight, 0.0, 1.0, -0.3, 0.3, generator);
    at::Tensor bias = torch::empty({10}).uniform_(0, 1, generator);
    return std::make_pair(weight, bias);
  };
  at::Generator eager_generator = at::detail::createCPUGenerator(5);
  const auto [eager_weight, eager_bias] = build(eager_generator);
  const at::Tensor eager_next = at::rand({7}, eager_generator);
  at::Generator generator = followed_generator_of(at::detail::createCPUGenerator(5));
  const at::mt19937 seeded = generator.get<at::CPUGeneratorImpl>()->engine();
  const auto [weight, bias] = deferred_init(build, generator);
  EXPECT_TRUE(same_engine(generator.get<at::CPUGeneratorImpl>()->engine().data(), seeded.data()))
      << "recording ran the sampler";
  EXPECT_TRUE(bitwise_equal(at::rand({7}, generator), eager_next));
  materialize_tensor(bias);
  materialize_tensor(weight);
  EXPECT_TRUE(bitwise_equal(weight, eager_weight));
  EXPECT_TRUE(bitwise_equal(bias, eager_bias));
}

TEST(LazyAnchors, TruncNormalMaterializedInAnyOrderGivesTheEagerBits) {
  torch::manual_seed(22);
  const std::vector<at::Tensor> eager = program();
  for (uint32_t order_seed = 0; order_seed < 6; ++order_seed) {
    torch::manual_seed(22);
    const std::vector<at::Tensor> deferred = deferred_init(program);
    std::vector<size_t> order(deferred.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(order_seed));
    for (const size_t i : order) {
      materialize_tensor(deferred[i]);
    }
    for (size_t i = 0; i < eager.size(); ++i) {
      EXPECT_TRUE(bitwise_equal(eager[i], deferred[i])) << "order " << order_seed << ", " << i;
    }
  }
}

TEST(LazyAnchors, TruncNormalLeavesTheGeneratorOwedUntilAMaterializationPaysIt) {
  torch::manual_seed(23);
  program();
  const at::Tensor eager_state = current_state();
  const at::Tensor eager_next = torch::rand({5});
  torch::manual_seed(23);
  const std::vector<at::Tensor> deferred = deferred_init(program);
  EXPECT_FALSE(bitwise_equal(current_state(), eager_state));  // owed
  CapturedWarnings warnings;
  materialize_tensor(deferred.back());  // resolves both truncated normals' anchors
  EXPECT_TRUE(bitwise_equal(current_state(), eager_state));
  EXPECT_TRUE(bitwise_equal(torch::rand({5}), eager_next));
  EXPECT_TRUE(warnings.messages.empty());
}

TEST(LazyAnchors, TruncNormalWithExactGeneratorLeavesItWhereEagerDoesAtOnce) {
  torch::manual_seed(24);
  const std::vector<at::Tensor> eager = program();
  const at::Tensor eager_next = torch::rand({5});
  torch::manual_seed(24);
  const std::vector<at::Tensor> deferred =
      deferred_init(DeferredInitOptions().exact_generator(true), program);
  EXPECT_TRUE(bitwise_equal(torch::rand({5}), eager_next));
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_TRUE(is_fake(deferred[i]));
    materialize_tensor(deferred[i]);
    EXPECT_TRUE(bitwise_equal(eager[i], deferred[i])) << i;
  }
}

TEST(LazyAnchors, InitWeightsAfterAnExactGeneratorRecordingReturnedLeavesItWhereEagerDoesAtOnce) {
  torch::manual_seed(25);
  TitanLike eager;
  eager.init_weights();
  const at::Tensor eager_state = current_state();
  torch::manual_seed(25);
  auto deferred = deferred_init(DeferredInitOptions().exact_generator(true),
                                [] { return std::make_shared<TitanLike>(); });
  CapturedWarnings warnings;
  deferred->init_weights();  // truncated normals recorded after the call: resolved at once
  EXPECT_TRUE(bitwise_equal(current_state(), eager_state));
  EXPECT_TRUE(is_fake(deferred->output->bias));
  torch::rand({5});  // a draw before materializing: no debt to warn about
  materialize_module(*deferred);
  EXPECT_TRUE(warnings.messages.empty());
  const auto eager_parameters = eager.named_parameters();
  for (const auto& parameter : deferred->named_parameters()) {
    EXPECT_TRUE(bitwise_equal(parameter.value(), eager_parameters[parameter.key()]))
        << parameter.key();
  }
}

}  // namespace
}  // namespace torchdefer
