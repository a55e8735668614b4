// Counter RNG (Note [Counter RNG]). Compiled with -ffp-contract=off (replay/CMakeLists.txt).
#include <torchdefer/counter_rng.h>

#include "counter_math_constants.h"
#include "counter_rng_simd.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace torchdefer {

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += counter_math_constants::kPhiloxWeyl0;
      k[1] += counter_math_constants::kPhiloxWeyl1;
    }
    const uint64_t p0 = uint64_t{counter_math_constants::kPhiloxMul0} * c[0];
    const uint64_t p1 = uint64_t{counter_math_constants::kPhiloxMul1} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
  }
  return c;
}

namespace counter_math {

using namespace counter_math_constants;

namespace {

double from_bits(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof(d));
  return d;
}

uint64_t to_bits(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof(bits));
  return bits;
}

// sin and cos of x ∈ [0, π/4] by Taylor series to x^19 and x^20 (truncation below 1e-21).
void sincos_quarter(double x, double* s, double* c) {
  const double x2 = x * x;
  double ps = kInverseFactorial[19];
  for (int n = 17; n >= 1; n -= 2) {
    ps = kInverseFactorial[n] - x2 * ps;
  }
  double pc = kInverseFactorial[20];
  for (int n = 18; n >= 0; n -= 2) {
    pc = kInverseFactorial[n] - x2 * pc;
  }
  *s = x * ps;
  *c = pc;
}

}  // namespace

