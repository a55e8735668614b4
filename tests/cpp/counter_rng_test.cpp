// The counter RNG: Philox known answers, its own math, its distributions, and the property that
// makes sharding work: any region of an op's output is generated on its own with the full
// tensor's bits.
#include <torchdefer/counter_rng.h>
#include <torchdefer/extension.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/cpp/test_util.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace torchdefer {
namespace {

using testing::bitwise_equal;

using Distribution = CounterDistribution;

at::Tensor filled(std::vector<int64_t> sizes, c10::ScalarType dtype, CounterDistributionParams p,
                  uint64_t seed = 7, uint64_t stream = 3) {
  at::Tensor out = torch::empty(sizes, dtype);
  counter_fill(out, p, seed, stream);
  return out;
}

// Kolmogorov–Smirnov distance between a sample and a continuous CDF.
template <typename Cdf>
double ks_distance(const at::Tensor& sample, Cdf cdf) {
  std::vector<double> x(sample.numel());
  const at::Tensor d = sample.to(at::kDouble).contiguous();
  std::memcpy(x.data(), d.data_ptr<double>(), x.size() * sizeof(double));
  std::sort(x.begin(), x.end());
  double worst = 0;
  const double n = static_cast<double>(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double f = cdf(x[i]);
    worst = std::max({worst, std::abs(f - i / n), std::abs((i + 1) / n - f)});
  }
  return worst;
}

TEST(Philox, MatchesTheRandom123KnownAnswers) {
  using Words = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (Words{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(
      philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
      (Words{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(
      philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
      (Words{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(CounterRng, FirstUniformsAreTheKnownAnswerBlockScaled) {
  // Seed 0, stream 0, block 0 is the all-zero known-answer block.
  const at::Tensor u = filled({4}, at::kFloat, {Distribution::kUniform, 0, 1}, 0, 0);
  const uint32_t words[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(u[i].item<float>(), static_cast<float>(words[i] >> 8) * 0x1p-24f) << i;
  }
}

// Note [Counter RNG]'s float32 uniform, written out from philox4x32_10 alone.
float reference_uniform(uint64_t seed, uint64_t stream, uint64_t e, double from, double to) {
  const uint64_t block = e / 4;
  const std::array<uint32_t, 4> words =
      philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                     static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                    {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const double u = static_cast<double>(words[e % 4] >> 8) * 0x1p-24;
  const float value = static_cast<float>(from + (to - from) * u);
  return value == static_cast<float>(to) ? static_cast<float>(from) : value;
}

TEST(CounterRng, Float32UniformMatchesTheNoteElementByElement) {
  // Regions that start and end mid-block and mid-group exercise every path of the fill.
  const int64_t length = 1000;
  for (const int64_t start : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{4}, int64_t{31},
                              int64_t{33}, int64_t{(int64_t{1} << 32) + 5}}) {
    const std::vector<int64_t> global = {start + length};
    at::Tensor part = torch::empty({length});
    counter_fill(part, {Distribution::kUniform, -0.3, 0.7}, 0x1234567890abcdefull, 77,
                 {global, std::vector<int64_t>{start}});
    const float* values = part.data_ptr<float>();
    for (int64_t i = 0; i < length; ++i) {
      ASSERT_EQ(values[i], reference_uniform(0x1234567890abcdefull, 77,
                                             static_cast<uint64_t>(start + i), -0.3, 0.7))
          << "element " << start + i;
    }
  }
}

// Note [Counter RNG] for element e of a uniform, normal, log-normal, Cauchy, geometric,
// random (its range resolved), bernoulli, exponential or truncated normal op, written out
// from philox4x32_10 and counter_math alone: the value in double, before rounding to the dtype.
double reference_double(const CounterDistributionParams& p, bool wide, uint64_t seed,
                        uint64_t stream, uint64_t e) {
  const auto block = [&](uint64_t b) {
    return philox4x32_10({static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32),
                          static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                         {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  };
  const auto draw64 = [](const std::array<uint32_t, 4>& w, uint64_t half) {
    return (uint64_t{w[2 * half + 1]} << 32) | w[2 * half];
  };
  const double two_pow_32 = 4294967296.0;
  switch (p.distribution) {
    case Distribution::kUniform: {
      const double u = wide ? static_cast<double>(draw64(block(e / 2), e % 2) >> 11) * 0x1p-53
                            : static_cast<double>(block(e / 4)[e % 4] >> 8) * 0x1p-24;
      return p.a + (p.b - p.a) * u;
    }
    case Distribution::kNormal: {
      double u1, u2;
      if (wide) {
        const auto w = block(e / 2);
        u1 = static_cast<double>((draw64(w, 0) >> 11) + 1) * 0x1p-53;
        u2 = static_cast<double>(draw64(w, 1) >> 11) * 0x1p-53;
      } else {
        const auto w = block(e / 4);
        const uint64_t half = (e % 4) / 2;
        u1 = (static_cast<double>(w[2 * half]) + 1.0) / two_pow_32;
        u2 = static_cast<double>(w[2 * half + 1]) / two_pow_32;
      }
      const double r = std::sqrt(-2.0 * counter_math::log(u1));
      double s, c;
      counter_math::sincos_2pi(u2, &s, &c);
      return p.a + p.b * (e % 2 == 1 ? r * s : r * c);
    }
    case Distribution::kLogNormal: {
      CounterDistributionParams normal = p;
      normal.distribution = Distribution::kNormal;
      return counter_math::exp(reference_double(normal, wide, seed, stream, e));
    }
    case Distribution::kCauchy: {
      const double u = wide ? static_cast<double>(draw64(block(e / 2), e % 2) >> 11) * 0x1p-53
                            : static_cast<double>(block(e / 4)[e % 4] >> 8) * 0x1p-24;
      double s, c;
      counter_math::sincos_2pi((u - 0.5) * 0.5, &s, &c);
      return p.a + p.b * (s / c);
    }
    case Distribution::kGeometric: {
      const double u = wide ? static_cast<double>((draw64(block(e / 2), e % 2) >> 11) + 1) * 0x1p-53
                            : (static_cast<double>(block(e / 4)[e % 4]) + 1.0) / two_pow_32;
      const double ceiling = std::ceil(counter_math::log(u) / counter_math::log(1.0 - p.a));
      return ceiling > 1.0 ? ceiling : 1.0;
    }
    case Distribution::kRandom: {
      const uint64_t draw = wide ? draw64(block(e / 2), e % 2) : block(e / 4)[e % 4];
      return static_cast<double>(p.from + static_cast<int64_t>(draw % p.range));
    }
    case Distribution::kBernoulli:
      return static_cast<double>(block(e / 4)[e % 4]) / two_pow_32 < p.a ? 1.0 : 0.0;
    case Distribution::kExponential: {
      const double u = wide ? static_cast<double>((draw64(block(e / 2), e % 2) >> 11) + 1) * 0x1p-53
                            : (static_cast<double>(block(e / 4)[e % 4]) + 1.0) / two_pow_32;
      return -counter_math::log(u) / p.a;
    }
    case Distribution::kTruncatedNormal: {
      const double sqrt2 = 1.41421356237309504880;
      const double u_low = counter_math::erf((p.low - p.a) / p.b / sqrt2);
      const double u_high = counter_math::erf((p.high - p.a) / p.b / sqrt2);
      const double unit = wide ? static_cast<double>(draw64(block(e / 2), e % 2) >> 11) * 0x1p-53
                               : static_cast<double>(block(e / 4)[e % 4] >> 8) * 0x1p-24;
      const double x = p.a + p.b * (sqrt2 * counter_math::erfinv(u_low + (u_high - u_low) * unit));
      return x < p.low ? p.low : (x > p.high ? p.high : x);
    }
    default:
      ADD_FAILURE() << "no reference for distribution " << static_cast<int>(p.distribution);
      return 0;
  }
}

// A double rounded to the dtype as the note says: float16 and bfloat16 through float32.
template <typename T>
T round_to(double value) {
  if constexpr (std::is_same_v<T, double>) {
    return value;
  } else {
    return T(static_cast<float>(value));
  }
}

template <typename T>
T reference_element(const CounterDistributionParams& p, uint64_t seed, uint64_t stream,
                    uint64_t e) {
  if (p.distribution == Distribution::kRandom) {
    // The dtype's default range: every integer it holds exactly from 0 (Note [Counter RNG]).
    CounterDistributionParams random = p;
    if (random.range == 0) {
      random.range = (uint64_t{1} << (std::is_same_v<T, double>          ? 53
                                      : std::is_same_v<T, float>         ? 24
                                      : std::is_same_v<T, c10::BFloat16> ? 8
                                                                         : 11)) +
                     1;
    }
    return round_to<T>(
        reference_double(random, random.range > (uint64_t{1} << 32), seed, stream, e));
  }
  const bool wide = std::is_same_v<T, double> && p.distribution != Distribution::kBernoulli;
  const T value = round_to<T>(reference_double(p, wide, seed, stream, e));
  if (p.distribution == Distribution::kUniform &&
      static_cast<double>(value) == static_cast<double>(round_to<T>(p.b))) {
    return round_to<T>(p.a);
  }
  return value;
}

// Fills `sizes` at `start` of a `global`-shaped op output and compares every element's bits with
// the reference.
template <typename T>
void expect_region_matches_reference(const CounterDistributionParams& p,
                                     const std::vector<int64_t>& global,
                                     const std::vector<int64_t>& start,
                                     const std::vector<int64_t>& sizes) {
  const uint64_t seed = 0x9e3779b97f4a7c15ull;
  const uint64_t stream = (uint64_t{5} << 32) | 11;
  at::Tensor part = torch::empty(sizes, c10::CppTypeToScalarType<T>::value);
  counter_fill(part, p, seed, stream, {global, start});
  const T* values = part.data_ptr<T>();
  const int64_t columns = sizes.size() == 2 ? sizes[1] : sizes[0];
  const int64_t rows = sizes.size() == 2 ? sizes[0] : 1;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < columns; ++j) {
      const int64_t e =
          sizes.size() == 2 ? (start[0] + i) * global[1] + start[1] + j : start[0] + j;
      const T expected = reference_element<T>(p, seed, stream, static_cast<uint64_t>(e));
      const T actual = values[i * columns + j];
      ASSERT_EQ(std::memcmp(&actual, &expected, sizeof(T)), 0)
          << "distribution " << static_cast<int>(p.distribution) << ", "
          << c10::CppTypeToScalarType<T>::value << ", element " << e << ": "
          << static_cast<double>(actual) << " instead of " << static_cast<double>(expected);
    }
  }
}

// trunc_normal_(mean, std, low, high).
CounterDistributionParams truncated_normal(double mean, double std, double low, double high) {
  CounterDistributionParams p{Distribution::kTruncatedNormal, mean, std};
  p.low = low;
  p.high = high;
  return p;
}

CounterDistributionParams random_params(int64_t from, uint64_t range) {
  CounterDistributionParams p{Distribution::kRandom};
  p.from = from;
  p.range = range;
  return p;
}

template <typename T>
void expect_every_path_matches_reference() {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<CounterDistributionParams> distributions = {
      {Distribution::kUniform, -0.3, 0.7},
      {Distribution::kUniform, 0.0, 1.0},
      {Distribution::kUniform, -inf, inf},  // NaN everywhere: checks NaN's bits in each dtype
      {Distribution::kNormal, 0.5, 2.0},
      {Distribution::kBernoulli, 0.3},
      {Distribution::kExponential, 1.5},
      {Distribution::kLogNormal, 0.1, 0.5},
      {Distribution::kLogNormal, 300.0, 200.0},  // e^x beyond both ends of its range
      {Distribution::kCauchy, 0.5, 2.0},
      {Distribution::kGeometric, 0.25},
      {Distribution::kGeometric, 1e-9},  // trials in the billions
      random_params(-7, 1000),
      random_params(0, 0),  // the dtype's default range (64-bit draws for float64)
      random_params(int64_t{1} << 40, (uint64_t{1} << 32) - 5),
      // ±2σ: a twentieth of the elements in erfinv's tail region; bounds far out: u ∈ [−1, 1),
      // a tenth in the tail, and u = −1 (erfinv −∞, clamped) where the draw is 0.
      truncated_normal(0.0, 0.02, -0.04, 0.04),
      truncated_normal(0.5, 2.0, -1e6, 1e6)};
  // Starts and lengths that begin and end mid-block and mid-group (a vector group is up to 256
  // elements, in four sets of 16 blocks), and block counters whose low word wraps around inside
  // each set of a group (32- and 64-bit draws).
  std::vector<int64_t> starts = {0, 1, 2, 3, 5, 31, 33, 63, 65, 127, 129, 255, 257};
  for (const int64_t blocks_before_wrap : {9, 20, 40, 60}) {
    starts.push_back((int64_t{1} << 33) - 2 * blocks_before_wrap - 1);
    starts.push_back((int64_t{1} << 34) - 4 * blocks_before_wrap - 1);
  }
  const std::vector<int64_t> lengths = {1, 7, 64, 130, 300, 1000};
  for (const CounterDistributionParams& p : distributions) {
    for (const int64_t start : starts) {
      for (const int64_t length : lengths) {
        expect_region_matches_reference<T>(p, {start + length + 3}, {start}, {length});
      }
    }
    // Rows of a 2-D region: every row starts at its own offset.
    expect_region_matches_reference<T>(p, {5, 300}, {1, 7}, {3, 250});
  }
}

TEST(CounterRng, EveryFloat32PathMatchesTheNoteElementByElement) {
  expect_every_path_matches_reference<float>();
}

TEST(CounterRng, EveryFloat64PathMatchesTheNoteElementByElement) {
  expect_every_path_matches_reference<double>();
}

TEST(CounterRng, EveryFloat16PathMatchesTheNoteElementByElement) {
  expect_every_path_matches_reference<c10::Half>();
}

TEST(CounterRng, EveryBFloat16PathMatchesTheNoteElementByElement) {
  expect_every_path_matches_reference<c10::BFloat16>();
}

TEST(CounterMath, AgreesWithTheCLibraryToAFewUlps) {
  for (double x = 1e-300; x < 1e300; x *= 1.37) {
    EXPECT_NEAR(counter_math::log(x), std::log(x), 4e-16 * std::max(1.0, std::abs(std::log(x))))
        << x;
  }
  for (double x = 0x1p-53; x <= 1.0; x += 0.000731) {
    EXPECT_NEAR(counter_math::log(x), std::log(x), 1e-15) << x;
  }
  for (double x = -700; x < 700; x += 0.613) {
    EXPECT_NEAR(counter_math::exp(x), std::exp(x), 4e-16 * std::exp(x)) << x;
  }
  for (double t = -1.0; t < 1.0; t += 0.000377) {
    double s, c;
    counter_math::sincos_2pi(t, &s, &c);
    EXPECT_NEAR(s, std::sin(2 * M_PI * t), 2e-15) << t;
    EXPECT_NEAR(c, std::cos(2 * M_PI * t), 2e-15) << t;
  }
}

TEST(CounterRng, IsAPureFunctionOfSeedStreamAndElement) {
  const CounterDistributionParams normal{Distribution::kNormal, 0, 1};
  EXPECT_TRUE(bitwise_equal(filled({1000}, at::kFloat, normal, 1, 2),
                            filled({1000}, at::kFloat, normal, 1, 2)));
  EXPECT_FALSE(torch::equal(filled({1000}, at::kFloat, normal, 1, 2),
                            filled({1000}, at::kFloat, normal, 1, 3)));
  EXPECT_FALSE(torch::equal(filled({1000}, at::kFloat, normal, 1, 2),
                            filled({1000}, at::kFloat, normal, 2, 2)));
}

TEST(CounterRng, StreamsAreUncorrelated) {
  const CounterDistributionParams normal{Distribution::kNormal, 0, 1};
  const at::Tensor a = filled({200000}, at::kDouble, normal, 11, 0);
  for (uint64_t stream : {uint64_t{1}, uint64_t{2}, uint64_t{1000}, uint64_t{1} << 40}) {
    const at::Tensor b = filled({200000}, at::kDouble, normal, 11, stream);
    const double correlation = (a * b).mean().item<double>();
    EXPECT_LT(std::abs(correlation), 0.01) << "stream " << stream;
  }
}

TEST(CounterRng, AnyRegionIsTheSameSliceOfTheWholeTensor) {
  const std::vector<int64_t> global = {37, 53};
  for (const auto& [distribution, dtype] : std::vector<std::pair<Distribution, c10::ScalarType>>{
           {Distribution::kUniform, at::kFloat},
           {Distribution::kNormal, at::kFloat},
           {Distribution::kNormal, at::kDouble},
           {Distribution::kNormal, at::kBFloat16},
           {Distribution::kRandom, at::kLong},
           {Distribution::kBernoulli, at::kHalf}}) {
    CounterDistributionParams params{distribution, 0.5, 2.0};
    params.range = 1000;
    const at::Tensor whole = filled(global, dtype, params);
    for (const auto& [start, size] :
         std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{{{0, 0}, {37, 53}},
                                                                            {{5, 0}, {10, 53}},
                                                                            {{0, 17}, {37, 9}},
                                                                            {{36, 52}, {1, 1}},
                                                                            {{3, 1}, {7, 51}},
                                                                            {{20, 10}, {0, 5}}}) {
      at::Tensor part = torch::empty(size, dtype);
      counter_fill(part, params, 7, 3, {global, start});
      const at::Tensor expected = whole.narrow(0, start[0], size[0]).narrow(1, start[1], size[1]);
      EXPECT_TRUE(bitwise_equal(part, expected)) << static_cast<int>(distribution) << " " << dtype
                                                 << " region at " << start[0] << "," << start[1];
    }
  }
}

TEST(CounterRng, FillsNonContiguousOutputsByTheirOwnRowMajorIndex) {
  const CounterDistributionParams uniform{Distribution::kUniform, -1, 1};
  const at::Tensor contiguous = filled({6, 9}, at::kFloat, uniform);
  at::Tensor storage = torch::empty({9, 6});
  at::Tensor transposed = storage.t();
  counter_fill(transposed, uniform, 7, 3);
  EXPECT_TRUE(bitwise_equal(transposed, contiguous));
}

// Note [Merged rows]: a conv-shaped weight, whole or a dim-0 shard of it, has the bits of the
// same elements filled as one flat row.
TEST(CounterRng, ShortRowsGiveTheBitsOfOneLongRow) {
  for (const auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    for (const auto distribution : {Distribution::kUniform, Distribution::kNormal}) {
      const CounterDistributionParams params{distribution, -0.5, 2.0};
      const at::Tensor flat = filled({5 * 7 * 3 * 3}, dtype, params);
      const at::Tensor conv = filled({5, 7, 3, 3}, dtype, params);
      EXPECT_TRUE(bitwise_equal(conv.reshape(-1), flat)) << dtype;
      at::Tensor shard = torch::empty({2, 7, 3, 3}, dtype);
      counter_fill(shard, params, 7, 3, {{5, 7, 3, 3}, {3, 0, 0, 0}});
      EXPECT_TRUE(bitwise_equal(shard.reshape(-1), flat.narrow(0, 3 * 63, 2 * 63))) << dtype;
    }
  }
}

TEST(CounterRng, RefusesARegionThatDoesNotFitItsOutput) {
  const CounterDistributionParams uniform{Distribution::kUniform, 0, 1};
  at::Tensor out = torch::empty({4, 4});
  EXPECT_THAT(testing::error_of([&] {
                counter_fill(out, uniform, 7, 3, {{4, 4}, {2, 0}});
              }),
              ::testing::HasSubstr("does not fit in the global shape"));
  EXPECT_THAT(testing::error_of([&] {
                counter_fill(out, uniform, 7, 3, {{4, 4}, {0}});
              }),
              ::testing::HasSubstr("one start per dimension"));
  EXPECT_THAT(testing::error_of([&] {
                counter_fill(out, uniform, 7, 3, {{16}, {}});
              }),
              ::testing::HasSubstr("give the op's whole output shape"));
}

TEST(CounterRng, UniformFollowsItsDistributionInEveryFloatingDtype) {
  for (c10::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    const at::Tensor u = filled({200000}, dtype, {Distribution::kUniform, -2, 3});
    EXPECT_GE(u.min().item<double>(), -2.0) << dtype;
    EXPECT_LT(u.max().item<double>(), 3.0) << dtype;
    EXPECT_NEAR(u.to(at::kDouble).mean().item<double>(), 0.5, 0.02) << dtype;
    EXPECT_NEAR(u.to(at::kDouble).var().item<double>(), 25.0 / 12.0, 0.05) << dtype;
    if (dtype == at::kFloat || dtype == at::kDouble) {
      EXPECT_LT(ks_distance(u, [](double x) { return (x + 2) / 5; }), 0.005) << dtype;
    }
  }
}

TEST(CounterRng, NormalFollowsItsDistributionInEveryFloatingDtype) {
  for (c10::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    const at::Tensor z = filled({200001}, dtype, {Distribution::kNormal, 1.5, 2.0});
    EXPECT_NEAR(z.to(at::kDouble).mean().item<double>(), 1.5, 0.02) << dtype;
    EXPECT_NEAR(z.to(at::kDouble).std().item<double>(), 2.0, 0.02) << dtype;
    if (dtype == at::kFloat || dtype == at::kDouble) {
      const double d = ks_distance(
          z, [](double x) { return 0.5 * std::erfc(-(x - 1.5) / (2.0 * std::sqrt(2.0))); });
      EXPECT_LT(d, 0.005) << dtype;
    }
  }
}

TEST(CounterRng, OtherDistributionsHaveTheirMoments) {
  const int64_t n = 200000;
  const at::Tensor bernoulli = filled({n}, at::kFloat, {Distribution::kBernoulli, 0.3});
  EXPECT_NEAR(bernoulli.mean().item<double>(), 0.3, 0.005);
  EXPECT_TRUE(torch::all((bernoulli == 0) | (bernoulli == 1)).item<bool>());

  CounterDistributionParams random{Distribution::kRandom};
  random.from = -5;
  random.range = 10;
  const at::Tensor ints = filled({n}, at::kInt, random);
  EXPECT_EQ(ints.min().item<int>(), -5);
  EXPECT_EQ(ints.max().item<int>(), 4);
  EXPECT_NEAR(ints.to(at::kDouble).mean().item<double>(), -0.5, 0.03);
  random.from = 0;
  random.range = uint64_t{1} << 40;  // 64-bit draws
  const at::Tensor wide = filled({n}, at::kLong, random);
  EXPECT_GE(wide.min().item<int64_t>(), 0);
  EXPECT_LT(wide.max().item<int64_t>(), int64_t{1} << 40);
  EXPECT_GT(wide.max().item<int64_t>(), int64_t{1} << 39);
  const at::Tensor default_range = filled({n}, at::kFloat, {Distribution::kRandom});
  EXPECT_LE(default_range.max().item<double>(), 16777216.0);
  EXPECT_EQ(torch::floor(default_range).equal(default_range), true);

  const at::Tensor exponential = filled({n}, at::kDouble, {Distribution::kExponential, 2.0});
  EXPECT_NEAR(exponential.mean().item<double>(), 0.5, 0.01);
  EXPECT_GT(exponential.min().item<double>(), 0.0);

  const at::Tensor log_normal = filled({n}, at::kDouble, {Distribution::kLogNormal, 0.5, 0.25});
  EXPECT_NEAR(log_normal.log().mean().item<double>(), 0.5, 0.005);
  EXPECT_NEAR(log_normal.log().std().item<double>(), 0.25, 0.005);

  const at::Tensor cauchy = filled({n}, at::kDouble, {Distribution::kCauchy, 3.0, 0.5});
  EXPECT_NEAR(cauchy.median().item<double>(), 3.0, 0.02);
  EXPECT_NEAR((cauchy - 3.0).abs().median().item<double>(), 0.5, 0.02);

  const at::Tensor geometric = filled({n}, at::kDouble, {Distribution::kGeometric, 0.25});
  EXPECT_GE(geometric.min().item<double>(), 1.0);
  EXPECT_NEAR(geometric.mean().item<double>(), 4.0, 0.05);
  EXPECT_TRUE(torch::floor(geometric).equal(geometric));
}

TEST(CounterRng, TruncatedNormalFollowsItsDistributionInEveryFloatingDtype) {
  // N(0.5, 1) cut to [-0.5, 1.5]: mean 0.5, std 0.5396.
  for (c10::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    const at::Tensor x = filled({200000}, dtype, truncated_normal(0.5, 1.0, -0.5, 1.5));
    EXPECT_GE(x.min().item<double>(), -0.5) << dtype;
    EXPECT_LE(x.max().item<double>(), 1.5) << dtype;
    EXPECT_NEAR(x.to(at::kDouble).mean().item<double>(), 0.5, 0.01) << dtype;
    EXPECT_NEAR(x.to(at::kDouble).std().item<double>(), 0.5396, 0.01) << dtype;
  }
  // Bounds far in the tails: std 0.02 cut at ±2, the uniform reaches ±1 and erfinv ±inf.
  const at::Tensor wide = filled({100000}, at::kFloat, truncated_normal(0.0, 0.02, -2.0, 2.0));
  EXPECT_TRUE(torch::isfinite(wide).all().item<bool>());
  EXPECT_NEAR(wide.std().item<double>(), 0.02, 0.001);
}

TEST(CounterRng, TruncatedNormalShardsOfEveryWorldSizeAgree) {
  const CounterDistributionParams p = truncated_normal(0.0, 0.02, -0.04, 0.04);
  const std::vector<int64_t> global = {70, 33};
  const at::Tensor full = filled(global, at::kFloat, p);
  for (const int64_t world : {2, 3, 7}) {
    std::vector<at::Tensor> parts;
    for (int64_t rank = 0; rank < world; ++rank) {
      const int64_t rows = 70 / world + (rank < 70 % world ? 1 : 0);
      const int64_t start = rank * (70 / world) + std::min(rank, 70 % world);
      at::Tensor part = torch::empty({rows, 33});
      counter_fill(part, p, 7, 3, {global, std::vector<int64_t>{start, 0}});
      parts.push_back(part);
    }
    EXPECT_TRUE(bitwise_equal(torch::cat(parts), full)) << world;
  }
}

// Digests of counter_fill's bytes in scheme 2, pinned by SchemeThreeBitsAreTheKnownAnswers (scheme
// 3 kept them).
constexpr const char* kSchemeTwoDigests =
    "uniform Float 531de77aa6c42c4c 40bf32ab80ab176a\n"
    "uniform Double 76f767c5baec19ef 3c4319b15983c1c0\n"
    "uniform Half 8a8d1c347dd0b93f 3b108a5b55acf8de\n"
    "uniform BFloat16 a67f676a2560e4d9 9e9cd3476a31c620\n"
    "normal Float eed2d4ca4d7550b8 d609fb2db59b1553\n"
    "normal Double a7eec9488e5015ac 2b48e16e73d17144\n"
    "normal Half 556081eabe3ece91 c1e6bfd6f4dd85cf\n"
    "normal BFloat16 a4592ff88042ecc 9b443e286cccb143\n"
    "bernoulli Float 9038e6af72733cc5 ae06b5520fe3f395\n"
    "bernoulli Double c990fb6dace63265 98780f8efb11c405\n"
    "bernoulli Half b2a192471f765c45 d5a9fde90d959e8d\n"
    "bernoulli BFloat16 33bdb0d506337bf5 f7dc191a75eaf33d\n"
    "random Float feb618030329ec22 39284c71542c7839\n"
    "random Double 79a2310dbcfca530 784204269d29ced6\n"
    "random Long b59204b9f3454430 23f7950d0dce92ce\n"
    "random Int 273e03f3de66ba20 4a4b504b0972bfde\n"
    "exponential Float 2ffc0f114a891bd9 485a1b35451f84cf\n"
    "exponential Double 96e003bbd3cc3dfb 5475eac830e11db9\n"
    "exponential Half c1bc1a777f02cde2 a389fe9e95237eec\n"
    "exponential BFloat16 e073cbfca5238509 39de37f5b7a4b03d\n"
    "log_normal Float 807e5b27d054e0b9 cbe4be8795d9290\n"
    "log_normal Double 4057fa60a59842b1 f1c3f9405d41f7d7\n"
    "log_normal Half 4abfd798c4bcff17 a3ac76f120b07f6\n"
    "log_normal BFloat16 3dadadde2e2b94df 374dcfc8bad53a07\n"
    "cauchy Float b8ac2c17f49f2d87 ef6b461736b9b263\n"
    "cauchy Double 4652f1c351af55c3 370e214a320bb1f1\n"
    "cauchy Half f960b1f9827c144a a64d3e601f54bb1a\n"
    "cauchy BFloat16 a80c802cc98f86c8 1434a4c1f162d0f2\n"
    "geometric Float 9f2feb1f0809980b dcc8b47fc591a39b\n"
    "geometric Double 7a007f035f3730fb d30a1840df618994\n"
    "geometric Half be345a7968a5050 1652d1057ffb8a4b\n"
    "geometric BFloat16 3b532c941f7992db 96e47bba55f613ab\n"
    "trunc_normal Float 998af9fe263b6244 9e3a9f0b5e1fe02d\n"
    "trunc_normal Double 8d3dbb37bd527006 809cbd396169f7e2\n"
    "trunc_normal Half f12afbf9eee48876 7c67b82086150d79\n"
    "trunc_normal BFloat16 a5c699d281180c94 bceb146a73a4ed42\n"
    "trunc_normal_wide Float e1accdee10358901 ce209cf7332ccf39\n"
    "trunc_normal_wide Double 115b02f4683083c3 a0741fb112439b6\n"
    "trunc_normal_wide Half ff76f60f75cbd8c3 8a8b261df62bc27a\n"
    "trunc_normal_wide BFloat16 6f1e490cde02bc48 350e6587e91fc12f\n";

// FNV-1a of a tensor's bytes.
uint64_t digest(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < c.nbytes(); ++i) {
    h = (h ^ bytes[i]) * 0x100000001b3ull;
  }
  return h;
}

// Note [Counter scheme versions]: the bits of every distribution and dtype, pinned. 1,000
// elements per fill (vector groups and a scalar tail on every path), and a region that starts
// and ends mid-block. A change of any bit is a new scheme: bump kCounterSchemeVersion, say what
// changed in the Note, and pin the new digests here. Scheme 3 changed only which key an op drawn
// from a followed generator gets (tests/python/test_trainer_flows.py pins those), so the digests
// are scheme 2's.
TEST(CounterRng, SchemeThreeBitsAreTheKnownAnswers) {
  static_assert(kCounterSchemeVersion == 3, "a new counter scheme: pin its bits below");
  struct Case {
    const char* name;
    CounterDistributionParams params;
    std::vector<c10::ScalarType> dtypes;
  };
  CounterDistributionParams random{Distribution::kRandom};
  random.from = 3;
  random.range = 1000;
  const std::vector<c10::ScalarType> floating = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};
  const std::vector<Case> cases = {
      {"uniform", {Distribution::kUniform, -0.3, 0.7}, floating},
      {"normal", {Distribution::kNormal, 0.5, 2.0}, floating},
      {"bernoulli", {Distribution::kBernoulli, 0.3}, floating},
      {"random", random, {at::kFloat, at::kDouble, at::kLong, at::kInt}},
      {"exponential", {Distribution::kExponential, 1.5}, floating},
      {"log_normal", {Distribution::kLogNormal, 0.0, 0.5}, floating},
      {"cauchy", {Distribution::kCauchy, 0.0, 1.0}, floating},
      {"geometric", {Distribution::kGeometric, 0.2}, floating},
      {"trunc_normal", truncated_normal(0.0, 1.0, -2.0, 2.0), floating},
      {"trunc_normal_wide", truncated_normal(0.0, 0.02, -2.0, 2.0), floating},
  };
  std::string digests;
  for (const Case& c : cases) {
    for (const c10::ScalarType dtype : c.dtypes) {
      const at::Tensor whole = filled({1000}, dtype, c.params, 0x5eed, 11);
      at::Tensor region = torch::empty({5, 37}, dtype);
      counter_fill(region, c.params, 0x5eed, 11, {std::vector<int64_t>{9, 41}, {3, 2}});
      digests += std::string(c.name) + " " + std::string(c10::toString(dtype)) + " " +
                 c10::str(std::hex, digest(whole), " ", digest(region)) + "\n";
    }
  }
  EXPECT_EQ(digests, kSchemeTwoDigests);
}

// CounterRng.Capability.* runs this again with TORCHDEFER_CPU_CAPABILITY set
// (tests/CMakeLists.txt).
TEST(CounterRng, CpuCapabilityNamesTheKernelsInUseWithinTheCap) {
  const std::string capability = counter_fill_cpu_capability();
  const std::vector<std::string> order = {"scalar", "avx2", "avx512"};
  const auto rank = std::find(order.begin(), order.end(), capability);
  ASSERT_NE(rank, order.end()) << capability;
  const char* cap = std::getenv("TORCHDEFER_CPU_CAPABILITY");
  if (cap != nullptr && *cap != '\0') {
    EXPECT_LE(rank - order.begin(), std::find(order.begin(), order.end(), cap) - order.begin());
  }
}

}  // namespace
}  // namespace torchdefer
