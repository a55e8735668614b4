// AVX2 kernels of the counter RNG (Note [Vectorized counter fill]): uniform, normal and truncated
// normal in float32, float16 and bfloat16, and erfinv on lanes for the truncated normal in
// float64, for CPUs without AVX-512. Compiled with -mavx2 -mfma -mf16c -ffp-contract=off
// (replay/CMakeLists.txt) and called only where counter_simd::avx2_available(). Every function
// below computes exactly what the scalar definition computes: the math is counter_math.h's,
// instantiated for AVX2 lanes.
#include "counter_rng_simd.h"

#define TORCHDEFER_COUNTER_ISA avx2
#include "counter_math.h"
#include "counter_rng_erfinv.h"

#include <immintrin.h>

#include <cstdint>

namespace torchdefer::counter_math {

// Four float64 lanes (Note [One definition of the counter math]).
template <>
struct Lanes<__m256d> {
  using Mask = __m256d;  // all ones where true
  static constexpr int kWidth = 4;
  static __m256d load(const double* x) { return _mm256_loadu_pd(x); }
  static void store(double* x, __m256d v) { _mm256_storeu_pd(x, v); }
  static __m256d broadcast(double x) { return _mm256_set1_pd(x); }
  static Mask less(__m256d x, __m256d y) { return _mm256_cmp_pd(x, y, _CMP_LT_OQ); }
  static Mask less_equal(__m256d x, __m256d y) { return _mm256_cmp_pd(x, y, _CMP_LE_OQ); }
  static Mask greater(__m256d x, __m256d y) { return _mm256_cmp_pd(x, y, _CMP_GT_OQ); }
  static Mask equal(__m256d x, __m256d y) { return _mm256_cmp_pd(x, y, _CMP_EQ_OQ); }
  static Mask both(Mask x, Mask y) { return _mm256_and_pd(x, y); }
  static Mask either(Mask x, Mask y) { return _mm256_or_pd(x, y); }
  static bool any(Mask x) { return _mm256_movemask_pd(x) != 0; }
  static __m256d select(Mask m, __m256d x, __m256d y) { return _mm256_blendv_pd(y, x, m); }
  static __m256d trunc(__m256d x) {
    return _mm256_round_pd(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  }
  static void split_exponent(__m256d x, __m256d* m, __m256d* k) {
    const __m256i bits = _mm256_castpd_si256(x);
    const __m256i exponent =
        _mm256_sub_epi64(_mm256_and_si256(_mm256_srli_epi64(bits, 52), _mm256_set1_epi64x(0x7ff)),
                         _mm256_set1_epi64x(1023));
    // |k| < 1100: its low words convert as signed 32-bit integers (AVX2 has no 64-bit convert).
    const __m256i gather = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    *k = _mm256_cvtepi32_pd(_mm256_castsi256_si128(_mm256_permutevar8x32_epi32(exponent, gather)));
    *m = _mm256_castsi256_pd(
        _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi64x(0x000fffffffffffffll)),
                        _mm256_set1_epi64x(0x3ff0000000000000ll)));
  }
  static __m256d pow2(__m256d k) {
    const __m128i biased = _mm_add_epi32(_mm256_cvtpd_epi32(k), _mm_set1_epi32(1023));
    return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_cvtepi32_epi64(biased), 52));
  }
  static __m256d sqrt(__m256d x) { return _mm256_sqrt_pd(x); }
  static __m256d fma(__m256d x, __m256d y, __m256d z) { return _mm256_fmadd_pd(x, y, z); }
};

namespace avx2 {

// N registers of four float64 lanes, stepped together (as avx512::Doubles): erfinv's polynomials
// are one long chain of dependent multiplies and adds per register, and interleaving two keeps
// the floating-point units busy. A double converts to all lanes.
template <int N>
struct Doubles {
  __m256d v[N];

  Doubles() = default;
  Doubles(double x) {  // NOLINT(google-explicit-constructor): the math's constants
    for (__m256d& r : v) {
      r = _mm256_set1_pd(x);
    }
  }