double log(double x) {
  // x = m·2^k with m ∈ [√½, √2): ln x = k·ln 2 + 2·atanh(s), s = (m − 1)/(m + 1), |s| ≤ 0.172.
  uint64_t bits = to_bits(x);
  int64_t k = static_cast<int64_t>((bits >> 52) & 0x7ff) - 1023;
  double m = from_bits((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
  if (m > kSqrt2) {
    m = m * 0.5;
    ++k;
  }
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double p = 1.0 / 25.0;
  for (int n = 23; n >= 1; n -= 2) {
    p = 1.0 / n + s2 * p;
  }
  const double kd = static_cast<double>(k);
  return kd * kLn2Hi + (kd * kLn2Lo + 2.0 * s * p);
}

double exp(double x) {
  if (x > 709.78) {
    return std::numeric_limits<double>::infinity();
  }
  if (x < -745.13) {
    return 0.0;
  }
  // x = k·ln 2 + r, |r| ≤ ½ ln 2: exp x = 2^k · exp r, exp r by its Taylor series to r^17.
  const double kd = static_cast<double>(static_cast<int64_t>(x * kInvLn2 + (x < 0 ? -0.5 : 0.5)));
  const double r = (x - kd * kLn2Hi) - kd * kLn2Lo;
  double p = kInverseFactorial[17];
  for (int n = 16; n >= 0; --n) {
    p = kInverseFactorial[n] + r * p;
  }
  // 2^k in two steps so that k down to −1074 stays representable.
  const int64_t k = static_cast<int64_t>(kd);
  const int64_t k1 = k / 2;
  const int64_t k2 = k - k1;
  return p * from_bits(static_cast<uint64_t>(k1 + 1023) << 52) *
         from_bits(static_cast<uint64_t>(k2 + 1023) << 52);
}

void sincos_2pi(double t, double* sin, double* cos) {
  // sin(−x) = −sin x: reduce the sign first, exactly.
  const bool negative = t < 0;
  if (negative) {
    t = -t;
  }
  // 2πt = q·π/2 + (π/2)·f with q = ⌊4t⌋ and f ∈ [0, 1); both exact in binary.
  const double y = 4.0 * (t - static_cast<double>(static_cast<int64_t>(t)));
  const int64_t q = static_cast<int64_t>(y);
  const double f = y - static_cast<double>(q);
  double s, c;
  if (f <= 0.5) {
    sincos_quarter(f * kHalfPi, &s, &c);
  } else {
    sincos_quarter((1.0 - f) * kHalfPi, &c, &s);
  }
  switch (q & 3) {
    case 0:
      *sin = s, *cos = c;
      break;
    case 1:
      *sin = c, *cos = -s;
      break;
    case 2:
      *sin = -s, *cos = -c;
      break;
    default:
      *sin = -c, *cos = s;
      break;
  }
  if (negative) {
    *sin = -*sin;
  }
}

}  // namespace counter_math

namespace {

using counter_math_constants::kTwoPow32;

// Bits per element of a draw: 32, or 64 for float64 uniform/normal and wide random ranges.
bool uses_64_bits(const CounterDistributionParams& params, c10::ScalarType dtype) {
  switch (params.distribution) {
    case CounterDistribution::kRandom:
      return params.range == 0 ? (dtype == at::kLong || dtype == at::kDouble)
                               : params.range > (uint64_t{1} << 32);
    case CounterDistribution::kBernoulli:
      return false;
    default:
      return dtype == at::kDouble;
  }
}

// The random words of one op (one seed and stream), one Philox block at a time.
class Blocks {
 public:
  Blocks(uint64_t seed, uint64_t stream)
      : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
        stream_lo_(static_cast<uint32_t>(stream)),
        stream_hi_(static_cast<uint32_t>(stream >> 32)) {}

  const std::array<uint32_t, 4>& block(uint64_t b) {
    if (b != current_ || !valid_) {
      words_ = philox4x32_10(
          {static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), stream_lo_, stream_hi_}, key_);
      current_ = b;
      valid_ = true;
    }
    return words_;
  }

  // The two standard normals of the last Box–Muller pair, which its two elements share.
  struct Pair {
    uint64_t index = 0;
    double cos_value = 0;
    double sin_value = 0;
    bool valid = false;
  };
  Pair& pair() { return pair_; }

 private:
  std::array<uint32_t, 2> key_;
  uint32_t stream_lo_;
  uint32_t stream_hi_;
  std::array<uint32_t, 4> words_{};
  uint64_t current_ = 0;
  bool valid_ = false;
  Pair pair_;
};

uint64_t word64(const std::array<uint32_t, 4>& w, int half) {
  return (uint64_t{w[2 * half + 1]} << 32) | w[2 * half];
}

// A standard normal for element e (Box–Muller on its pair, Note [Counter RNG]). The pair's two
// values are computed once and kept for the other element.
double standard_normal(Blocks& blocks, uint64_t e, bool wide) {
  Blocks::Pair& pair = blocks.pair();
  if (!pair.valid || pair.index != e / 2) {
    double u1;
    double u2;
    if (wide) {
      const auto& w = blocks.block(e / 2);
      u1 = static_cast<double>((word64(w, 0) >> 11) + 1) * 0x1p-53;
      u2 = static_cast<double>(word64(w, 1) >> 11) * 0x1p-53;
    } else {
      const auto& w = blocks.block(e / 4);
      const int half = static_cast<int>(e % 4) / 2;
      u1 = (static_cast<double>(w[2 * half]) + 1.0) / kTwoPow32;
      u2 = static_cast<double>(w[2 * half + 1]) / kTwoPow32;
    }
    const double r = std::sqrt(-2.0 * counter_math::log(u1));
    double s, c;
    counter_math::sincos_2pi(u2, &s, &c);
    pair = {e / 2, r * c, r * s, true};
  }
  return e % 2 == 1 ? pair.sin_value : pair.cos_value;
}

// A uniform in [0, 1) for element e: 24 bits (32-bit draws) or 53 (64-bit draws).
double unit_uniform(Blocks& blocks, uint64_t e, bool wide) {
  if (wide) {
    return static_cast<double>(word64(blocks.block(e / 2), static_cast<int>(e % 2)) >> 11) *
           0x1p-53;
  }
  return static_cast<double>(blocks.block(e / 4)[e % 4] >> 8) * 0x1p-24;
}

// A uniform in (0, 1] for element e, for logarithms.
double open_unit_uniform(Blocks& blocks, uint64_t e, bool wide) {
  if (wide) {
    return static_cast<double>((word64(blocks.block(e / 2), static_cast<int>(e % 2)) >> 11) + 1) *
           0x1p-53;
  }
  return (static_cast<double>(blocks.block(e / 4)[e % 4]) + 1.0) / kTwoPow32;
}

uint64_t raw_draw(Blocks& blocks, uint64_t e, bool wide) {
  return wide ? word64(blocks.block(e / 2), static_cast<int>(e % 2)) : blocks.block(e / 4)[e % 4];
}

template <typename T>
uint64_t default_random_range() {
  if constexpr (std::is_same_v<T, bool>) {
    return 2;
  } else if constexpr (std::is_same_v<T, double>) {
    return (uint64_t{1} << 53) + 1;
  } else if constexpr (std::is_same_v<T, float>) {
    return (uint64_t{1} << 24) + 1;
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    return (uint64_t{1} << 11) + 1;
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return (uint64_t{1} << 8) + 1;
  } else {
    return static_cast<uint64_t>(std::numeric_limits<T>::max()) + 1;
  }
}

// A double to the dtype, to nearest even; float16 and bfloat16 through float32, as Note
// [Counter RNG] specifies (a CUDA kernel computes them in float32 too).
template <typename T>
T to_dtype(double value) {
  if constexpr (std::is_same_v<T, double>) {
    return value;
  } else if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(value);
  } else if constexpr (std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>) {
    return T(static_cast<float>(value));
  } else if constexpr (std::is_same_v<T, bool>) {
    return value != 0.0;
  } else {
    return static_cast<T>(value);
  }
}

