// The default generator after deferred_init is where eager construction leaves it for everyone who
// locks it, while its jump is still being computed on the worker thread (Note [The jump in the
// background]).
#include <torchdefer/torchdefer.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/cpp/test_util.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace torchdefer {
namespace {

using testing::bitwise_equal;

// The default generator's state, read as PyTorch asks: under its mutex.
at::Tensor locked_state() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

struct Model {
  std::string name;
  std::function<std::shared_ptr<torch::nn::Module>()> build;
};

// Models whose construction draws millions of words (jumps long enough to be made in the
// background), each from its own mix of initializers.
std::vector<Model> models() {
  return {
      {"Linear(4096, 4096)", [] { return torch::nn::Linear(4096, 4096).ptr(); }},
      {"Embedding + MLP",
       [] {
         return torch::nn::Sequential(torch::nn::Embedding(8000, 512), torch::nn::Linear(512, 1024),
                                      torch::nn::LayerNorm(std::vector<int64_t>{1024}),
                                      torch::nn::Linear(1024, 512))
             .ptr();
       }},
      {"Conv2d stack",
       [] {
         return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 256, 3)),
                                      torch::nn::Conv2d(torch::nn::Conv2dOptions(256, 256, 3)))
             .ptr();
       }},
  };
}

std::shared_ptr<torch::nn::Module> deferred(const Model& model) {
  return deferred_init([&] { return model.build(); });
}

TEST(BackgroundJump, TheGeneratorAfterDeferredInitIsBitwiseEagersForSeveralModels) {
  for (const Model& model : models()) {
    torch::manual_seed(11);
    model.build();
    const at::Tensor eager = locked_state();
    torch::manual_seed(11);
    auto module = deferred(model);
    EXPECT_TRUE(bitwise_equal(locked_state(), eager)) << model.name;
  }
}

TEST(BackgroundJump, BackToBackRecordingsLeaveItWhereBackToBackConstructionsDo) {
  const std::vector<Model> all = models();
  torch::manual_seed(12);
  for (const Model& model : all) {
    model.build();
  }
  const at::Tensor eager = locked_state();
  torch::manual_seed(12);
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  for (const Model& model : all) {
    modules.push_back(deferred(model));
  }
  EXPECT_TRUE(bitwise_equal(locked_state(), eager));
  for (size_t i = 0; i < all.size(); ++i) {  // and every recording from its own place
    materialize_module(*modules[i]);
  }
  torch::manual_seed(12);
  for (size_t i = 0; i < all.size(); ++i) {
    auto eager_module = all[i].build();
    const auto expected = eager_module->named_parameters();
    for (const auto& parameter : modules[i]->named_parameters()) {
      EXPECT_TRUE(bitwise_equal(parameter.value(), expected[parameter.key()]))
          << all[i].name << ": " << parameter.key();
    }
  }
}

TEST(BackgroundJump, ADrawRightAfterDeferredInitOnTheSameThreadIsEagers) {
  for (const Model& model : models()) {
    torch::manual_seed(13);
    model.build();
    const at::Tensor eager = torch::rand({1000});
    torch::manual_seed(13);
    auto module = deferred(model);
    EXPECT_TRUE(bitwise_equal(torch::rand({1000}), eager)) << model.name;
  }
}

TEST(BackgroundJump, ADrawRightAfterDeferredInitOnAnotherThreadIsEagers) {
  for (const Model& model : models()) {
    torch::manual_seed(14);
    model.build();
    const at::Tensor eager = torch::randn({1000});
    torch::manual_seed(14);
    std::atomic<bool> returned{false};
    at::Tensor drawn;
    std::thread other([&] {
      while (!returned.load()) {
      }
      drawn = torch::randn({1000});
    });
    auto module = deferred(model);
    returned = true;
    other.join();
    EXPECT_TRUE(bitwise_equal(drawn, eager)) << model.name;
  }
}

TEST(BackgroundJump, AManualSeedRightAfterDeferredInitIsNotUndoneByThePendingJump) {
  torch::manual_seed(7);
  const at::Tensor seeded = torch::rand({1000});
  for (const Model& model : models()) {
    torch::manual_seed(15);
    auto module = deferred(model);
    torch::manual_seed(7);
    EXPECT_TRUE(bitwise_equal(torch::rand({1000}), seeded)) << model.name;
  }
}