  friend Doubles operator+(const Doubles& x, const Doubles& y) {
    Doubles r;
    for (int i = 0; i < N; ++i) {
      r.v[i] = x.v[i] + y.v[i];
    }
    return r;
  }
  friend Doubles operator-(const Doubles& x, const Doubles& y) {
    Doubles r;
    for (int i = 0; i < N; ++i) {
      r.v[i] = x.v[i] - y.v[i];
    }
    return r;
  }
  friend Doubles operator*(const Doubles& x, const Doubles& y) {
    Doubles r;
    for (int i = 0; i < N; ++i) {
      r.v[i] = x.v[i] * y.v[i];
    }
    return r;
  }
  friend Doubles operator/(const Doubles& x, const Doubles& y) {
    Doubles r;
    for (int i = 0; i < N; ++i) {
      r.v[i] = x.v[i] / y.v[i];
    }
    return r;
  }
  friend Doubles operator-(const Doubles& x) {
    Doubles r;
    for (int i = 0; i < N; ++i) {
      r.v[i] = -x.v[i];
    }
    return r;
  }
};

template <int N>
struct Masks {
  __m256d m[N];
};

}  // namespace avx2

// N registers: each primitive is Lanes<__m256d>'s, register by register.
template <int N>
struct Lanes<avx2::Doubles<N>> {
  using D = avx2::Doubles<N>;
  using Mask = avx2::Masks<N>;
  using One = Lanes<__m256d>;
  static constexpr int kWidth = 4 * N;
  static D load(const double* x) {
    D r;
    for (int i = 0; i < N; ++i) {
      r.v[i] = One::load(x + 4 * i);
    }
    return r;
  }
  static void store(double* x, const D& v) {
    for (int i = 0; i < N; ++i) {
      One::store(x + 4 * i, v.v[i]);
    }
  }
  static D broadcast(double x) { return D(x); }
  template <typename F>
  static Mask compare(const D& x, const D& y, F f) {
    Mask r;
    for (int i = 0; i < N; ++i) {
      r.m[i] = f(x.v[i], y.v[i]);
    }
    return r;
  }
  static Mask less(const D& x, const D& y) { return compare(x, y, One::less); }
  static Mask less_equal(const D& x, const D& y) { return compare(x, y, One::less_equal); }
  static Mask greater(const D& x, const D& y) { return compare(x, y, One::greater); }
  static Mask equal(const D& x, const D& y) { return compare(x, y, One::equal); }
  static Mask both(const Mask& x, const Mask& y) {
    Mask r;
    for (int i = 0; i < N; ++i) {
      r.m[i] = One::both(x.m[i], y.m[i]);
    }
    return r;
  }
  static Mask either(const Mask& x, const Mask& y) {
    Mask r;
    for (int i = 0; i < N; ++i) {
      r.m[i] = One::either(x.m[i], y.m[i]);
    }
    return r;
  }
  static bool any(const Mask& x) {
    bool r = false;
    for (int i = 0; i < N; ++i) {
      r = r || One::any(x.m[i]);
    }
    return r;
  }
  static D select(const Mask& m, const D& x, const D& y) {
    D r;
    for (int i = 0; i < N; ++i) {
      r.v[i] = One::select(m.m[i], x.v[i], y.v[i]);
    }
    return r;
  }
  template <typename F>
  static D map(const D& x, F f) {
    D r;
    for (int i = 0; i < N; ++i) {
      r.v[i] = f(x.v[i]);
    }
    return r;
  }
  static D trunc(const D& x) { return map(x, One::trunc); }
  static D pow2(const D& k) { return map(k, One::pow2); }
  static D sqrt(const D& x) { return map(x, One::sqrt); }
  static D fma(const D& x, const D& y, const D& z) {
    D r;
    for (int i = 0; i < N; ++i) {
      r.v[i] = One::fma(x.v[i], y.v[i], z.v[i]);
    }
    return r;
  }
  static void split_exponent(const D& x, D* m, D* k) {
    for (int i = 0; i < N; ++i) {
      One::split_exponent(x.v[i], &m->v[i], &k->v[i]);
    }
  }
};

namespace avx2 {
// One word of each of 8 blocks, in each of four independent sets (one set's rounds are a
// latency-bound chain of multiplies).
struct Words {
  static constexpr int kSets = 4;
  __m256i set[kSets];
};
}  // namespace avx2

template <>
struct Lanes<avx2::Words> {
  using W = avx2::Words;
  static W broadcast(uint32_t x) {
    W r;
    for (__m256i& v : r.set) {
      v = _mm256_set1_epi32(static_cast<int>(x));
    }
    return r;
  }
  static W add(const W& x, const W& y) {
    W r;
    for (int i = 0; i < W::kSets; ++i) {
      r.set[i] = _mm256_add_epi32(x.set[i], y.set[i]);
    }
    return r;
  }
  static W xor3(const W& x, const W& y, const W& z) {
    W r;
    for (int i = 0; i < W::kSets; ++i) {
      r.set[i] = _mm256_xor_si256(_mm256_xor_si256(x.set[i], y.set[i]), z.set[i]);
    }
    return r;
  }
  static void multiply(const W& x, uint32_t m, W* hi, W* lo) {
    const __m256i mv = _mm256_set1_epi32(static_cast<int>(m));
    for (int i = 0; i < W::kSets; ++i) {
      const __m256i even = _mm256_mul_epu32(x.set[i], mv);
      const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x.set[i], 32), mv);
      lo->set[i] = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
      hi->set[i] = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
    }
  }
};

}  // namespace torchdefer::counter_math

