// Constants of torchdefer's deterministic math (Note [Counter RNG]), shared by the scalar
// definition and the vector kernels, which must compute the same bits. Plain constexpr values,
// no code (see counter_rng_simd.h for why).
#pragma once

#include <cstdint>

namespace torchdefer::counter_math_constants {

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
constexpr double kTwoPow32 = 4294967296.0;

// 1/n! for n = 0..20, exact to double rounding.
constexpr double kInverseFactorial[21] = {
    1.0,
    1.0,
    1.0 / 2.0,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
    1.0 / 40320.0,
    1.0 / 362880.0,
    1.0 / 3628800.0,
    1.0 / 39916800.0,
    1.0 / 479001600.0,
    1.0 / 6227020800.0,
    1.0 / 87178291200.0,
    1.0 / 1307674368000.0,
    1.0 / 20922789888000.0,
    1.0 / 355687428096000.0,
    1.0 / 6402373705728000.0,
    1.0 / 121645100408832000.0,
    1.0 / 2432902008176640000.0,
};

}  // namespace torchdefer::counter_math_constants