template <typename T>
T element_value(const CounterDistributionParams& p, Blocks& blocks, uint64_t e, bool wide) {
  switch (p.distribution) {
    case CounterDistribution::kUniform: {
      const T value = to_dtype<T>(p.a + (p.b - p.a) * unit_uniform(blocks, e, wide));
      return value == to_dtype<T>(p.b) ? to_dtype<T>(p.a) : value;
    }
    case CounterDistribution::kNormal:
      return to_dtype<T>(p.a + p.b * standard_normal(blocks, e, wide));
    case CounterDistribution::kLogNormal:
      return to_dtype<T>(counter_math::exp(p.a + p.b * standard_normal(blocks, e, wide)));
    case CounterDistribution::kBernoulli:
      return to_dtype<T>(static_cast<double>(blocks.block(e / 4)[e % 4]) / kTwoPow32 < p.a ? 1.0
                                                                                           : 0.0);
    case CounterDistribution::kRandom: {
      const uint64_t range = p.range == 0 ? default_random_range<T>() : p.range;
      const int64_t value = p.from + static_cast<int64_t>(raw_draw(blocks, e, wide) % range);
      if constexpr (std::is_integral_v<T>) {
        return static_cast<T>(value);
      } else {
        return to_dtype<T>(static_cast<double>(value));
      }
    }
    case CounterDistribution::kExponential:
      return to_dtype<T>(-counter_math::log(open_unit_uniform(blocks, e, wide)) / p.a);
    case CounterDistribution::kCauchy: {
      double s, c;
      counter_math::sincos_2pi((unit_uniform(blocks, e, wide) - 0.5) * 0.5, &s, &c);
      return to_dtype<T>(p.a + p.b * (s / c));
    }
    case CounterDistribution::kGeometric: {
      const double trials =
          counter_math::log(open_unit_uniform(blocks, e, wide)) / counter_math::log(1.0 - p.a);
      const double k = static_cast<double>(static_cast<int64_t>(trials));
      return to_dtype<T>(std::max(1.0, k < trials ? k + 1.0 : k));
    }
  }
  return T();
}

#if defined(__x86_64__)
#define TORCHDEFER_X86_KERNELS 1

// Note [Vectorized counter fill]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Initialization is almost all uniform and normal draws, so those (and bernoulli and exponential)
// have vector kernels for float32, float64, float16 and bfloat16 outputs. The scalar code above is
// the definition; a kernel computes the same IEEE operations in the same order, lane by lane
// (separate multiplies and adds, FP contraction off, the same log/sincos polynomials, correctly
// rounded sqrt and conversions), so its bits equal the scalar path's. counter_rng_test.cpp checks
// every kernel element by element against a reference written from Note [Counter RNG], across
// region offsets that start and end mid-block and mid-group.
//
//  * AVX-512 (F, DQ, BW, VL; counter_rng_avx512.cpp, its own translation unit compiled for that
//    instruction set): every kernel above. Philox runs four independent sets of 16 blocks at once
//    (one set alone is a latency-bound chain of multiplies), the counters laid out so that one
//    in-lane 4x4 transpose leaves the words in element order.
//  * AVX2 (counter_rng_avx2.cpp, likewise): float32 uniform and normal, the same scheme with four
//    sets of eight blocks, for CPUs without AVX-512.
//  * Otherwise the scalar path. The choice is made at run time from cpuid, so the library runs on
//    any x86-64 CPU. TORCHDEFER_CPU_CAPABILITY=scalar|avx2|avx512 caps it (as ATEN_CPU_CAPABILITY
//    does ATen's kernels), so that tests and benchmarks run every path on one machine.
enum class Isa { kScalar, kAvx2, kAvx512 };

