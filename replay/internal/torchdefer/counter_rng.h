// Counter-based random numbers: every element of a random op's output is a pure function of
// (seed, stream, element index), so any slice of any tensor can be generated on its own, on any
// rank, with the same bits that the full tensor has.
#pragma once

#include <torchdefer/counter_distribution.h>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <array>
#include <cstdint>

namespace torchdefer {

// Note [Counter RNG]
// ~~~~~~~~~~~~~~~~~~
// Generator: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11),
// key = (lo32(seed), hi32(seed)), counter = (lo32(b), hi32(b), lo32(stream), hi32(stream)) for
// block b. Element e of an op's output (its row-major index in the op's own output shape) uses
// word e % 4 of block e / 4 when it needs 32 random bits, or words 2(e % 2) and 2(e % 2) + 1 of
// block e / 2 when it needs 64 (float64 uniform and normal draws, random ranges wider than 2^32).
//
//  * uniform: u = (w >> 8)·2^-24 (float32, float16, bfloat16) or (x >> 11)·2^-53 (float64, x
//    the 64-bit draw with the odd word high), value from + (to − from)·u in double, rounded to
//    the dtype to nearest even (float16 and bfloat16 to float32 first, then to 16 bits); a value
//    that rounds to `to` becomes `from`, as in ATen.
//  * normal: elements pair up as (2k, 2k + 1) inside a block; Box–Muller on that pair's words,
//    u1 = (w0 + 1)·2^-32 ∈ (0, 1], u2 = w1·2^-32, r = sqrt(−2 ln u1), the even element
//    mean + std·r·cos 2πu2 and the odd one mean + std·r·sin 2πu2, in double, then rounded (for
//    float64, u1 and u2 take 53 bits from the two 64-bit halves of the block).
//  * bernoulli(p): w·2^-32 < p. random(from, to): from + draw mod (to − from), the draw 32 or 64
//    bits by the range. exponential(λ): −ln(u1)/λ. log_normal: exp of the normal value.
//    cauchy(m, σ): m + σ·tan(π(u − ½)). geometric(p): max(1, ceil(ln u1 / ln(1 − p))).
//  * truncated normal(mean, std, low, high) (Note [Counter-mode truncated normal]): u the uniform
//    over [erf(α/√2), erf(β/√2)) with α, β = (low or high − mean)/std, the value
//    clamp(mean + std·(√2·erfinv(u)), low, high), in double, then rounded.
//  * A complex output (uniform and normal, the two torch draws for complex tensors) is its real
//    view, as ATen fills it: element e of the view_as_real shape [..., 2] is the real (e even) or
//    imaginary (e odd) part, and normal's std is std/√2, so that the complex value has variance
//    std², as eager's does. A shard's box of a complex tensor is then the same box of that view.
//
// Every step is IEEE + − × ÷, sqrt and fused multiply-add, exact bit operations, and
// torchdefer's own log, exp, sincos, erf and erfinv built from those (counter_math below),
// compiled with FP contraction off (-ffp-contract=off, and -fmad=false for nvcc), so that the
// compiler fuses no multiply-add the definition does not write. So the bits do not depend on the
// C library, the CPU, the GPU or the compiler: the CPU fill, its vector kernels and the CUDA
// kernel share one definition (replay/src/counter_math.h), and have the same bits. A
// NaN result is stored as the x86 default NaN (negative, quiet) on every device.

// Note [Counter scheme versions]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Counter mode promises the same weights for every world size and layout, and across releases
// as long as its scheme is the same: the version below names the bits, and changes whenever any
// element of any distribution changes. materialize_module reports it per tensor
// (TensorStats::counter_scheme, "counter_scheme" in Python), `python -m torchdefer` prints it,
// and counter_rng_test.cpp pins the bits of every distribution and dtype (known answers) to it.
//  * 1: the scheme of Note [Counter RNG] with Halley-step erfinv, series without fused
//    multiply-adds, and explicit generators keyed by op index like the default generator.
//  * 2 (issue 30): the per-element cost of counter mode at the machine's speed.
//    - erfinv is a·g(w), w = −ln(1 − a²), g one of three polynomials (counter_math.h), within
//      2.1 ulp of the true value, tens of operations instead of four Halley steps on a series
//      of 27 divisions: the truncated normal's bits change (it is faster than eager's).
//    - log's atanh series and the sine and cosine Taylor series are Chebyshev polynomials
//      with fewer terms (8, 7 and 8 instead of 13, 10 and 11), and every polynomial and series
//      step is a fused multiply-add, one rounding instead of two: the bits of normal,
//      log-normal, exponential, Cauchy, geometric and the truncated normal change by an ulp here
//      and there; uniform, bernoulli and random keep theirs.
//    - A random op given its own generator is keyed by that generator's state (Note [Counter
//      keys of explicit generators]).
//  * 3 (issue 29): a random op drawn from a generator after a trunc_normal_ (or another
//    value-dependent sampler) on that generator is keyed by where it starts on the generator's
//    followed chain, not by a state only running the sampler gives (Note [Followed generators]):
//    the keys of those ops change; every distribution keeps its bits.
constexpr int kCounterSchemeVersion = 3;

// One Philox4x32-10 block.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

struct CounterDistributionParams {
  CounterDistribution distribution = CounterDistribution::kUniform;
  double a = 0.0;
  double b = 1.0;
  int64_t from = 0;
  uint64_t range = 0;
  double low = 0.0;   // kTruncatedNormal
  double high = 0.0;  // kTruncatedNormal
};

// The element space of one random op's output: its global shape, and where `out` sits in it.
// An empty `start` means `out` is the whole output.
struct CounterRegion {
  c10::IntArrayRef global_sizes;
  c10::IntArrayRef start;
};

// Fills `out` (any strides, any floating, integer or bool dtype the distribution allows, on any
// device) with the values of the elements of op output `region` at `out`'s positions.
// Multi-threaded on the CPU; a CUDA kernel on CUDA in CUDA builds; through bounded host chunks on
// any other device (Note [Counter fill on other devices]).
void counter_fill(const at::Tensor& out, const CounterDistributionParams& params, uint64_t seed,
                  uint64_t stream, CounterRegion region = {});

// The instruction set counter_fill uses for CPU tensors on this machine: "avx512", "avx2" or
// "scalar" (Note [Vectorized counter fill]), after TORCHDEFER_CPU_CAPABILITY's cap.
const char* counter_fill_isa();

// Whether counter_fill has its CUDA kernel (Note [CUDA counter fill build]); without it a CUDA
// tensor is filled through the host (Note [Counter fill on other devices]).
bool counter_fill_has_cuda_kernel();

// The deterministic math the distributions use, exposed for tests.
namespace counter_math {
double log(double x);  // x > 0, finite
double exp(double x);
void sincos_2pi(double t, double* sin, double* cos);  // sin and cos of 2πt
double erf(double x);
double erfinv(double u);  // ±∞ at ±1, NaN outside [−1, 1]
}  // namespace counter_math

}  // namespace torchdefer
