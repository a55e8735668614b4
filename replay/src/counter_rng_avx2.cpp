// AVX2 kernels of the counter RNG (Note [Vectorized counter fill]): float32 uniform and normal,
// for CPUs without AVX-512. Compiled with -mavx2 -ffp-contract=off (replay/CMakeLists.txt) and
// called only where counter_simd::avx2_available(). Every function below computes exactly what
// the scalar definition in counter_rng.cpp computes, operation by operation, in vector lanes.
#include "counter_rng_simd.h"

#include "counter_math_constants.h"

#include <immintrin.h>

#include <cstdint>

namespace torchdefer::counter_simd {
namespace {

using namespace counter_math_constants;

// Four independent sets of eight blocks: one set's rounds are a latency-bound chain.
constexpr int kSets = 4;
constexpr int kGroupBlocks = 8 * kSets;
constexpr int kGroupVectors = 4 * kSets;  // vectors of eight words per group

// Philox4x32-10 on blocks base_block + 0 .. 31. In each set of eight, lane 4j + l of the counter
// holds block 2l + j of the set, so that the 4x4 transpose inside each 128-bit lane leaves
// out[4 * set + l] = the words of the set's blocks 2l and 2l + 1: eight consecutive elements.
void philox(uint64_t base_block, uint64_t stream, uint64_t seed, __m256i out[kGroupVectors]) {
  const __m256i offsets = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  __m256i c[kSets][4];
  for (int set = 0; set < kSets; ++set) {
    const uint64_t base = base_block + 8 * set;
    c[set][0] = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(base)), offsets);
    // The low word wrapped where it ended below its offset (unsigned compare via the sign bit);
    // the mask is -1 there, so subtracting it carries one into the high word.
    const __m256i carry =
        _mm256_cmpgt_epi32(_mm256_xor_si256(offsets, sign), _mm256_xor_si256(c[set][0], sign));
    c[set][1] = _mm256_sub_epi32(_mm256_set1_epi32(static_cast<int>(base >> 32)), carry);
    c[set][2] = _mm256_set1_epi32(static_cast<int>(stream));
    c[set][3] = _mm256_set1_epi32(static_cast<int>(stream >> 32));
  }
  __m256i k0 = _mm256_set1_epi32(static_cast<int>(seed));
  __m256i k1 = _mm256_set1_epi32(static_cast<int>(seed >> 32));
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(counter_math_constants::kPhiloxMul0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(counter_math_constants::kPhiloxMul1));
  const __m256i w0 = _mm256_set1_epi32(static_cast<int>(counter_math_constants::kPhiloxWeyl0));
  const __m256i w1 = _mm256_set1_epi32(static_cast<int>(counter_math_constants::kPhiloxWeyl1));
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 = _mm256_add_epi32(k0, w0);
      k1 = _mm256_add_epi32(k1, w1);
    }
    for (int set = 0; set < kSets; ++set) {
      __m256i* x = c[set];
      const __m256i p0_even = _mm256_mul_epu32(x[0], m0);
      const __m256i p0_odd = _mm256_mul_epu32(_mm256_srli_epi64(x[0], 32), m0);
      const __m256i p1_even = _mm256_mul_epu32(x[2], m1);
      const __m256i p1_odd = _mm256_mul_epu32(_mm256_srli_epi64(x[2], 32), m1);
      const __m256i lo0 = _mm256_blend_epi32(p0_even, _mm256_slli_epi64(p0_odd, 32), 0xAA);
      const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(p0_even, 32), p0_odd, 0xAA);
      const __m256i lo1 = _mm256_blend_epi32(p1_even, _mm256_slli_epi64(p1_odd, 32), 0xAA);
      const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(p1_even, 32), p1_odd, 0xAA);
      x[0] = _mm256_xor_si256(_mm256_xor_si256(hi1, x[1]), k0);
      x[1] = lo1;
      x[2] = _mm256_xor_si256(_mm256_xor_si256(hi0, x[3]), k1);
      x[3] = lo0;
    }
  }
  for (int set = 0; set < kSets; ++set) {
    const __m256i* x = c[set];
    const __m256i t0 = _mm256_unpacklo_epi32(x[0], x[1]);
    const __m256i t1 = _mm256_unpackhi_epi32(x[0], x[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(x[2], x[3]);
    const __m256i t3 = _mm256_unpackhi_epi32(x[2], x[3]);
    out[4 * set] = _mm256_unpacklo_epi64(t0, t2);
    out[4 * set + 1] = _mm256_unpackhi_epi64(t0, t2);
    out[4 * set + 2] = _mm256_unpacklo_epi64(t1, t3);
    out[4 * set + 3] = _mm256_unpackhi_epi64(t1, t3);
  }
}

// Four unsigned 32-bit words as doubles, exactly (AVX2 converts only signed ones).
__m256d unsigned_to_double(__m128i words) {
  const __m128i sign = _mm_set1_epi32(static_cast<int>(0x80000000u));
  return _mm256_cvtepi32_pd(_mm_xor_si128(words, sign)) + 2147483648.0;
}

// The low 32 bits of each 64-bit lane, as four 32-bit integers.
__m128i low_words(__m256i x) {
  const __m256i gather = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(x, gather));
}