Isa detect_isa() {
  Isa isa = Isa::kScalar;
  if (counter_simd::avx2_available()) {
    isa = Isa::kAvx2;
  }
  if (counter_simd::avx512_available()) {
    isa = Isa::kAvx512;
  }
  const char* cap = std::getenv("TORCHDEFER_CPU_CAPABILITY");
  if (cap == nullptr || *cap == '\0') {
    return isa;
  }
  const std::string requested(cap);
  TORCH_CHECK(requested == "scalar" || requested == "avx2" || requested == "avx512",
              "torchdefer: TORCHDEFER_CPU_CAPABILITY='", requested,
              "' is not one of scalar, avx2, avx512; unset it to use the best the CPU supports");
  const Isa limit = requested == "scalar" ? Isa::kScalar
                    : requested == "avx2" ? Isa::kAvx2
                                          : Isa::kAvx512;
  return std::min(isa, limit);
}

Isa counter_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

#endif

template <typename T>
constexpr std::optional<counter_simd::Dtype> simd_dtype() {
  if constexpr (std::is_same_v<T, float>) {
    return counter_simd::Dtype::kFloat;
  } else if constexpr (std::is_same_v<T, double>) {
    return counter_simd::Dtype::kDouble;
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    return counter_simd::Dtype::kHalf;
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return counter_simd::Dtype::kBFloat16;
  }
  return std::nullopt;
}

std::optional<counter_simd::Op> simd_op(CounterDistribution distribution) {
  switch (distribution) {
    case CounterDistribution::kUniform:
      return counter_simd::Op::kUniform;
    case CounterDistribution::kNormal:
      return counter_simd::Op::kNormal;
    case CounterDistribution::kBernoulli:
      return counter_simd::Op::kBernoulli;
    case CounterDistribution::kExponential:
      return counter_simd::Op::kExponential;
    default:
      return std::nullopt;
  }
}

// Fills a prefix of the `count` contiguous elements from element `e` with a vector kernel (Note
// [Vectorized counter fill]), the elements before the first block boundary with the scalar path.
// Returns how many it filled.
template <typename T>
int64_t vector_fill(T* out, uint64_t e, int64_t count, const CounterDistributionParams& params,
                    uint64_t seed, uint64_t stream, Blocks& blocks, bool wide) {
  constexpr std::optional<counter_simd::Dtype> dtype = simd_dtype<T>();
  const std::optional<counter_simd::Op> op = simd_op(params.distribution);
  if (!dtype || !op) {
    return 0;
  }
#ifdef TORCHDEFER_X86_KERNELS
  const Isa isa = counter_isa();
  const bool avx512 = isa == Isa::kAvx512;
  const bool avx2 = isa == Isa::kAvx2 && *dtype == counter_simd::Dtype::kFloat &&
                    (*op == counter_simd::Op::kUniform || *op == counter_simd::Op::kNormal);
  if (!avx512 && !avx2) {
    return 0;
  }
  const uint64_t per_block = wide ? 2 : 4;
  int64_t j = 0;
  for (; j < count && (e + j) % per_block != 0; ++j) {
    out[j] = element_value<T>(params, blocks, e + j, wide);
  }
  counter_simd::Job job;
  job.op = *op;
  job.dtype = *dtype;
  job.out = out + j;
  job.first = e + j;
  job.count = count - j;
  job.a = params.a;
  job.b = params.b;
  job.seed = seed;
  job.stream = stream;
  return j + (avx512 ? counter_simd::fill_avx512(job) : counter_simd::fill_avx2(job));
#else
  return 0;
#endif
}

// Global row-major index of the first element of each row of `out` (its last dimension).
struct RowIndex {
  std::vector<int64_t> global_strides;  // row-major strides of the global shape
  std::vector<int64_t> start;
};

template <typename T>
void fill_typed(const at::Tensor& out, const CounterDistributionParams& params, uint64_t seed,
                uint64_t stream, const RowIndex& index) {
  const int64_t dims = out.dim();
  const int64_t row_length = dims == 0 ? 1 : out.size(dims - 1);
  const int64_t rows = row_length == 0 ? 0 : out.numel() / row_length;
  const int64_t last_stride = dims == 0 ? 1 : out.stride(dims - 1);
  const int64_t last_global_stride = dims == 0 ? 1 : index.global_strides[dims - 1];
  const bool wide = uses_64_bits(params, out.scalar_type());
  T* data = out.data_ptr<T>();
  // Split by elements, not rows, so that a long 1-D tensor uses every thread too.
  const int64_t numel = rows * row_length;
  at::parallel_for(0, numel, /*grain_size=*/32768, [&](int64_t begin, int64_t end) {
    Blocks blocks(seed, stream);
    int64_t k = begin;
    while (k < end) {
      const int64_t row = k / row_length;
      const int64_t first = k % row_length;
      const int64_t last = std::min(row_length, first + (end - k));
      int64_t rest = row;
      int64_t offset = 0;
      int64_t global = 0;
      for (int64_t d = dims - 2; d >= 0; --d) {
        const int64_t i = rest % out.size(d);
        rest /= out.size(d);
        offset += i * out.stride(d);
        global += (index.start[d] + i) * index.global_strides[d];
      }
      if (dims > 0) {
        global += index.start[dims - 1] * last_global_stride;
      }
      int64_t j = first;
      if (last_stride == 1) {
        j += vector_fill(data + offset + j, static_cast<uint64_t>(global + j), last - j, params,
                         seed, stream, blocks, wide);
      }
      for (; j < last; ++j) {
        data[offset + j * last_stride] =
            element_value<T>(params, blocks, static_cast<uint64_t>(global + j), wide);
      }
      k += last - first;
    }
  });
}

}  // namespace