// What a child forked right after deferred_init draws first, read back through a pipe; fails
// rather than hangs if the child does not answer within 30 s.
at::Tensor draws_of_a_child_forked_after(const Model& model) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  auto module = deferred(model);
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    const at::Tensor drawn = torch::rand({256});
    const auto* bytes = static_cast<const char*>(drawn.const_data_ptr());
    size_t written = 0;
    while (written < drawn.nbytes()) {
      const ssize_t n = write(fds[1], bytes + written, drawn.nbytes() - written);
      if (n <= 0) {
        _exit(1);
      }
      written += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  at::Tensor drawn = torch::zeros({256});
  auto* bytes = static_cast<char*>(drawn.mutable_data_ptr());
  size_t read_bytes = 0;
  while (read_bytes < drawn.nbytes()) {
    pollfd ready{fds[0], POLLIN, 0};
    if (poll(&ready, 1, 30'000) != 1) {
      ADD_FAILURE() << model.name << ": the child forked after deferred_init did not answer";
      kill(child, SIGKILL);
      break;
    }
    const ssize_t n = read(fds[0], bytes + read_bytes, drawn.nbytes() - read_bytes);
    if (n <= 0) {
      ADD_FAILURE() << model.name << ": the child forked after deferred_init died";
      break;
    }
    read_bytes += static_cast<size_t>(n);
  }
  close(fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  return drawn;
}

TEST(BackgroundJump, AChildForkedRightAfterDeferredInitDrawsEagersNumbersWithoutHanging) {
  for (const Model& model : models()) {
    torch::manual_seed(16);
    model.build();
    const at::Tensor eager = torch::rand({256});
    torch::manual_seed(16);
    EXPECT_TRUE(bitwise_equal(draws_of_a_child_forked_after(model), eager)) << model.name;
    // The parent goes on as eager too, and a child's exit left nothing behind.
    EXPECT_TRUE(bitwise_equal(torch::rand({256}), eager)) << model.name;
  }
}

TEST(BackgroundJump, AValueReadRightAfterDeferredInitSeesEagersValuesAndLeavesEagersGenerator) {
  torch::manual_seed(17);
  torch::nn::Linear eager(4096, 4096);
  const float eager_sum = eager->weight.abs().sum().item<float>();
  const at::Tensor eager_state = locked_state();
  torch::manual_seed(17);
  auto linear = deferred_init<torch::nn::Linear>(4096, 4096);
  EXPECT_EQ(linear->weight.abs().sum().item<float>(), eager_sum);  // replayed privately
  EXPECT_TRUE(bitwise_equal(locked_state(), eager_state));
  materialize_module(*linear);
  EXPECT_TRUE(bitwise_equal(linear->weight, eager->weight));
  EXPECT_TRUE(bitwise_equal(locked_state(), eager_state));
}

TEST(BackgroundJump, ExactGeneratorLeavesItExactEvenForReadersThatDoNotLock) {
  for (const Model& model : models()) {
    torch::manual_seed(18);
    model.build();
    const at::Tensor eager = locked_state();
    torch::manual_seed(18);
    auto module =
        deferred_init(DeferredInitOptions().exact_generator(true), [&] { return model.build(); });
    EXPECT_TRUE(bitwise_equal(at::detail::getDefaultCPUGenerator().get_state(), eager))
        << model.name;
  }
}

// Note [A recording that starts during a jump]: a recording that starts right after another
// deferred_init returned reads, without waiting, what it would have read after the jump.

// The parameters of `module`, materialized in `mode`: in counter RNG mode the recording's counter
// seed decides every bit, in torch RNG mode its anchors do.
std::vector<at::Tensor> materialized(const std::shared_ptr<torch::nn::Module>& module,
                                     RngMode mode) {
  materialize_module(*module, MaterializeOptions().rng(mode));
  return module->parameters();
}

void expect_bitwise_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                          const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(a[i], b[i])) << what << ": tensor " << i;
  }
}

