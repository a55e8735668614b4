// The counter RNG's vector kernels (Note [Vectorized counter fill]), as plain declarations.
//
// Each kernel translation unit is compiled for one instruction set, so this header declares and
// never defines: an inline function compiled with AVX-512 flags that the linker kept for the
// whole library would crash it on an older CPU. For the same reason the kernel files include no
// c10/ATen or standard-library template code.
#pragma once

#include <cstdint>

namespace torchdefer::counter_simd {

enum class Op {
  kUniform,
  kNormal,
  kBernoulli,
  kExponential,
  kTruncatedNormal,
  kLogNormal,
  kCauchy,
  kGeometric,
  kRandom  // 32-bit draws only: a range of at most 2^32
};
enum class Dtype { kFloat, kDouble, kHalf, kBFloat16 };

// Elements [first, first + count) of one random op's output, stored contiguously at `out`.
// `first` is the first element of a Philox block: a multiple of 4 for 32-bit draws, of 2 for
// 64-bit draws (float64 uniform, normal and exponential).
struct Job {
  Op op = Op::kUniform;
  Dtype dtype = Dtype::kFloat;
  void* out = nullptr;
  uint64_t first = 0;
  int64_t count = 0;
  double a = 0.0;       // CounterDistributionParams::a
  double b = 1.0;       // CounterDistributionParams::b
  double low = 0.0;     // kTruncatedNormal: the bounds,
  double high = 0.0;    //
  double u_low = 0.0;   // and erf of the standardized bounds over √2 (counter_math::for_dtype)
  double u_high = 0.0;  //
  int64_t from = 0;     // kRandom: the first value,
  uint64_t range = 0;   // and how many (the dtype's default resolved)
  uint64_t seed = 0;
  uint64_t stream = 0;
};

// Whether the CPU and the OS support the AVX-512 kernels (F, DQ, BW and VL).
bool avx512_available();

// Whether they support the AVX2 kernels (AVX2, FMA and F16C).
bool avx2_available();

// The most elements one erfinv_avx2 call takes.
constexpr int64_t kErfinvChunk = 1024;

// out[i] = counter_math::erfinv(u[i]) for i < count ≤ kErfinvChunk, bit for bit (Note
// [Vectorized truncated normal]: the float64 truncated normal with AVX2). Only where
// avx2_available().
void erfinv_avx2(const double* u, double* out, int64_t count);

// The Philox blocks of one group of each kernel.
constexpr int64_t kAvx512GroupBlocks = 64;
constexpr int64_t kAvx2GroupBlocks = 32;

// Fills the longest prefix of `job` made of whole groups of kAvx512GroupBlocks Philox blocks and
// returns its length in elements; the caller fills the rest. Only where avx512_available().
int64_t fill_avx512(const Job& job);

// The same with AVX2, whole groups of kAvx2GroupBlocks blocks, uniform, normal and truncated
// normal in float32, float16 and bfloat16 only (0 otherwise). Only where avx2_available().
int64_t fill_avx2(const Job& job);

}  // namespace torchdefer::counter_simd