namespace counter_simd {

bool avx2_available() {
#ifdef TORCHDEFER_X86_KERNELS
  static const bool available = __builtin_cpu_supports("avx2");
  return available;
#else
  return false;
#endif
}

bool avx512_available() {
#ifdef TORCHDEFER_X86_KERNELS
  static const bool available =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return available;
#else
  return false;
#endif
}

}  // namespace counter_simd

// Note [Merged rows]
// ~~~~~~~~~~~~~~~~~~
// fill_typed walks `out` one row (last dimension) at a time, and the vector kernels fill whole
// groups of elements within a row; a conv weight [256, 64, 3, 3] has rows of 3, all of which
// would take the scalar path. So adjacent dimensions that are contiguous with each other in
// `out`, and that the region covers fully in the inner one, are merged first: a whole contiguous
// tensor becomes one row. The global row-major index of every element is unchanged: for a fully
// covered inner dimension of global size G, (s + i) * G * g + j * g == (s * G + i * G + j) * g.
void counter_fill(const at::Tensor& out, const CounterDistributionParams& params, uint64_t seed,
                  uint64_t stream, CounterRegion region) {
  const int64_t dims = out.dim();
  const c10::IntArrayRef global = region.global_sizes.empty() ? out.sizes() : region.global_sizes;
  TORCH_CHECK(static_cast<int64_t>(global.size()) == dims,
              "torchdefer: counter_fill: the region's ", "global shape ", global, " has ",
              global.size(), " dimensions but `out` ", out.sizes(), " has ", dims,
              "; give the op's whole output shape.");
  const std::vector<int64_t> start = region.start.empty()
                                         ? std::vector<int64_t>(static_cast<size_t>(dims), 0)
                                         : region.start.vec();
  TORCH_CHECK(static_cast<int64_t>(start.size()) == dims, "torchdefer: counter_fill: the region ",
              "starts at ", region.start, " but `out` ", out.sizes(), " has ", dims,
              " dimensions; give one start per dimension.");
  for (int64_t d = 0; d < dims; ++d) {
    TORCH_CHECK(start[d] >= 0 && start[d] + out.size(d) <= global[d],
                "torchdefer: counter_fill: `out` ", out.sizes(), " placed at ",
                c10::IntArrayRef(start), " does not fit in the global shape ", global,
                " along dimension ", d, ".");
  }
  if (out.numel() == 0) {
    return;
  }
  std::vector<int64_t> sizes, strides, merged_global;
  RowIndex index;
  for (int64_t d = 0; d < dims; ++d) {
    const bool merges = !sizes.empty() && strides.back() == out.stride(d) * out.size(d) &&
                        start[d] == 0 && out.size(d) == global[d];
    if (merges) {
      sizes.back() *= out.size(d);
      strides.back() = out.stride(d);
      merged_global.back() *= global[d];
      index.start.back() *= global[d];
      continue;
    }
    sizes.push_back(out.size(d));
    strides.push_back(out.stride(d));
    merged_global.push_back(global[d]);
    index.start.push_back(start[d]);
  }
  const auto merged_dims = static_cast<int64_t>(sizes.size());
  index.global_strides.assign(sizes.size(), 1);
  for (int64_t d = merged_dims - 2; d >= 0; --d) {
    index.global_strides[d] = index.global_strides[d + 1] * merged_global[d + 1];
  }
  const at::Tensor rows = out.as_strided(sizes, strides, out.storage_offset());
  AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, out.scalar_type(),
                             "torchdefer_counter_fill",
                             [&] { fill_typed<scalar_t>(rows, params, seed, stream, index); });
}

}  // namespace torchdefer