namespace torchdefer::counter_simd {
namespace {

using counter_math::kTwoPow32;
using Words = counter_math::avx2::Words;

constexpr int kSets = Words::kSets;
constexpr int kGroupBlocks = 8 * kSets;
static_assert(kGroupBlocks == kAvx2GroupBlocks);
constexpr int kGroupVectors = 4 * kSets;  // vectors of eight words per group

// Philox4x32-10 on blocks base_block + 0 .. 31. In each set of eight, lane 4j + l of the counter
// holds block 2l + j of the set, so that the 4x4 transpose inside each 128-bit lane leaves
// out[4 * set + l] = the words of the set's blocks 2l and 2l + 1: eight consecutive elements.
void philox(uint64_t base_block, uint64_t stream, uint64_t seed, __m256i out[kGroupVectors]) {
  const __m256i offsets = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  Words c[4];
  for (int set = 0; set < kSets; ++set) {
    const uint64_t base = base_block + 8 * set;
    c[0].set[set] = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(base)), offsets);
    // The low word wrapped where it ended below its offset (unsigned compare via the sign bit);
    // the mask is -1 there, so subtracting it carries one into the high word.
    const __m256i carry =
        _mm256_cmpgt_epi32(_mm256_xor_si256(offsets, sign), _mm256_xor_si256(c[0].set[set], sign));
    c[1].set[set] = _mm256_sub_epi32(_mm256_set1_epi32(static_cast<int>(base >> 32)), carry);
    c[2].set[set] = _mm256_set1_epi32(static_cast<int>(stream));
    c[3].set[set] = _mm256_set1_epi32(static_cast<int>(stream >> 32));
  }
  using L = counter_math::Lanes<Words>;
  counter_math::philox_rounds<Words>(c, L::broadcast(static_cast<uint32_t>(seed)),
                                     L::broadcast(static_cast<uint32_t>(seed >> 32)));
  for (int set = 0; set < kSets; ++set) {
    const __m256i t0 = _mm256_unpacklo_epi32(c[0].set[set], c[1].set[set]);
    const __m256i t1 = _mm256_unpackhi_epi32(c[0].set[set], c[1].set[set]);
    const __m256i t2 = _mm256_unpacklo_epi32(c[2].set[set], c[3].set[set]);
    const __m256i t3 = _mm256_unpackhi_epi32(c[2].set[set], c[3].set[set]);
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

// Eight uniforms from eight words, in float32: a + (b − a)·u, u = (w >> 8)·2^-24, in double
// (store8 applies the wrap at `to`, in the output dtype).
__m256 uniform8(__m256i words, double from, double range) {
  const __m256i top = _mm256_srli_epi32(words, 8);  // < 2^24: converts as signed
  const __m256d lo = from + range * (_mm256_cvtepi32_pd(_mm256_castsi256_si128(top)) * 0x1p-24);
  const __m256d hi =
      from + range * (_mm256_cvtepi32_pd(_mm256_extracti128_si256(top, 1)) * 0x1p-24);
  return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
}

// float32 to float16 bits, to nearest even (F16C); NaN becomes its sign and 0x7E00, as
// c10::Half does.
__m128i to_half(__m256 f) {
  const __m128i h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m128i nan = _mm_packs_epi32(
      _mm256_castsi256_si128(_mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q))),
      _mm256_extracti128_si256(_mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q)), 1));
  const __m128i quiet =
      _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(-0x8000)), _mm_set1_epi16(0x7E00));
  return _mm_blendv_epi8(h, quiet, nan);
}

// float32 to bfloat16 bits, to nearest even; NaN becomes 0x7FC0, as c10::BFloat16 does.
__m128i to_bfloat16(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i bias = _mm256_add_epi32(
      _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7FFF));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
  // Values below 2^16 in every 32-bit lane: an unsigned saturating pack keeps them as they are.
  return _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
}

// The 16-bit dtypes' bits back to float32, for the wrap's comparison.
__m256 from_half(__m128i h) { return _mm256_cvtph_ps(h); }
__m256 from_bfloat16(__m128i b) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
}