// Whether the second recording starts before the first one's jump is done depends on the
// scheduler; each pair is recorded a few times so that it does, most of those times.
TEST(BackgroundJump, ARecordingRightAfterAnotherGivesTheSeedsAndValuesOfOneMadeAfterTheJump) {
  const std::vector<Model> all = models();
  for (size_t i = 0; i < all.size(); ++i) {
    const Model& first = all[i];
    const Model& second = all[(i + 1) % all.size()];
    for (const RngMode mode : {RngMode::kCounter, RngMode::kTorch}) {
      const std::string what = first.name + " then " + second.name +
                               (mode == RngMode::kCounter ? " (counter)" : " (torch)");
      torch::manual_seed(31);
      auto before_waiting = deferred(first);
      locked_state();  // waits for the jump
      auto after_waiting = deferred(second);
      const at::Tensor generator_after = locked_state();
      const std::vector<at::Tensor> expected = materialized(after_waiting, mode);
      for (int repeat = 0; repeat < 3; ++repeat) {
        torch::manual_seed(31);
        auto a = deferred(first);
        auto right_after = deferred(second);
        EXPECT_TRUE(bitwise_equal(locked_state(), generator_after)) << what;
        expect_bitwise_equal(materialized(right_after, mode), expected, what);
      }
    }
  }
}

TEST(BackgroundJump, BackToBackRecordingsGiveEagersValuesAndGenerator) {
  torch::manual_seed(32);
  std::vector<std::shared_ptr<torch::nn::Module>> eager;
  for (int i = 0; i < 6; ++i) {
    eager.push_back(torch::nn::Linear(4096, 512 * (i + 1)).ptr());
  }
  const at::Tensor eager_state = locked_state();
  torch::manual_seed(32);
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  for (int i = 0; i < 6; ++i) {
    modules.push_back(deferred_init([i] { return torch::nn::Linear(4096, 512 * (i + 1)).ptr(); }));
  }
  EXPECT_TRUE(bitwise_equal(locked_state(), eager_state));
  for (size_t i = 0; i < modules.size(); ++i) {
    materialize_module(*modules[i]);
    const auto expected = eager[i]->named_parameters();
    for (const auto& parameter : modules[i]->named_parameters()) {
      EXPECT_TRUE(bitwise_equal(parameter.value(), expected[parameter.key()]))
          << "recording " << i << ": " << parameter.key();
    }
  }
  EXPECT_TRUE(bitwise_equal(locked_state(), eager_state));
}

TEST(BackgroundJump, AManualSeedBetweenBackToBackRecordingsIsSeen) {
  for (const Model& model : models()) {
    torch::manual_seed(33);
    model.build();
    const at::Tensor eager_state = locked_state();
    for (const RngMode mode : {RngMode::kCounter, RngMode::kTorch}) {
      torch::manual_seed(33);
      const std::vector<at::Tensor> expected = materialized(deferred(model), mode);
      torch::manual_seed(34);
      auto first = deferred(model);
      torch::manual_seed(33);
      auto second = deferred(model);
      EXPECT_TRUE(bitwise_equal(locked_state(), eager_state)) << model.name;
      expect_bitwise_equal(materialized(second, mode), expected, model.name);
    }
  }
}

TEST(BackgroundJump, AManualSeedInsideARecordingThatStartedDuringAJumpIsSeen) {
  const auto build = [] {
    auto first = torch::nn::Linear(1024, 1024);
    torch::manual_seed(36);
    auto second = torch::nn::Linear(1024, 1024);
    return torch::nn::Sequential(first, second).ptr();
  };
  torch::manual_seed(35);
  torch::nn::Linear(4096, 4096);
  auto eager = build();
  const at::Tensor eager_state = locked_state();
  const auto expected = eager->named_parameters();
  for (int repeat = 0; repeat < 10; ++repeat) {  // as in the test above
    torch::manual_seed(35);
    auto before = deferred_init<torch::nn::Linear>(4096, 4096);
    auto module = deferred_init(build);
    EXPECT_TRUE(bitwise_equal(locked_state(), eager_state));
    materialize_module(*module);
    for (const auto& parameter : module->named_parameters()) {
      EXPECT_TRUE(bitwise_equal(parameter.value(), expected[parameter.key()])) << parameter.key();
    }
  }
}

TEST(BackgroundJump, ExactGeneratorRightAfterAnotherRecordingLeavesItExact) {
  torch::manual_seed(37);
  torch::nn::Linear(4096, 4096);
  torch::nn::Linear(2048, 2048);
  const at::Tensor eager = locked_state();
  torch::manual_seed(37);
  auto first = deferred_init<torch::nn::Linear>(4096, 4096);
  auto second = deferred_init(DeferredInitOptions().exact_generator(true),
                              [] { return torch::nn::Linear(2048, 2048).ptr(); });
  EXPECT_TRUE(bitwise_equal(at::detail::getDefaultCPUGenerator().get_state(), eager));
}

}  // namespace
}  // namespace torchdefer
