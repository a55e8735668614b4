// The counter RNG's per-element math (Note [Counter RNG]): Philox4x32-10, log, exp, sincos, erf,
// erfinv, every distribution and the rounding to each dtype, defined once for the CPU fill, its
// vector kernels and the CUDA kernel (Note [One definition of the counter math]).
//
// No torch headers and no library calls but fma: IEEE + − × ÷, sqrt and fused multiply-add, each
// correctly rounded, and exact bit operations. A fused multiply-add is written out (Lanes::fma)
// wherever one is meant; every translation unit that includes this header is compiled with FP
// contraction off (-ffp-contract=off for the host compiler, -fmad=false for nvcc), so that the
// compiler fuses nothing else.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <torchdefer/counter_distribution.h>

#if defined(__CUDACC__)
#define TORCHDEFER_HOST_DEVICE __host__ __device__
#else
#define TORCHDEFER_HOST_DEVICE
#endif

// The vector kernels' lanes are several registers wide: a function of them that is not inlined
// takes and returns them through memory.
#if defined(__GNUC__) || defined(__clang__)
#define TORCHDEFER_FORCE_INLINE __attribute__((always_inline))
#else
#define TORCHDEFER_FORCE_INLINE
#endif

// Each instruction set's translation unit instantiates this header's inline functions in its own
// namespace, so that the linker never keeps an AVX-512 copy of a function the scalar path calls.
#ifndef TORCHDEFER_COUNTER_ISA
#define TORCHDEFER_COUNTER_ISA portable
#endif

namespace torchdefer::counter_math {

// Note [One definition of the counter math]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The formulas live here once, as templates over a lane type: `uint32_t` and `double` for the
// scalar CPU path and the CUDA kernel (one element per call), and thin wrappers over AVX2 and
// AVX-512 registers in the vector kernels (counter_rng_avx2.cpp, counter_rng_avx512.cpp), which
// supply the same few primitives through a Lanes<V> specialization: broadcast, compare, select,
// trunc, split_exponent, pow2 and sqrt for double lanes; add, xor and the 32x32→64 multiply for
// Philox's word lanes. A lane computes the IEEE operations of the scalar definition in the same
// order, so every path has the same bits by construction, and counter_rng_test.cpp checks each
// path element by element (TORCHDEFER_CPU_CAPABILITY runs each on one machine). The vector
// kernels keep only what is theirs: where the words of each element sit in a register, and the
// conversions to and from memory.
inline namespace TORCHDEFER_COUNTER_ISA {

// Philox4x32-10's multipliers and key increments (Random123).
constexpr uint32_t kPhiloxMul0 = 0xD2511F53u;
constexpr uint32_t kPhiloxMul1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxWeyl1 = 0xBB67AE85u;

constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln 2 rounded to 32 significant bits
constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln 2 − kLn2Hi
constexpr double kInvLn2 = 1.44269504088896338700;
constexpr double kHalfPi = 1.57079632679489661923;
constexpr double kSqrt2 = 1.41421356237309504880;
constexpr double kSqrtPi = 1.77245385090551602730;
constexpr double kTwoOverSqrtPi = 1.12837916709551257390;
constexpr double kTwoPow32 = 4294967296.0;

// 1/n! for n = 0..20, correctly rounded. A function rather than an array, which CUDA device code
// cannot read; the polynomial loops below are unrolled, so every call folds to its constant.
TORCHDEFER_HOST_DEVICE constexpr double inverse_factorial(int n) {
  switch (n) {
    case 0:
      return 1.0;
    case 1:
      return 1.0;
    case 2:
      return 1.0 / 2.0;
    case 3:
      return 1.0 / 6.0;
    case 4:
      return 1.0 / 24.0;
    case 5:
      return 1.0 / 120.0;
    case 6:
      return 1.0 / 720.0;
    case 7:
      return 1.0 / 5040.0;
    case 8:
      return 1.0 / 40320.0;
    case 9:
      return 1.0 / 362880.0;
    case 10:
      return 1.0 / 3628800.0;
    case 11:
      return 1.0 / 39916800.0;
    case 12:
      return 1.0 / 479001600.0;
    case 13:
      return 1.0 / 6227020800.0;
    case 14:
      return 1.0 / 87178291200.0;
    case 15:
      return 1.0 / 1307674368000.0;
    case 16:
      return 1.0 / 20922789888000.0;
    case 17:
      return 1.0 / 355687428096000.0;
    case 18:
      return 1.0 / 6402373705728000.0;
    case 19:
      return 1.0 / 121645100408832000.0;
    default:
      return 1.0 / 2432902008176640000.0;
  }
}

// ---------------------------------------------------------------------------------------------
// Bits.

TORCHDEFER_HOST_DEVICE inline uint64_t double_bits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof(bits));
  return bits;
#endif
}

TORCHDEFER_HOST_DEVICE inline double bits_double(uint64_t bits) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  double d;
  std::memcpy(&d, &bits, sizeof(d));
  return d;
#endif
}

TORCHDEFER_HOST_DEVICE inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
#endif
}