// Uniform's last step: a value that rounds to `to` in the output dtype becomes `from`.
struct Wrap {
  bool enabled = false;
  float to = 0;            // `to` rounded to the dtype, as float32
  float from = 0;          // float32 output
  uint16_t from_bits = 0;  // 16-bit outputs
};

template <Dtype D>
Wrap make_wrap(bool enabled, double from, double to) {
  Wrap w;
  w.enabled = enabled;
  w.to = static_cast<float>(to);
  w.from = static_cast<float>(from);
  if constexpr (D == Dtype::kHalf) {
    w.to = _mm_cvtss_f32(_mm256_castps256_ps128(from_half(to_half(_mm256_set1_ps(w.to)))));
    w.from_bits = static_cast<uint16_t>(_mm_extract_epi16(to_half(_mm256_set1_ps(w.from)), 0));
  } else if constexpr (D == Dtype::kBFloat16) {
    w.to = _mm_cvtss_f32(_mm256_castps256_ps128(from_bfloat16(to_bfloat16(_mm256_set1_ps(w.to)))));
    w.from_bits = static_cast<uint16_t>(_mm_extract_epi16(to_bfloat16(_mm256_set1_ps(w.from)), 0));
  }
  return w;
}

// Stores eight consecutive float32 values rounded to D, with the uniform's wrap.
template <Dtype D>
void store8(void* out, int64_t index, __m256 f, const Wrap& wrap) {
  if constexpr (D == Dtype::kFloat) {
    if (wrap.enabled) {
      f = _mm256_blendv_ps(f, _mm256_set1_ps(wrap.from),
                           _mm256_cmp_ps(f, _mm256_set1_ps(wrap.to), _CMP_EQ_OQ));
    }
    _mm256_storeu_ps(static_cast<float*>(out) + index, f);
  } else {
    __m128i bits = D == Dtype::kHalf ? to_half(f) : to_bfloat16(f);
    if (wrap.enabled) {
      const __m256 value = D == Dtype::kHalf ? from_half(bits) : from_bfloat16(bits);
      const __m256i wrapped =
          _mm256_castps_si256(_mm256_cmp_ps(value, _mm256_set1_ps(wrap.to), _CMP_EQ_OQ));
      const __m128i mask =
          _mm_packs_epi32(_mm256_castsi256_si128(wrapped), _mm256_extracti128_si256(wrapped, 1));
      bits = _mm_blendv_epi8(bits, _mm_set1_epi16(static_cast<short>(wrap.from_bits)), mask);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + index), bits);
  }
}

// Eight float32 normals from eight words: each 64-bit lane is one Box–Muller pair, u1 from its
// low word and u2 from its high word, the even element cos and the odd one sin.
__m256 normal8(__m256i words, double mean, double std) {
  const __m256d u1 = (unsigned_to_double(low_words(words)) + 1.0) / kTwoPow32;
  const __m256d u2 = unsigned_to_double(low_words(_mm256_srli_epi64(words, 32))) / kTwoPow32;
  __m256d c, s;
  counter_math::box_muller<__m256d>(u1, u2, &c, &s);
  const __m256d cos_value = mean + std * c;
  const __m256d sin_value = mean + std * s;
  // Pairs 0..3 to elements c0 s0 c1 s1 | c2 s2 c3 s3.
  const __m256d even = _mm256_unpacklo_pd(cos_value, sin_value);  // c0 s0 | c2 s2
  const __m256d odd = _mm256_unpackhi_pd(cos_value, sin_value);   // c1 s1 | c3 s3
  const __m256d first = _mm256_permute2f128_pd(even, odd, 0x20);
  const __m256d second = _mm256_permute2f128_pd(even, odd, 0x31);
  return _mm256_set_m128(_mm256_cvtpd_ps(second), _mm256_cvtpd_ps(first));
}