// Lanes where `mask` (all ones or zeros per 64-bit lane) is set get their sign flipped.
__m256d negate_where(__m256d x, __m256i mask) {
  return _mm256_xor_pd(x, _mm256_and_pd(_mm256_castsi256_pd(mask), _mm256_set1_pd(-0.0)));
}

// counter_math::log, lane by lane.
__m256d log4(__m256d x) {
  const __m256i bits = _mm256_castpd_si256(x);
  __m256i k =
      _mm256_sub_epi64(_mm256_and_si256(_mm256_srli_epi64(bits, 52), _mm256_set1_epi64x(0x7ff)),
                       _mm256_set1_epi64x(1023));
  __m256d m = _mm256_castsi256_pd(
      _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi64x(0x000fffffffffffffll)),
                      _mm256_set1_epi64x(0x3ff0000000000000ll)));
  const __m256d above = _mm256_cmp_pd(m, _mm256_set1_pd(kSqrt2), _CMP_GT_OQ);
  m = _mm256_blendv_pd(m, m * 0.5, above);
  k = _mm256_sub_epi64(k, _mm256_castpd_si256(above));  // above is −1 where set
  const __m256d s = (m - 1.0) / (m + 1.0);
  const __m256d s2 = s * s;
  __m256d p = _mm256_set1_pd(1.0 / 25.0);
  for (int n = 23; n >= 1; n -= 2) {
    p = 1.0 / n + s2 * p;
  }
  const __m256d kd = _mm256_cvtepi32_pd(low_words(k));  // |k| < 1100
  return kd * kLn2Hi + (kd * kLn2Lo + 2.0 * s * p);
}

// counter_math::sincos_2pi for 0 <= t < 2^31, lane by lane.
void sincos_2pi4(__m256d t, __m256d* sin, __m256d* cos) {
  const __m256d whole = _mm256_cvtepi32_pd(_mm256_cvttpd_epi32(t));
  const __m256d y = 4.0 * (t - whole);
  const __m128i q32 = _mm256_cvttpd_epi32(y);
  const __m256d f = y - _mm256_cvtepi32_pd(q32);
  const __m256d low = _mm256_cmp_pd(f, _mm256_set1_pd(0.5), _CMP_LE_OQ);
  const __m256d x = _mm256_blendv_pd((1.0 - f) * kHalfPi, f * kHalfPi, low);
  // sincos_quarter(x): its sine and cosine trade places where f > 1/2.
  const __m256d x2 = x * x;
  __m256d ps = _mm256_set1_pd(kInverseFactorial[19]);
  __m256d pc = _mm256_set1_pd(kInverseFactorial[20]);
  for (int n = 17; n >= 1; n -= 2) {
    ps = kInverseFactorial[n] - x2 * ps;
    pc = kInverseFactorial[n + 1] - x2 * pc;
  }
  pc = kInverseFactorial[0] - x2 * pc;
  const __m256d xs = x * ps;
  const __m256d s = _mm256_blendv_pd(pc, xs, low);
  const __m256d c = _mm256_blendv_pd(xs, pc, low);
  // Quadrant q: sin, cos = (s, c), (c, −s), (−s, −c), (−c, s).
  const __m256i q = _mm256_cvtepi32_epi64(q32);
  const __m256i one = _mm256_set1_epi64x(1);
  const __m256i two = _mm256_set1_epi64x(2);
  const __m256d odd = _mm256_castsi256_pd(_mm256_cmpeq_epi64(_mm256_and_si256(q, one), one));
  const __m256i sin_negative = _mm256_cmpeq_epi64(_mm256_and_si256(q, two), two);
  const __m256i cos_negative =
      _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_xor_si256(q, _mm256_srli_epi64(q, 1)), one), one);
  *sin = negate_where(_mm256_blendv_pd(s, c, odd), sin_negative);
  *cos = negate_where(_mm256_blendv_pd(c, s, odd), cos_negative);
}

