// Torch RNG mode on CUDA's generator (Note [Torch-mode draws on CUDA]): ATen's offset increments,
// and what a recording leaves and replays with and without a CUDA device.
#include <torchdefer/cuda_draws.h>
#include <torchdefer/torchdefer.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/cpp/test_util.h"

#include <cmath>
#include <string>

namespace torchdefer {
namespace {

using testing::bitwise_equal;
using testing::error_of;
using ::testing::HasSubstr;

// An H100 SXM's and an H200's: 132 multiprocessors of 2048 threads, at most 1056 blocks of 256.
constexpr CudaLaunchLimits kHopper{132, 2048};
constexpr uint64_t kMax32 = 2147483647;

TEST(CudaDistributionIncrement, IsFourPerCurandCallOfTheBusiestThread) {
  // One element: one block, one call.
  EXPECT_EQ(cuda_distribution_increment(1, 4, 4, true, 1, kHopper), 4u);
  // 4096^2 floats, four per call: 1056 blocks of 256 threads take 1,081,344 per round; 16 rounds.
  EXPECT_EQ(
      cuda_distribution_increment(4096 * 4096, 4, 4, true, 1 + (4096 * 4096 - 1) * 4, kHopper),
      64u);
  // The same in double, two per call: 32 rounds.
  EXPECT_EQ(
      cuda_distribution_increment(4096 * 4096, 8, 2, true, 1 + (4096 * 4096 - 1) * 8, kHopper),
      128u);
  // Fewer elements than one round of the capped grid: each thread one call.
  EXPECT_EQ(cuda_distribution_increment(1024, 4, 4, true, 1 + 1023 * 4, kHopper), 4u);
}

TEST(CudaDistributionIncrement, TakesNothingForNoElements) {
  EXPECT_EQ(cuda_distribution_increment(0, 4, 4, true, 1, kHopper), 0u);
}

TEST(CudaDistributionIncrement, AddsEveryHalfOfATensorTooLargeFor32BitOffsets) {
  // 2^30 floats span 4 GiB: the whole launch's offset is taken (993 rounds), then each half of
  // 2^29 (2 GiB less 4 bytes) is launched with its own (497 rounds each).
  const uint64_t n = uint64_t{1} << 30;
  EXPECT_EQ(cuda_distribution_increment(n, 4, 4, true, 1 + (n - 1) * 4, kHopper),
            993u * 4 + 2 * 497u * 4);
}

TEST(CudaDistributionIncrement, LeavesTheSplitOfALayoutThatIsNotDenseToARun) {
  const uint64_t n = uint64_t{1} << 30;
  EXPECT_FALSE(cuda_distribution_increment(n, 4, 4, false, kMax32 + 1, kHopper).has_value());
  // A sparse layout that still fits 32-bit offsets is one launch, dense or not.
  EXPECT_EQ(cuda_distribution_increment(1024, 4, 4, false, kMax32, kHopper), 4u);
}

at::Tensor cpu_generator_state() { return at::detail::getDefaultCPUGenerator().get_state(); }

at::Tensor kaiming_weight() {
  at::Tensor w = at::empty({5, 6}, at::TensorOptions().device(at::kCUDA));
  const double bound = 1.0 / std::sqrt(6.0);
  return w.uniform_(-bound, bound);
}

DeferredInitOptions from_cuda() {
  return DeferredInitOptions().cuda_draws(CudaDraws::kCudaGenerator);
}

TEST(CudaDraws, RecordingLeavesTheCpuGeneratorWhereEagerConstructionOnCudaLeavesIt) {
  torch::manual_seed(5);
  const at::Tensor before = cpu_generator_state();
  at::Tensor w = deferred_init(from_cuda(), kaiming_weight);
  EXPECT_TRUE(w.is_cuda());
  EXPECT_TRUE(bitwise_equal(cpu_generator_state(), before));
}

TEST(CudaDraws, CounterModeGivesTheSameValuesWhicheverGeneratorTheRecordingFollowed) {
  torch::manual_seed(5);
  at::Tensor from_cuda_generator = deferred_init(from_cuda(), kaiming_weight);
  torch::manual_seed(5);
  at::Tensor from_cpu_generator =
      deferred_init(DeferredInitOptions().cuda_draws(CudaDraws::kCpuGenerator), kaiming_weight);
  const auto counter_on_cpu = MaterializeOptions().rng(RngMode::kCounter).device(at::kCPU);
  materialize_tensor(from_cuda_generator, counter_on_cpu);
  materialize_tensor(from_cpu_generator, counter_on_cpu);
  EXPECT_TRUE(bitwise_equal(from_cuda_generator, from_cpu_generator));
}

TEST(CudaDraws, TorchModeWithoutACudaDeviceNamesTheOpAndLosesNothing) {
  if (at::globalContext().hasCUDA()) {
    GTEST_SKIP() << "a CUDA device is present: TorchModeOnCudaIsEagerConstructionOnCuda runs";
  }
  at::Tensor w = deferred_init(from_cuda(), kaiming_weight);
  const std::string message =
      error_of([&] { materialize_tensor(w, MaterializeOptions().device(at::kCPU)); });
  EXPECT_THAT(message, HasSubstr("aten::uniform_"));
  EXPECT_THAT(message, HasSubstr("no CUDA device"));
  EXPECT_THAT(message, HasSubstr("CudaDraws::kCpuGenerator"));
  EXPECT_TRUE(is_fake(w));
}

TEST(CudaDraws, RecordingCreatesNoCudaContext) {
  if (!at::globalContext().hasCUDA()) {
    GTEST_SKIP() << "needs a CUDA device";
  }
  torch::manual_seed(5);
  at::Tensor w = deferred_init(from_cuda(), kaiming_weight);  // a distribution kernel
  EXPECT_FALSE(at::detail::getCUDAHooks().hasPrimaryContext(0)) << "after uniform_";
  at::Tensor order = deferred_init(from_cuda(), [] {  // a sampler: the generator is owed
    return at::randperm(10, at::TensorOptions().device(at::kCUDA));
  });
  EXPECT_FALSE(at::detail::getCUDAHooks().hasPrimaryContext(0)) << "after randperm";
  EXPECT_TRUE(is_fake(w) && is_fake(order));
}

TEST(CudaDraws, TorchModeOnCudaIsEagerConstructionOnCuda) {
  if (!at::globalContext().hasCUDA()) {
    GTEST_SKIP() << "needs a CUDA device";
  }
  at::Generator cuda = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, 0));
  torch::manual_seed(5);
  const at::Tensor eager = kaiming_weight();
  const uint64_t eager_offset = cuda.get_offset();
  torch::manual_seed(5);
  at::Tensor w = deferred_init(from_cuda(), kaiming_weight);
  EXPECT_EQ(cuda.get_offset(), eager_offset);  // moved at record time, as eager moves it
  materialize_tensor(w);
  EXPECT_TRUE(bitwise_equal(w, eager));
  EXPECT_EQ(cuda.get_offset(), eager_offset);
}

}  // namespace
}  // namespace torchdefer