// Sixteen truncated normals in float32 from two vectors of words (Note [Vectorized truncated
// normal]), as counter_math::truncated_normal_value computes them: the uniform over
// [u_low, u_high), u = (w >> 8)·2^-24, then clamp(mean + std·(√2·erfinv(u)), low, high), erfinv's
// ±1 and NaN lanes included, and NaN as the x86 default NaN.
void truncated_normal16(const Job& job, const __m256i* words, __m256 (&out)[2]) {
  using Chains = counter_math::avx2::Doubles<4>;
  Chains u;
  for (int i = 0; i < 2; ++i) {
    const __m256i top = _mm256_srli_epi32(words[i], 8);  // < 2^24: converts as signed
    u.v[2 * i] = _mm256_cvtepi32_pd(_mm256_castsi256_si128(top));
    u.v[2 * i + 1] = _mm256_cvtepi32_pd(_mm256_extracti128_si256(top, 1));
  }
  u = job.u_low + (job.u_high - job.u_low) * (u * 0x1p-24);
  const __m256d sign = _mm256_set1_pd(-0.0);
  const __m256d one = _mm256_set1_pd(1.0);
  const __m256d nan =
      _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<int64_t>(0xfff8000000000000ull)));
  __m256d negative[4], special[4], unit[4];
  Chains a;
  for (int i = 0; i < 4; ++i) {
    const __m256d magnitude = _mm256_andnot_pd(sign, u.v[i]);
    negative[i] = _mm256_cmp_pd(u.v[i], _mm256_setzero_pd(), _CMP_LT_OQ);
    special[i] = _mm256_cmp_pd(magnitude, one, _CMP_NLT_UQ);  // ±1 and NaN
    unit[i] = _mm256_cmp_pd(magnitude, one, _CMP_EQ_OQ);
    a.v[i] = _mm256_andnot_pd(special[i], magnitude);
  }
  const Chains g = counter_math::erfinv_magnitude<Chains>(a);
  __m128 values[4];
  for (int i = 0; i < 4; ++i) {
    __m256d x = _mm256_blendv_pd(
        g.v[i], _mm256_blendv_pd(nan, _mm256_set1_pd(__builtin_inf()), unit[i]), special[i]);
    x = _mm256_xor_pd(x, _mm256_and_pd(negative[i], sign));
    __m256d value = job.a + job.b * (counter_math::kSqrt2 * x);
    const __m256d low = _mm256_set1_pd(job.low);
    const __m256d high = _mm256_set1_pd(job.high);
    const __m256d below = _mm256_cmp_pd(value, low, _CMP_LT_OQ);
    const __m256d above = _mm256_cmp_pd(value, high, _CMP_GT_OQ);
    value = _mm256_blendv_pd(value, high, above);
    value = _mm256_blendv_pd(value, low, below);
    value = _mm256_blendv_pd(value, nan, _mm256_cmp_pd(value, value, _CMP_UNORD_Q));
    values[i] = _mm256_cvtpd_ps(value);
  }
  out[0] = _mm256_set_m128(values[1], values[0]);
  out[1] = _mm256_set_m128(values[3], values[2]);
}

}  // namespace

void erfinv_avx2(const double* u, double* out, int64_t count) {
  using counter_math::avx2::Doubles;
  counter_math::erfinv_lanes<Doubles<2>>(u, out, count);
}

namespace {

template <Dtype D>
int64_t fill(const Job& job) {
  constexpr int64_t kPerGroup = 4 * kGroupBlocks;
  const int64_t groups = job.count / kPerGroup;
  const Wrap wrap = make_wrap<D>(job.op == Op::kUniform, job.a, job.b);
  __m256i words[kGroupVectors];
  for (int64_t g = 0; g < groups; ++g) {
    philox(job.first / 4 + kGroupBlocks * static_cast<uint64_t>(g), job.stream, job.seed, words);
    const int64_t index = kPerGroup * g;
    if (job.op == Op::kTruncatedNormal) {
      for (int v = 0; v < kGroupVectors; v += 2) {
        __m256 values[2];
        truncated_normal16(job, words + v, values);
        store8<D>(job.out, index + 8 * v, values[0], wrap);
        store8<D>(job.out, index + 8 * v + 8, values[1], wrap);
      }
      continue;
    }
    for (int v = 0; v < kGroupVectors; ++v) {
      const __m256 values = job.op == Op::kUniform ? uniform8(words[v], job.a, job.b - job.a)
                                                   : normal8(words[v], job.a, job.b);
      store8<D>(job.out, index + 8 * v, values, wrap);
    }
  }
  return groups * kPerGroup;
}

}  // namespace

int64_t fill_avx2(const Job& job) {
  if (job.op != Op::kUniform && job.op != Op::kNormal && job.op != Op::kTruncatedNormal) {
    return 0;
  }
  switch (job.dtype) {
    case Dtype::kFloat:
      return fill<Dtype::kFloat>(job);
    case Dtype::kHalf:
      return fill<Dtype::kHalf>(job);
    case Dtype::kBFloat16:
      return fill<Dtype::kBFloat16>(job);
    case Dtype::kDouble:
      break;
  }
  return 0;
}

}  // namespace torchdefer::counter_simd