TORCHDEFER_HOST_DEVICE inline float bits_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

// ---------------------------------------------------------------------------------------------
// Lanes: the primitives the templates below need from a lane type. The vector kernels specialize
// Lanes for their register wrappers.
template <typename V>
struct Lanes;

template <>
struct Lanes<double> {
  using Mask = bool;
  TORCHDEFER_HOST_DEVICE static double broadcast(double x) { return x; }
  TORCHDEFER_HOST_DEVICE static bool less(double x, double y) { return x < y; }
  TORCHDEFER_HOST_DEVICE static bool less_equal(double x, double y) { return x <= y; }
  TORCHDEFER_HOST_DEVICE static bool greater(double x, double y) { return x > y; }
  TORCHDEFER_HOST_DEVICE static bool equal(double x, double y) { return x == y; }
  TORCHDEFER_HOST_DEVICE static bool both(bool x, bool y) { return x && y; }
  TORCHDEFER_HOST_DEVICE static bool either(bool x, bool y) { return x || y; }
  TORCHDEFER_HOST_DEVICE static bool any(bool x) { return x; }
  TORCHDEFER_HOST_DEVICE static double select(bool m, double x, double y) { return m ? x : y; }
  // x rounded toward zero, exactly.
  TORCHDEFER_HOST_DEVICE static double trunc(double x) {
    return x > -0x1p52 && x < 0x1p52 ? static_cast<double>(static_cast<int64_t>(x)) : x;
  }
  // x = m·2^k with m ∈ [1, 2), for positive normal x; k as a double. Exact.
  TORCHDEFER_HOST_DEVICE static void split_exponent(double x, double* m, double* k) {
    const uint64_t bits = double_bits(x);
    *k = static_cast<double>(static_cast<int64_t>((bits >> 52) & 0x7ff) - 1023);
    *m = bits_double((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
  }
  // 2^k for an integer k in [−1022, 1023], exactly.
  TORCHDEFER_HOST_DEVICE static double pow2(double k) {
    return bits_double(static_cast<uint64_t>(static_cast<int64_t>(k) + 1023) << 52);
  }
  // Correctly rounded (IEEE) on every host and on CUDA.
  TORCHDEFER_HOST_DEVICE static double sqrt(double x) { return ::sqrt(x); }
  // x·y + z rounded once (IEEE fusedMultiplyAdd): the fma instruction where the CPU has one (the
  // C library picks it at run time), exact in software where it has not, native on CUDA.
  TORCHDEFER_HOST_DEVICE static double fma(double x, double y, double z) { return ::fma(x, y, z); }
};

template <>
struct Lanes<uint32_t> {
  TORCHDEFER_HOST_DEVICE static uint32_t broadcast(uint32_t x) { return x; }
  TORCHDEFER_HOST_DEVICE static uint32_t add(uint32_t x, uint32_t y) { return x + y; }
  TORCHDEFER_HOST_DEVICE static uint32_t xor3(uint32_t x, uint32_t y, uint32_t z) {
    return x ^ y ^ z;
  }
  // The high and low words of the 64-bit product x·m.
  TORCHDEFER_HOST_DEVICE static void multiply(uint32_t x, uint32_t m, uint32_t* hi, uint32_t* lo) {
    const uint64_t p = uint64_t{m} * x;
    *hi = static_cast<uint32_t>(p >> 32);
    *lo = static_cast<uint32_t>(p);
  }
};

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 on counter words c[0..3] (in place) with key (k0, k1).
template <typename U>
TORCHDEFER_HOST_DEVICE inline void philox_rounds(U* c, U k0, U k1) {
  using L = Lanes<U>;
  const U weyl0 = L::broadcast(kPhiloxWeyl0);
  const U weyl1 = L::broadcast(kPhiloxWeyl1);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 = L::add(k0, weyl0);
      k1 = L::add(k1, weyl1);
    }
    U hi0, lo0, hi1, lo1;
    L::multiply(c[0], kPhiloxMul0, &hi0, &lo0);
    L::multiply(c[2], kPhiloxMul1, &hi1, &lo1);
    c[0] = L::xor3(hi1, c[1], k0);
    c[1] = lo1;
    c[2] = L::xor3(hi0, c[3], k1);
    c[3] = lo0;
  }
}

// ---------------------------------------------------------------------------------------------
// Polynomials.

// c0 + t·(c1 + t·(c2 + ...)), each step one fused multiply-add, from the innermost.
template <typename V>
TORCHDEFER_HOST_DEVICE inline V horner(V, double c) {
  return Lanes<V>::broadcast(c);
}
template <typename V, typename... Rest>
TORCHDEFER_HOST_DEVICE inline V horner(V t, double c, Rest... rest) {
  return Lanes<V>::fma(t, horner<V>(t, rest...), Lanes<V>::broadcast(c));
}

