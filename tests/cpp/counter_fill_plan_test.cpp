// The CUDA counter fill's work split (Note [CUDA counter fill tiles]), run on the CPU: every
// thread of a launch, simulated with the kernel's own header, writes each element of the region
// once, at its global index, with 16-byte stores only where they are aligned, and the values it
// computes are the CPU fill's bits.
#include <torchdefer/counter_rng.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "replay/src/counter_rng_device.h"
#include "replay/src/cuda/counter_fill_plan.h"
#include "tests/cpp/test_util.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace torchdefer {
namespace {

namespace math = counter_math;
using counter_cuda::FillPlan;
using counter_cuda::Piece;
using testing::bitwise_equal;

using Distribution = CounterDistribution;

// A region of an op's output: `out` placed at `start` of `global`.
struct Region {
  std::string name;
  std::vector<int64_t> global;
  std::vector<int64_t> start;
  // `out`, a view of dtype `dtype` into a buffer of its own (storage offsets, strides).
  std::function<at::Tensor(c10::ScalarType)> out;
};

// `sizes`, contiguous, `shift` elements into its buffer: every alignment of `out` to 16 bytes.
at::Tensor shifted(std::vector<int64_t> sizes, int64_t shift, c10::ScalarType dtype) {
  int64_t numel = 1;
  for (const int64_t s : sizes) {
    numel *= s;
  }
  return torch::zeros({numel + 16}, dtype).narrow(0, shift, numel).view(sizes);
}

std::vector<Region> regions() {
  std::vector<Region> all;
  for (const int64_t shift : {0, 1, 2, 3, 5, 7, 8, 15}) {
    const std::string s = std::to_string(shift);
    all.push_back({"1-D from 0, shift " + s, {1000}, {0}, [=](c10::ScalarType dtype) {
                     return shifted({1000}, shift, dtype);
                   }});
    all.push_back({"1-D mid-block, shift " + s, {1300}, {37}, [=](c10::ScalarType dtype) {
                     return shifted({1001}, shift, dtype);
                   }});
    // A dim-0 shard of a matrix: merged into one row that starts mid-row of the op.
    all.push_back({"rows of a matrix, shift " + s, {9, 41}, {3, 0}, [=](c10::ScalarType dtype) {
                     return shifted({5, 41}, shift, dtype);
                   }});
    // A dim-1 shard: rows of 13 whose leads differ from row to row.
    all.push_back({"columns of a matrix, shift " + s, {9, 41}, {1, 5}, [=](c10::ScalarType dtype) {
                     return shifted({7, 13}, shift, dtype);
                   }});
  }
  for (const int64_t length : {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 65}) {
    for (const int64_t start : {int64_t{0}, int64_t{1}, int64_t{3}, (int64_t{1} << 33) - 3}) {
      all.push_back({"1-D of " + std::to_string(length) + " from " + std::to_string(start),
                     {start + length + 2},
                     {start},
                     [=](c10::ScalarType dtype) { return shifted({length}, 1, dtype); }});
    }
  }
  all.push_back({"a scalar", {}, {}, [](c10::ScalarType dtype) {
                   return torch::zeros({4}, dtype).narrow(0, 1, 1).squeeze(0);
                 }});
  all.push_back({"no elements", {4, 0}, {1, 0}, [](c10::ScalarType dtype) {
                   return torch::zeros({2, 0}, dtype);
                 }});
  all.push_back({"one element of a matrix", {6, 7}, {4, 5}, [](c10::ScalarType dtype) {
                   return torch::zeros({1, 1}, dtype);
                 }});
  // Rows padded in memory: contiguous rows whose strides are no multiple of 16 bytes.
  all.push_back({"padded rows", {30, 50}, {2, 3}, [](c10::ScalarType dtype) {
                   return torch::zeros({20, 53}, dtype).narrow(1, 1, 45);
                 }});
  // A transposed output: rows strided in memory, no 16-byte store.
  all.push_back({"transposed", {40, 30}, {0, 0}, [](c10::ScalarType dtype) {
                   return torch::zeros({30, 40}, dtype).t();
                 }});
  // A conv weight sharded on its input channels: [8, 3, 3, 3] of [8, 6, 3, 3] at channel 2.
  all.push_back({"conv input-channel shard", {8, 6, 3, 3}, {0, 2, 0, 0}, [](c10::ScalarType dtype) {
                   return torch::zeros({8, 3, 3, 3}, dtype);
                 }});
  all.push_back({"4-D block", {5, 6, 7, 9}, {1, 2, 3, 4}, [](c10::ScalarType dtype) {
                   return shifted({3, 2, 4, 5}, 3, dtype);
                 }});
  all.push_back({"long row", {70000}, {11}, [](c10::ScalarType dtype) {
                   return shifted({69000}, 5, dtype);
                 }});
  return all;
}

// The kernel's layout of `out` at `start` of `global`, as counter_rng_cuda.cpp builds it.
counter_cuda::Layout kernel_layout(const at::Tensor& out, const Region& region) {
  const CounterLayout merged = merge_rows(out, region.global, region.start);
  counter_cuda::Layout layout;
  layout.dims = static_cast<int>(merged.sizes.size());
  for (int d = 0; d < layout.dims; ++d) {
    layout.sizes[d] = merged.sizes[d];
    layout.strides[d] = merged.strides[d];
    layout.start[d] = merged.start[d];
    layout.global_strides[d] = merged.global_strides[d];
  }
  return layout;
}

// The thread counts a launch is simulated with: the launch's own and a few that make each thread
// loop over several tiles.
std::vector<int64_t> thread_counts(const FillPlan& plan) {
  return {counter_cuda::launch_blocks(plan) * counter_cuda::kThreadsPerBlock, 1, 3, 32, 257};
}

struct Written {
  int times = 0;
  uint64_t global = 0;
};

TEST(CudaCounterFillPlan, WritesEveryElementOnceAtItsGlobalIndex) {
  for (const Region& region : regions()) {
    for (const c10::ScalarType dtype : {at::kByte, at::kHalf, at::kFloat, at::kDouble}) {
      const at::Tensor out = region.out(dtype);
      const int size = static_cast<int>(out.element_size());
      // Where each element goes, from the region alone: its offset in `out` and its global
      // row-major index.
      int64_t span = 1;
      for (int64_t d = 0; d < out.dim(); ++d) {
        span += (out.size(d) - 1) * out.stride(d);
      }
      std::vector<int64_t> expected(static_cast<size_t>(out.numel() == 0 ? 0 : span), -1);
      std::vector<int64_t> index(static_cast<size_t>(out.dim()), 0);
      for (int64_t k = 0; k < out.numel(); ++k) {
        int64_t offset = 0;
        int64_t global = 0;
        for (int64_t d = 0; d < out.dim(); ++d) {
          offset += index[d] * out.stride(d);
          global = global * region.global[d] + region.start[d] + index[d];
        }
        expected[offset] = global;
        for (int64_t d = out.dim() - 1; d >= 0 && ++index[d] == out.size(d); --d) {
          index[d] = 0;
        }
      }
      const counter_cuda::Layout layout = kernel_layout(out, region);
      // Every alignment of `out`, the ones off its element size included (no 16-byte store
      // there); the plan never reads memory.
      for (uintptr_t misalignment = 0; misalignment < 16; ++misalignment) {
        const uintptr_t address = 0x7f0000000000 + misalignment;
        const FillPlan plan =
            counter_cuda::make_plan(layout, reinterpret_cast<const void*>(address), size);
        for (const int64_t threads : thread_counts(plan)) {
          SCOPED_TRACE(region.name + ", " + std::string(c10::toString(dtype)) + ", out at 16n + " +
                       std::to_string(misalignment) + ", " + std::to_string(threads) + " threads");
          std::vector<Written> written(expected.size());
          int64_t stray = 0;
          for (int64_t thread = 0; thread < threads; ++thread) {
            counter_cuda::for_each_piece(plan, thread, threads, [&](const Piece& piece) {
              ASSERT_GE(piece.count, 0);
              ASSERT_LE(piece.count, 16 / size);
              if (piece.vector) {
                ASSERT_EQ(piece.count, 16 / size);
                ASSERT_EQ(piece.stride, 1);
                ASSERT_EQ((address + static_cast<uintptr_t>(piece.offset * size)) % 16, 0u);
              }
              for (int k = 0; k < piece.count; ++k) {
                const int64_t offset = piece.offset + k * piece.stride;
                if (offset < 0 || offset >= static_cast<int64_t>(written.size())) {
                  ++stray;
                  continue;
                }
                ++written[offset].times;
                written[offset].global = piece.global + k;
              }
            });
            if (HasFatalFailure()) {
              return;
            }
          }
          ASSERT_EQ(stray, 0);
          for (size_t offset = 0; offset < expected.size(); ++offset) {
            if (expected[offset] < 0) {
              ASSERT_EQ(written[offset].times, 0) << "offset " << offset << " is not in `out`";
            } else {
              ASSERT_EQ(written[offset].times, 1) << "offset " << offset;
              ASSERT_EQ(written[offset].global, static_cast<uint64_t>(expected[offset]))
                  << "offset " << offset;
            }
          }
        }
      }
    }
  }
}

TEST(CudaCounterFillPlan, StoresEveryWholeAlignedPieceOfAContiguousRowAtOnce) {
  // 4 rows of 1000 float32, 1001 elements apart: each row starts at its own place relative to a
  // 16-byte boundary, and only its head and tail are written element by element.
  const at::Tensor out = torch::zeros({4, 1001}).narrow(1, 0, 1000);
  const Region region{"rows", {4, 1000}, {0, 0}, nullptr};
  for (const int64_t shift : {0, 1, 2, 3}) {
    const uintptr_t address = 0x7f0000000000 + 4 * shift;
    const FillPlan plan = counter_cuda::make_plan(kernel_layout(out, region),
                                                  reinterpret_cast<const void*>(address), 4);
    ASSERT_TRUE(plan.aligned_rows);
    int64_t scalar = 0;
    int64_t vector = 0;
    const int64_t threads = counter_cuda::launch_blocks(plan) * counter_cuda::kThreadsPerBlock;
    for (int64_t thread = 0; thread < threads; ++thread) {
      counter_cuda::for_each_piece(plan, thread, threads, [&](const Piece& piece) {
        (piece.vector ? vector : scalar) += piece.count;
      });
    }
    EXPECT_EQ(vector + scalar, 4000);
    EXPECT_LE(scalar, 4 * 2 * 3) << "shift " << shift;
  }
}

TEST(CudaCounterFillPlan, AdjacentThreadsStoreAdjacentPieces) {
  // One row, as a contiguous tensor or a dim-0 shard is: piece c of thread t + 1 follows piece
  // c of thread t in memory, so that each store instruction of a warp writes one run.
  const at::Tensor out = torch::zeros({100000});
  const Region region{"row", {100000}, {0}, nullptr};
  const FillPlan plan = counter_cuda::make_plan(kernel_layout(out, region),
                                                reinterpret_cast<const void*>(0x7f0000000000), 4);
  ASSERT_EQ(plan.pieces_per_tile, 4);
  for (int64_t thread = 0; thread + 1 < plan.tiles; thread += 97) {
    const counter_cuda::TileRow here = plan.tile_row(thread);
    const counter_cuda::TileRow next = plan.tile_row(thread + 1);
    for (int c = 0; c < plan.pieces_per_tile; ++c) {
      const Piece a = plan.piece(here, c);
      const Piece b = plan.piece(next, c);
      if (a.vector && b.vector) {
        EXPECT_EQ(b.offset, a.offset + 4) << "thread " << thread << ", piece " << c;
      }
    }
  }
}

// Fills `region` once with the CPU counter fill and once by simulating every thread of the
// kernel's launch on it, into buffers of zeros, and compares the buffers whole: the values, and
// nothing written outside `out`.
template <typename T>
void expect_kernel_plan_gives_the_cpu_bits(const CounterDistributionParams& p,
                                           const Region& region) {
  using E = CounterElement<T>;
  const c10::ScalarType dtype = c10::CppTypeToScalarType<T>::value;
  const uint64_t seed = 0x9e3779b97f4a7c15ull;
  const uint64_t stream = (uint64_t{5} << 32) | 11;
  const at::Tensor cpu = region.out(dtype);
  const at::Tensor kernel = region.out(dtype);
  SCOPED_TRACE(region.name + ", " + std::string(c10::toString(dtype)) + ", distribution " +
               std::to_string(static_cast<int>(p.distribution)));
  counter_fill(cpu, p, seed, stream, {region.global, region.start});
  if (kernel.numel() > 0) {
    const FillPlan plan = counter_cuda::make_plan(kernel_layout(kernel, region), kernel.data_ptr(),
                                                  static_cast<int>(sizeof(T)));
    const math::ElementParams params = math::for_dtype<E>(element_params(p, seed, stream));
    E* data = reinterpret_cast<E*>(kernel.data_ptr());
    const int64_t threads = counter_cuda::launch_blocks(plan) * counter_cuda::kThreadsPerBlock;
    for (int64_t thread = 0; thread < threads; ++thread) {
      counter_cuda::fill_thread<E>(data, plan, params, thread, threads);
    }
  }
  const at::Tensor cpu_buffer = at::empty({0}, cpu.options()).set_(cpu.storage());
  const at::Tensor kernel_buffer = at::empty({0}, kernel.options()).set_(kernel.storage());
  ASSERT_TRUE(bitwise_equal(cpu_buffer, kernel_buffer));
}

CounterDistributionParams random_params(int64_t from, uint64_t range) {
  CounterDistributionParams p{Distribution::kRandom};
  p.from = from;
  p.range = range;
  return p;
}

CounterDistributionParams truncated_normal(double mean, double std, double low, double high) {
  CounterDistributionParams p{Distribution::kTruncatedNormal, mean, std};
  p.low = low;
  p.high = high;
  return p;
}

template <typename T>
void expect_every_distribution_gives_the_cpu_bits(
    const std::vector<CounterDistributionParams>& distributions) {
  for (const CounterDistributionParams& p : distributions) {
    for (const Region& region : regions()) {
      expect_kernel_plan_gives_the_cpu_bits<T>(p, region);
      if (::testing::Test::HasFatalFailure()) {
        return;
      }
    }
  }
}

std::vector<CounterDistributionParams> floating_distributions() {
  return {{Distribution::kUniform, -0.3, 0.7},
          {Distribution::kNormal, 0.5, 2.0},
          {Distribution::kBernoulli, 0.3},
          {Distribution::kExponential, 1.5},
          {Distribution::kLogNormal, 0.1, 0.5},
          {Distribution::kCauchy, 0.5, 2.0},
          {Distribution::kGeometric, 0.25},
          random_params(-7, 1000),
          random_params(0, 0),
          random_params(int64_t{1} << 40, (uint64_t{1} << 32) + 5),
          truncated_normal(0.0, 0.02, -0.04, 0.04)};
}

std::vector<CounterDistributionParams> integer_distributions() {
  return {random_params(3, 100), random_params(0, 0), {Distribution::kBernoulli, 0.3}};
}

TEST(CudaCounterFillPlan, GivesTheCpuBitsForFloat32) {
  expect_every_distribution_gives_the_cpu_bits<float>(floating_distributions());
}

TEST(CudaCounterFillPlan, GivesTheCpuBitsForFloat64) {
  expect_every_distribution_gives_the_cpu_bits<double>(floating_distributions());
}

TEST(CudaCounterFillPlan, GivesTheCpuBitsForFloat16) {
  expect_every_distribution_gives_the_cpu_bits<c10::Half>(floating_distributions());
}

TEST(CudaCounterFillPlan, GivesTheCpuBitsForBFloat16) {
  expect_every_distribution_gives_the_cpu_bits<c10::BFloat16>(floating_distributions());
}

TEST(CudaCounterFillPlan, GivesTheCpuBitsForIntegersAndBool) {
  expect_every_distribution_gives_the_cpu_bits<uint8_t>(integer_distributions());
  expect_every_distribution_gives_the_cpu_bits<int8_t>(integer_distributions());
  expect_every_distribution_gives_the_cpu_bits<int16_t>(integer_distributions());
  expect_every_distribution_gives_the_cpu_bits<int32_t>(integer_distributions());
  expect_every_distribution_gives_the_cpu_bits<int64_t>(integer_distributions());
  expect_every_distribution_gives_the_cpu_bits<bool>(
      {random_params(0, 0), {Distribution::kBernoulli, 0.3}});
}

}  // namespace
}  // namespace torchdefer
