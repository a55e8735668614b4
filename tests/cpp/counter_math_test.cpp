// counter_math.h, the per-element math the CPU fill and the CUDA kernel share: the erf and erfinv
// of counter-mode trunc_normal_ against the C library and ATen, and the float16 and bfloat16
// rounding against c10's. (Philox, log, exp and sincos are checked through the public API in
// counter_rng_test.cpp.)
#include "replay/src/counter_math.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace torchdefer {
namespace {

namespace math = counter_math;

// Distance between two doubles in units in the last place of the reference.
double ulps(double value, double reference) {
  if (value == reference) {
    return 0.0;
  }
  const double ulp = std::nextafter(std::abs(reference), std::numeric_limits<double>::infinity()) -
                     std::abs(reference);
  return std::abs(value - reference) / ulp;
}

TEST(CounterMath, ErfIsWithinFiveUlpsOfTheCLibrary) {
  double worst = 0;
  for (double x = 1e-300; x < 7.0; x = x < 1e-3 ? x * 1.9 : x + 0.000317) {
    worst = std::max({worst, ulps(math::erf(x), std::erf(x)), ulps(math::erf(-x), std::erf(-x))});
  }
  EXPECT_LE(worst, 5.0);
  EXPECT_EQ(math::erf(0.0), 0.0);
  EXPECT_EQ(math::erf(30.0), 1.0);
  EXPECT_EQ(math::erf(-std::numeric_limits<double>::infinity()), -1.0);
}

TEST(CounterMath, ErfinvIsWithinFourUlpsOfATen) {
  std::vector<double> u;
  for (double x = -1.0 + 0x1p-40; x < 1.0; x += 0.0001373) {
    u.push_back(x);
  }
  for (double tail = 0x1p-53; tail < 0.1; tail *= 1.7) {
    u.push_back(1.0 - tail);
    u.push_back(tail - 1.0);
    u.push_back(tail);
  }
  const at::Tensor reference = torch::tensor(u, at::kDouble).erfinv();
  double worst = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    worst = std::max(worst, ulps(math::erfinv(u[i]), reference[i].item<double>()));
  }
  // Against mpmath on a grid like this one, 2.1 ulp at most.
  EXPECT_LE(worst, 4.0);
  EXPECT_EQ(math::erfinv(1.0), std::numeric_limits<double>::infinity());
  EXPECT_EQ(math::erfinv(-1.0), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(math::erfinv(1.5)));
  for (const double x : {-0.9, -0.3, 0.0, 0.7, 0.95}) {
    // erf's own error (5 ulp) dominates the round trip.
    EXPECT_NEAR(math::erf(math::erfinv(x)), x, 8e-16) << x;
  }
}

// The device code's conversions (counter_math.h, shared with the CUDA kernel) against c10's, on a
// sweep of every exponent and many mantissas, NaN and infinities included.
TEST(CounterMath, HalfAndBFloat16RoundingMatchesC10) {
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 9973) {
    float f;
    const auto word = static_cast<uint32_t>(bits);
    std::memcpy(&f, &word, sizeof(f));
    const c10::Half half(f);
    const c10::BFloat16 bfloat(f);
    ASSERT_EQ(math::to_half(f).bits, half.x) << f;
    ASSERT_EQ(math::to_bfloat16(f).bits, bfloat.x) << f;
    const float back = math::half_to_float(math::to_half(f));
    ASSERT_TRUE(back == static_cast<float>(half) || (std::isnan(back) && std::isnan(f))) << f;
  }
}

}  // namespace
}  // namespace torchdefer