// Chebyshev interpolants of the functions below, in the monomial basis around each piece's
// centre, rounded to double: scripts/counter_polynomials.py prints them and their errors.
// BEGIN generated by scripts/counter_polynomials.py
// erfinv(a)/a for w in [0, 6.25], degree 24: relative error < 1.48·2^-53.
template <typename V>
TORCHDEFER_HOST_DEVICE inline V erfinv_central(V w) {
  return horner<V>(
      w - 0x1.9000000000000p+1, 0x1.a755e7c99ae86p+0, 0x1.ebd80d9b13dfap-3, -0x1.8b6c33114ea2fp-8,
      -0x1.84576948359ddp-11, 0x1.879c2a20aeb2ep-13, -0x1.d1d1f7c9ffa6dp-17, -0x1.6e8a53c7ac2ffp-20,
      0x1.c6b4f8868f532p-22, -0x1.f36ceed4416aep-26, -0x1.1a9eb00326b9bp-28, 0x1.20f544d62fff1p-30,
      -0x1.dc3f457145cd3p-35, -0x1.c8a6afa1550f4p-37, 0x1.7236b79e1d57ep-39, -0x1.6b86f85109f07p-44,
      -0x1.6877e8ae70f27p-45, 0x1.d5e95ecc5f898p-48, -0x1.6b6b0fc6a580fp-55, -0x1.19ac650194dcap-53,
      0x1.1e1f9ee618b29p-56, 0x1.669b9213d3cdfp-61, -0x1.9a137911c05cfp-62, 0x1.79a647e43b44ep-66,
      0x1.e2aa7ddd776b6p-69, -0x1.b2643e45e1856p-72);
}

// erfinv(a)/a for s in [2.5, 4], degree 20: relative error < 1.16·2^-53.
template <typename V>
TORCHDEFER_HOST_DEVICE inline V erfinv_tail_near(V s) {
  return horner<V>(
      s - 0x1.a000000000000p+1, 0x1.8abcc380d5a48p+1, 0x1.0158a6d641d55p+0, 0x1.5ffcfe5b6cd38p-8,
      -0x1.ebadabba02be5p-9, 0x1.468eeca944c44p-9, -0x1.ba9240d8768c3p-10, 0x1.f3cc545d9ca81p-11,
      -0x1.7448bcc8e9aa7p-12, 0x1.932e8fd4360edp-16, 0x1.1e6abbe66ca02p-14, -0x1.8cf463501e9a0p-15,
      0x1.a241c6f237f34p-17, 0x1.899aa0e374402p-19, -0x1.0b79e820e8497p-18, 0x1.8db69feb41fb6p-20,
      -0x1.da75906425fdap-26, -0x1.079a074d69940p-22, 0x1.1a9484c4d3628p-23, -0x1.674f1725daa65p-26,
      -0x1.06f1da245bfd3p-26, 0x1.07e3c2020286fp-27);
}

// erfinv(a)/a for s in [4, 6.05], degree 18: relative error < 1.72·2^-53.
template <typename V>
TORCHDEFER_HOST_DEVICE inline V erfinv_tail_far(V s) {
  return horner<V>(
      s - 0x1.419999999999ap+2, 0x1.3802af1f9b6cap+2, 0x1.02a29212908c4p+0, -0x1.442542eb5cd6bp-13,
      -0x1.b344bd748e89fp-13, 0x1.349aa671483b5p-14, -0x1.3f07ce28addd5p-16, 0x1.2456dcf125c77p-18,
      -0x1.fd529dab855c0p-21, 0x1.cce887a09c166p-23, -0x1.051da3010d6e7p-24, 0x1.aff217f7c63acp-26,
      -0x1.c16746912f218p-27, 0x1.cf81631865096p-28, -0x1.a03d842a1c166p-29, 0x1.43e41ecd9511dp-30,
      -0x1.c5c1d298b9a61p-32, 0x1.46bc8ced9722ap-34, 0x1.367ae2cc88db7p-35, -0x1.379025210cfffp-36);
}

// sin(x)/x for y in [0, 0.61685], degree 6: relative error < 0.71·2^-53.
template <typename V>
TORCHDEFER_HOST_DEVICE inline V sin_over_x(V y) {
  return horner<V>(y - 0x1.3bd3cc9be45dep-2, 0x1.e6157e4bd5fe2p-1, -0x1.4aebca7d45f62p-3,
                   0x1.0b1a2a3a901ccp-7, -0x1.990586386b365p-13, 0x1.6cb6a32a1388ep-19,
                   -0x1.a950938183858p-26, 0x1.5d87699eb6a31p-33);
}

// cos(x) for y in [0, 0.61685], degree 7: relative error < 1.15·2^-53.
template <typename V>
TORCHDEFER_HOST_DEVICE inline V cos_of_root(V y) {
  return horner<V>(y - 0x1.3bd3cc9be45dep-2, 0x1.b30d40ec27890p-1, -0x1.e6157e4bd5fe2p-2,
                   0x1.4aebca7d45f61p-5, -0x1.6422e2f8c0265p-10, 0x1.990586387aa76p-16,
                   -0x1.23c54f54de877p-22, 0x1.1b8aff7a0bc9bp-29, -0x1.8f762711e61e0p-37);
}