// Eight float32 uniforms from eight words: a + (b − a)·u, u = (w >> 8)·2^-24, in double.
__m256 uniform8(__m256i words, double from, double range, __m256 from_f, __m256 to_f) {
  const __m256i top = _mm256_srli_epi32(words, 8);  // < 2^24: converts as signed
  const __m256d lo = from + range * (_mm256_cvtepi32_pd(_mm256_castsi256_si128(top)) * 0x1p-24);
  const __m256d hi =
      from + range * (_mm256_cvtepi32_pd(_mm256_extracti128_si256(top, 1)) * 0x1p-24);
  const __m256 f = _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
  return _mm256_blendv_ps(f, from_f, _mm256_cmp_ps(f, to_f, _CMP_EQ_OQ));
}

// Eight float32 normals from eight words: each 64-bit lane is one Box–Muller pair, u1 from its
// low word and u2 from its high word, the even element cos and the odd one sin.
__m256 normal8(__m256i words, double mean, double std) {
  const __m256d u1 = (unsigned_to_double(low_words(words)) + 1.0) / kTwoPow32;
  const __m256d u2 = unsigned_to_double(low_words(_mm256_srli_epi64(words, 32))) / kTwoPow32;
  const __m256d r = _mm256_sqrt_pd(-2.0 * log4(u1));
  __m256d s, c;
  sincos_2pi4(u2, &s, &c);
  const __m256d cos_value = mean + std * (r * c);
  const __m256d sin_value = mean + std * (r * s);
  // Pairs 0..3 to elements c0 s0 c1 s1 | c2 s2 c3 s3.
  const __m256d even = _mm256_unpacklo_pd(cos_value, sin_value);  // c0 s0 | c2 s2
  const __m256d odd = _mm256_unpackhi_pd(cos_value, sin_value);   // c1 s1 | c3 s3
  const __m256d first = _mm256_permute2f128_pd(even, odd, 0x20);
  const __m256d second = _mm256_permute2f128_pd(even, odd, 0x31);
  return _mm256_set_m128(_mm256_cvtpd_ps(second), _mm256_cvtpd_ps(first));
}

}  // namespace

int64_t fill_avx2(const Job& job) {
  if (job.dtype != Dtype::kFloat || (job.op != Op::kUniform && job.op != Op::kNormal)) {
    return 0;
  }
  constexpr int64_t kPerGroup = 4 * kGroupBlocks;
  const int64_t groups = job.count / kPerGroup;
  const double range = job.b - job.a;
  const __m256 from_f = _mm256_set1_ps(static_cast<float>(job.a));
  const __m256 to_f = _mm256_set1_ps(static_cast<float>(job.b));
  float* out = static_cast<float*>(job.out);
  __m256i words[kGroupVectors];
  for (int64_t g = 0; g < groups; ++g) {
    philox(job.first / 4 + kGroupBlocks * static_cast<uint64_t>(g), job.stream, job.seed, words);
    float* dst = out + kPerGroup * g;
    for (int v = 0; v < kGroupVectors; ++v) {
      const __m256 values = job.op == Op::kUniform ? uniform8(words[v], job.a, range, from_f, to_f)
                                                   : normal8(words[v], job.a, job.b);
      _mm256_storeu_ps(dst + 8 * v, values);
    }
  }
  return groups * kPerGroup;
}

}  // namespace torchdefer::counter_simd