// 2·atanh(s)/s for y in [0, 0.0294373], degree 7: relative error < 1.53·2^-53.
template <typename V>
TORCHDEFER_HOST_DEVICE inline V log_atanh_ratio(V y) {
  return horner<V>(y - 0x1.e24cc824c9a4ep-7, 0x1.0144672b1a634p+1, 0x1.5b7568b42e840p-1,
                   0x1.a6d21192a7169p-2, 0x1.3261dc1cb0433p-2, 0x1.e391d492c07d9p-3,
                   0x1.9179a9445ff5bp-3, 0x1.58d998b478d53p-3, 0x1.2f4d88c4fad06p-3);
}
// END generated by scripts/counter_polynomials.py

// ---------------------------------------------------------------------------------------------
// log, exp, sincos.

// ln x for positive normal finite x: x = m·2^k with m ∈ [√½, √2), ln x = k·ln 2 + 2·atanh(s),
// s = (m − 1)/(m + 1), |s| ≤ 0.172, 2·atanh(s) = s·r(s²) with r the polynomial above.
template <typename V>
TORCHDEFER_HOST_DEVICE TORCHDEFER_FORCE_INLINE inline V log(V x) {
  using L = Lanes<V>;
  V m, k;
  L::split_exponent(x, &m, &k);
  const auto above = L::greater(m, L::broadcast(kSqrt2));
  m = L::select(above, m * 0.5, m);
  k = L::select(above, k + 1.0, k);
  const V s = (m - 1.0) / (m + 1.0);
  return k * kLn2Hi + (k * kLn2Lo + s * log_atanh_ratio<V>(s * s));
}

// sin and cos of 2πt: 2π|t| = q·π/2 + (π/2)·f with q = ⌊4·frac|t|⌋ and f ∈ [0, 1) (both exact in
// binary), sin and cos of (π/2)·min(f, 1 − f) ∈ [0, π/4] by the polynomials above, then the
// quadrant's signs and swap, and sin(−x) = −sin x.
template <typename V>
TORCHDEFER_HOST_DEVICE TORCHDEFER_FORCE_INLINE inline void sincos_2pi(V t, V* sin, V* cos) {
  using L = Lanes<V>;
  const auto negative = L::less(t, L::broadcast(0.0));
  t = L::select(negative, -t, t);
  const V y = 4.0 * (t - L::trunc(t));
  const V q = L::trunc(y);
  const V f = y - q;
  const auto low = L::less_equal(f, L::broadcast(0.5));
  const V x = L::select(low, f * kHalfPi, (1.0 - f) * kHalfPi);
  const V x2 = x * x;
  const V pc = cos_of_root<V>(x2);
  const V xs = x * sin_over_x<V>(x2);
  // Where f > 1/2 the quarter's sine and cosine trade places.
  const V s = L::select(low, xs, pc);
  const V c = L::select(low, pc, xs);
  // Quadrant q: sin, cos = (s, c), (c, −s), (−s, −c), (−c, s).
  const auto odd = L::either(L::equal(q, L::broadcast(1.0)), L::equal(q, L::broadcast(3.0)));
  const auto sin_negative = L::greater(q, L::broadcast(1.5));
  const auto cos_negative =
      L::either(L::equal(q, L::broadcast(1.0)), L::equal(q, L::broadcast(2.0)));
  V sin_value = L::select(odd, c, s);
  V cos_value = L::select(odd, s, c);
  sin_value = L::select(sin_negative, -sin_value, sin_value);
  cos_value = L::select(cos_negative, -cos_value, cos_value);
  *sin = L::select(negative, -sin_value, sin_value);
  *cos = cos_value;
}

// Box–Muller: the standard normals r·cos 2πu2 and r·sin 2πu2, r = sqrt(−2 ln u1).
template <typename V>
TORCHDEFER_HOST_DEVICE TORCHDEFER_FORCE_INLINE inline void box_muller(V u1, V u2, V* cos_value,
                                                                      V* sin_value) {
  const V r = Lanes<V>::sqrt(-2.0 * log(u1));
  V s, c;
  sincos_2pi(u2, &s, &c);
  *cos_value = r * c;
  *sin_value = r * s;
}

// e^x for −745.13 ≤ x ≤ 709.78: x = k·ln 2 + r, |r| ≤ ½ ln 2, e^x = 2^k · e^r, e^r by its
// Taylor series to r^17.
template <typename V>
TORCHDEFER_HOST_DEVICE TORCHDEFER_FORCE_INLINE inline V exp_in_range(V x) {
  using L = Lanes<V>;
  const V kd = L::trunc(x * kInvLn2 + L::select(L::less(x, L::broadcast(0.0)), L::broadcast(-0.5),
                                                L::broadcast(0.5)));
  const V r = (x - kd * kLn2Hi) - kd * kLn2Lo;
  V p = L::broadcast(inverse_factorial(17));
  for (int n = 16; n >= 0; --n) {
    p = L::fma(r, p, L::broadcast(inverse_factorial(n)));
  }
  // 2^k in two steps so that k down to −1074 stays representable; k/2 rounds toward zero.
  const V k1 = L::trunc(kd * 0.5);
  const V k2 = kd - k1;
  return p * L::pow2(k1) * L::pow2(k2);
}

// e^x.
TORCHDEFER_HOST_DEVICE inline double exp(double x) {
  if (x > 709.78) {
    return bits_double(0x7ff0000000000000ull);
  }
  if (x < -745.13) {
    return 0.0;
  }
  return exp_in_range<double>(x);
}

// ---------------------------------------------------------------------------------------------
// erf and erfinv (Note [Counter-mode truncated normal]).

// e^(−x²), with x² split exactly into hi + lo (Veltkamp/Dekker) so that its rounding does not
// reach the result: e^(−x²) = e^(−hi)·e^(−lo) ≈ e^(−hi)·(1 − lo). For |x| < 6 (erf's range).
template <typename V>
TORCHDEFER_HOST_DEVICE inline V exp_minus_square(V x) {
  const V hi = x * x;
  const V split = 134217729.0 * x;  // 2^27 + 1
  const V x_hi = split - (split - x);
  const V x_lo = x - x_hi;
  const V lo = ((x_hi * x_hi - hi) + 2.0 * x_hi * x_lo) + x_lo * x_lo;
  return exp_in_range<V>(-hi) * (1.0 - lo);
}

// erf x for 0 ≤ x < 1.5: (2/√π)·x·e^(−x²)·Σ (2x²)^n / (2n + 1)!!, a series of positive terms
// (no cancellation), 27 terms (the tail is below 2^-56 of the sum at x = 1.5).
// `e` is exp_minus_square(x).
template <typename V>
TORCHDEFER_HOST_DEVICE inline V erf_series(V x, V e) {
  const V t = 2.0 * x * x;
  V sum = Lanes<V>::broadcast(1.0);
  for (int n = 27; n >= 1; --n) {
    sum = 1.0 + t / static_cast<double>(2 * n + 1) * sum;
  }
  return kTwoOverSqrtPi * x * e * sum;
}

// erfc x for x ≥ 1: e^(−x²)/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))), Laplace's
// continued fraction evaluated from 150 levels deep (converged to 2^-53 from x = 1.1 up).
// `e` is exp_minus_square(x).
template <typename V>
TORCHDEFER_HOST_DEVICE inline V erfc_fraction(V x, V e) {
  V k = x;
  for (int n = 150; n >= 1; --n) {
    k = x + (0.5 * n) / k;
  }
  return e / (kSqrtPi * k);
}

// The error function, from the series below 1.5 and 1 − erfc above (erf rounds to 1 from 6). Its
// cost (hundreds of divisions) is paid twice per truncated-normal op, for the bounds, never per
// element.
TORCHDEFER_HOST_DEVICE inline double erf(double x) {
  const double a = x < 0 ? -x : x;
  double r;
  if (a < 1.5) {
    r = erf_series<double>(a, exp_minus_square<double>(a));
  } else if (a < 6.0) {
    r = 1.0 - erfc_fraction<double>(a, exp_minus_square<double>(a));
  } else {
    r = a == a ? 1.0 : a;  // NaN stays NaN
  }
  return x < 0 ? -r : r;
}

// The inverse error function on [−1, 1]: ±∞ at ±1 (Note [Counter-mode truncated normal]).
// erfinv(a) = a·g(w) for 0 ≤ a < 1 with w = −ln(1 − a²), where 1 − a² is computed as
// (1 − a)(1 + a): for a ≥ ½, 1 − a is exact, so w keeps its relative precision up to
// a = 1 − 2^-53. g is one polynomial in w up to w = 6.25 (|a| < 0.99806) and, beyond, one of two
// polynomials in s = √w (s < 4, and s up to 6.05 > √(52 ln 2), the largest w a draw below 1
// gives). The polynomials are Chebyshev interpolants rounded to double, printed by
// scripts/counter_polynomials.py, which also measures their error.

// erfinv(a) for 0 ≤ a < 1 in every lane. A lane type evaluates the tail's polynomials only when
// one of its lanes needs them (rare: below a fifth of a percent of a uniform's elements), and
// each lane takes the value of its own region: the scalar definition's operations, lane by lane.
template <typename V>
TORCHDEFER_HOST_DEVICE TORCHDEFER_FORCE_INLINE inline V erfinv_magnitude(V a) {
  using L = Lanes<V>;
  const V w = -log<V>((1.0 - a) * (1.0 + a));
  V g = erfinv_central<V>(w);
  const auto tail = L::less_equal(L::broadcast(6.25), w);
  if (L::any(tail)) {
    const V s = L::sqrt(L::select(tail, w, L::broadcast(6.25)));
    V t = erfinv_tail_near<V>(s);
    const auto far = L::less_equal(L::broadcast(4.0), s);
    if (L::any(far)) {
      t = L::select(far, erfinv_tail_far<V>(s), t);
    }
    g = L::select(tail, t, g);
  }
  return a * g;
}

TORCHDEFER_HOST_DEVICE inline double erfinv(double u) {
  const double a = u < 0 ? -u : u;
  if (!(a < 1.0)) {
    return a == 1.0
               ? (u < 0 ? -bits_double(0x7ff0000000000000ull) : bits_double(0x7ff0000000000000ull))
               : bits_double(0x7ff8000000000000ull);
  }
  const double x = erfinv_magnitude<double>(a);
  return u < 0 ? -x : x;
}

// ---------------------------------------------------------------------------------------------
// Dtypes. A value is computed in double and rounded to the dtype to nearest even; float16 and
// bfloat16 through float32 (what a kernel computing in float32 gives). NaN leaves every path as
// the x86 default NaN (negative, quiet), whatever NaN the device's arithmetic made.

struct HalfBits {
  uint16_t bits;
};
struct BFloat16Bits {
  uint16_t bits;
};

TORCHDEFER_HOST_DEVICE inline double canonical(double x) {
  return x == x ? x : bits_double(0xfff8000000000000ull);
}

TORCHDEFER_HOST_DEVICE inline float to_float(double x) {
  const float f = static_cast<float>(x);
  return f == f ? f : bits_float(0xffc00000u);
}

// float32 to float16 bits, to nearest even; NaN becomes its sign and 0x7E00. Integer operations
// only, every case computed and then chosen (no branch on the value: cheap on random data).
TORCHDEFER_HOST_DEVICE inline HalfBits to_half(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t a = x & 0x7fffffffu;
  // Normal results: rebias the exponent (127 to 15), round off 13 mantissa bits.
  const uint32_t rebiased = a - 0x38000000u;
  const uint32_t normal = (rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13;
  // Below 2^-14: a multiple of 2^-24, the significand shifted right by 126 − exponent ≥ 14.
  const uint32_t significand = (a & 0x7fffffu) | 0x800000u;
  const uint32_t exponent = a >> 23;
  const uint32_t shift = exponent > 112u ? 14u : (126u - exponent > 31u ? 31u : 126u - exponent);
  const uint32_t quotient = significand >> shift;
  const uint32_t remainder = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  const uint32_t round_up = remainder > half || (remainder == half && (quotient & 1u)) ? 1u : 0u;
  const uint32_t subnormal = quotient + round_up;
  uint32_t h = a < 0x38800000u ? subnormal : normal;
  h = a >= 0x477ff000u ? 0x7c00u : h;  // 65520 and up round to infinity
  h = a > 0x7f800000u ? 0x7e00u : h;
  return {static_cast<uint16_t>(((x >> 16) & 0x8000u) | h)};
}

TORCHDEFER_HOST_DEVICE inline float half_to_float(HalfBits h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exponent = (h.bits >> 10) & 0x1fu;
  const uint32_t mantissa = h.bits & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 31) {
    return bits_float(sign | 0x7f800000u | (mantissa << 13));
  }
  return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// float32 to bfloat16 bits, to nearest even; NaN becomes 0x7FC0.
TORCHDEFER_HOST_DEVICE inline BFloat16Bits to_bfloat16(float f) {
  if (f != f) {
    return {0x7fc0u};
  }
  const uint32_t x = float_bits(f);
  return {static_cast<uint16_t>((x + ((x >> 16) & 1u) + 0x7fffu) >> 16)};
}

TORCHDEFER_HOST_DEVICE inline float bfloat16_to_float(BFloat16Bits b) {
  return bits_float(static_cast<uint32_t>(b.bits) << 16);
}

template <typename T>
TORCHDEFER_HOST_DEVICE inline T to_dtype(double value) {
  if constexpr (std::is_same_v<T, double>) {
    return canonical(value);
  } else if constexpr (std::is_same_v<T, float>) {
    return to_float(value);
  } else if constexpr (std::is_same_v<T, HalfBits>) {
    return to_half(to_float(value));
  } else if constexpr (std::is_same_v<T, BFloat16Bits>) {
    return to_bfloat16(to_float(value));
  } else if constexpr (std::is_same_v<T, bool>) {
    return value != 0.0;
  } else {
    return static_cast<T>(value);
  }
}

// Whether two values of the dtype are equal as numbers (±0 equal, NaN unequal to everything).
template <typename T>
TORCHDEFER_HOST_DEVICE inline bool same_value(T x, T y) {
  if constexpr (std::is_same_v<T, HalfBits>) {
    return half_to_float(x) == half_to_float(y);
  } else if constexpr (std::is_same_v<T, BFloat16Bits>) {
    return bfloat16_to_float(x) == bfloat16_to_float(y);
  } else {
    return x == y;
  }
}

// ---------------------------------------------------------------------------------------------
// Distributions (Note [Counter RNG]), one element at a time.

using Distribution = CounterDistribution;

// What an element's value depends on besides its index.
struct ElementParams {
  Distribution distribution = Distribution::kUniform;
  double a = 0.0;
  double b = 1.0;
  int64_t from = 0;
  uint64_t range = 0;
  double low = 0.0;     // kTruncatedNormal: the bounds,
  double high = 0.0;    //
  double u_low = 0.0;   // and erf of the standardized bounds over √2
  double u_high = 0.0;  //
  bool wide = false;    // 64 random bits per element (Note [Counter RNG])
  uint64_t seed = 0;
  uint64_t stream = 0;
};

struct Block {
  uint32_t w[4];
};

// Word i of a block, i < 4 known only at run time. CUDA keeps an array indexed at run time in
// local memory, a load per element; choosing among the four registers keeps the block in
// registers. The host indexes.
TORCHDEFER_HOST_DEVICE inline uint32_t block_word(const Block& b, uint64_t i) {
#if defined(__CUDA_ARCH__)
  return i == 0 ? b.w[0] : (i == 1 ? b.w[1] : (i == 2 ? b.w[2] : b.w[3]));
#else
  return b.w[i];
#endif
}

// Philox block b of an op with `seed` and `stream`.
TORCHDEFER_HOST_DEVICE inline Block philox_block(uint64_t seed, uint64_t stream, uint64_t b) {
  Block c{{static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), static_cast<uint32_t>(stream),
           static_cast<uint32_t>(stream >> 32)}};
  philox_rounds<uint32_t>(c.w, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return c;
}

// The random words of one op, one Philox block at a time, and the last Box–Muller pair, whose
// two elements share it: a caller walking consecutive elements computes each once.
class Draws {
 public:
  TORCHDEFER_HOST_DEVICE explicit Draws(const ElementParams& p)
      : seed_(p.seed), stream_(p.stream) {}

  TORCHDEFER_HOST_DEVICE const Block& block(uint64_t b) {
    if (!block_valid_ || b != block_index_) {
      block_ = philox_block(seed_, stream_, b);
      block_index_ = b;
      block_valid_ = true;
    }
    return block_;
  }

  // The 32-bit word of element e.
  TORCHDEFER_HOST_DEVICE uint32_t word32(uint64_t e) { return block_word(block(e / 4), e % 4); }

  // The 64-bit draw of element e: words 2(e % 2) and 2(e % 2) + 1 of block e / 2, the odd high.
  TORCHDEFER_HOST_DEVICE uint64_t word64(uint64_t e) {
    const Block& w = block(e / 2);
    const int half = static_cast<int>(e % 2);
    return (uint64_t{block_word(w, 2 * half + 1)} << 32) | block_word(w, 2 * half);
  }

  // A standard normal for element e (Box–Muller on its pair).
  TORCHDEFER_HOST_DEVICE double standard_normal(uint64_t e, bool wide) {
    if (!pair_valid_ || pair_index_ != e / 2) {
      double u1, u2;
      if (wide) {
        const Block& w = block(e / 2);
        u1 = static_cast<double>((((uint64_t{w.w[1]} << 32) | w.w[0]) >> 11) + 1) * 0x1p-53;
        u2 = static_cast<double>(((uint64_t{w.w[3]} << 32) | w.w[2]) >> 11) * 0x1p-53;
      } else {
        const Block& w = block(e / 4);
        const int half = static_cast<int>(e % 4) / 2;
        u1 = (static_cast<double>(block_word(w, 2 * half)) + 1.0) / kTwoPow32;
        u2 = static_cast<double>(block_word(w, 2 * half + 1)) / kTwoPow32;
      }
      box_muller<double>(u1, u2, &pair_cos_, &pair_sin_);
      pair_index_ = e / 2;
      pair_valid_ = true;
    }
    return e % 2 == 1 ? pair_sin_ : pair_cos_;
  }

  // A uniform in [0, 1): 24 bits (32-bit draws) or 53 (64-bit draws).
  TORCHDEFER_HOST_DEVICE double unit(uint64_t e, bool wide) {
    return wide ? static_cast<double>(word64(e) >> 11) * 0x1p-53
                : static_cast<double>(word32(e) >> 8) * 0x1p-24;
  }

  // A uniform in (0, 1], for logarithms.
  TORCHDEFER_HOST_DEVICE double open_unit(uint64_t e, bool wide) {
    return wide ? static_cast<double>((word64(e) >> 11) + 1) * 0x1p-53
                : (static_cast<double>(word32(e)) + 1.0) / kTwoPow32;
  }

 private:
  uint64_t seed_;
  uint64_t stream_;
  Block block_{};
  uint64_t block_index_ = 0;
  bool block_valid_ = false;
  double pair_cos_ = 0;
  double pair_sin_ = 0;
  uint64_t pair_index_ = 0;
  bool pair_valid_ = false;
};

// random_()'s range for a dtype without bounds: every integer the dtype holds exactly from 0
// (its mantissa's range for floating dtypes), or 0..max for integers.
template <typename T>
TORCHDEFER_HOST_DEVICE inline uint64_t default_random_range() {
  if constexpr (std::is_same_v<T, bool>) {
    return 2;
  } else if constexpr (std::is_same_v<T, double>) {
    return (uint64_t{1} << 53) + 1;
  } else if constexpr (std::is_same_v<T, float>) {
    return (uint64_t{1} << 24) + 1;
  } else if constexpr (std::is_same_v<T, HalfBits>) {
    return (uint64_t{1} << 11) + 1;
  } else if constexpr (std::is_same_v<T, BFloat16Bits>) {
    return (uint64_t{1} << 8) + 1;
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    return uint64_t{0xff} + 1;
  } else if constexpr (std::is_same_v<T, int8_t>) {
    return uint64_t{0x7f} + 1;
  } else if constexpr (std::is_same_v<T, int16_t>) {
    return uint64_t{0x7fff} + 1;
  } else if constexpr (std::is_same_v<T, int32_t>) {
    return uint64_t{0x7fffffff} + 1;
  } else {
    return uint64_t{0x7fffffffffffffff} + 1;
  }
}

// Whether elements of this distribution and dtype take 64 random bits.
template <typename T>
TORCHDEFER_HOST_DEVICE inline bool uses_64_bits(Distribution d, uint64_t range) {
  switch (d) {
    case Distribution::kRandom:
      return range == 0 ? (std::is_same_v<T, int64_t> || std::is_same_v<T, double>)
                        : range > (uint64_t{1} << 32);
    case Distribution::kBernoulli:
      return false;
    default:
      return std::is_same_v<T, double>;
  }
}

// Completes `p` for dtype T: its bit width and the truncated normal's uniform bounds.
template <typename T>
TORCHDEFER_HOST_DEVICE inline ElementParams for_dtype(ElementParams p) {
  p.wide = uses_64_bits<T>(p.distribution, p.range);
  if (p.distribution == Distribution::kTruncatedNormal) {
    p.u_low = erf((p.low - p.a) / p.b / kSqrt2);
    p.u_high = erf((p.high - p.a) / p.b / kSqrt2);
  }
  return p;
}

// The truncated normal in two halves, around erfinv (which the vector kernels compute for many
// elements at once): the uniform u of element e, and the value from erfinv(u).
TORCHDEFER_HOST_DEVICE inline double truncated_normal_uniform(const ElementParams& p, Draws& draws,
                                                              uint64_t e) {
  return p.u_low + (p.u_high - p.u_low) * draws.unit(e, p.wide);
}

template <typename T>
TORCHDEFER_HOST_DEVICE inline T truncated_normal_value(const ElementParams& p, double erfinv_u) {
  const double x = p.a + p.b * (kSqrt2 * erfinv_u);
  return to_dtype<T>(x < p.low ? p.low : (x > p.high ? p.high : x));
}

// The value of element e of an op's output in dtype T.
template <typename T>
TORCHDEFER_HOST_DEVICE inline T element(const ElementParams& p, Draws& draws, uint64_t e) {
  const bool wide = p.wide;
  switch (p.distribution) {
    case Distribution::kUniform: {
      const T value = to_dtype<T>(p.a + (p.b - p.a) * draws.unit(e, wide));
      return same_value(value, to_dtype<T>(p.b)) ? to_dtype<T>(p.a) : value;
    }
    case Distribution::kNormal:
      return to_dtype<T>(p.a + p.b * draws.standard_normal(e, wide));
    case Distribution::kLogNormal:
      return to_dtype<T>(exp(p.a + p.b * draws.standard_normal(e, wide)));
    case Distribution::kBernoulli:
      // The dtype's 1 and 0 are constants: a select, not a rounding per element.
      return static_cast<double>(draws.word32(e)) / kTwoPow32 < p.a ? to_dtype<T>(1.0)
                                                                    : to_dtype<T>(0.0);
    case Distribution::kRandom: {
      const uint64_t range = p.range == 0 ? default_random_range<T>() : p.range;
      const uint64_t draw = wide ? draws.word64(e) : draws.word32(e);
      const int64_t value = p.from + static_cast<int64_t>(draw % range);
      if constexpr (std::is_integral_v<T>) {
        return static_cast<T>(value);
      } else {
        return to_dtype<T>(static_cast<double>(value));
      }
    }
    case Distribution::kExponential:
      return to_dtype<T>(-log<double>(draws.open_unit(e, wide)) / p.a);
    case Distribution::kCauchy: {
      double s, c;
      sincos_2pi<double>((draws.unit(e, wide) - 0.5) * 0.5, &s, &c);
      return to_dtype<T>(p.a + p.b * (s / c));
    }
    case Distribution::kGeometric: {
      const double trials = log<double>(draws.open_unit(e, wide)) / log<double>(1.0 - p.a);
      const double k = static_cast<double>(static_cast<int64_t>(trials));
      const double ceiling = k < trials ? k + 1.0 : k;
      return to_dtype<T>(1.0 < ceiling ? ceiling : 1.0);
    }
    case Distribution::kTruncatedNormal:
      return truncated_normal_value<T>(p, erfinv(truncated_normal_uniform(p, draws, e)));
  }
  return T();
}

}  // namespace TORCHDEFER_COUNTER_ISA
}  // namespace torchdefer::counter_math
