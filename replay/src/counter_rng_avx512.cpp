// AVX-512 kernels of the counter RNG (Note [Vectorized counter fill]). Compiled with
// -mavx512f -mavx512dq -mavx512bw -mavx512vl -ffp-contract=off (replay/CMakeLists.txt) and called
// only where counter_simd::avx512_available(). Every function below computes exactly what the
// scalar definition computes: the math is counter_math.h's, instantiated for AVX-512 lanes.
#include "counter_rng_simd.h"

#define TORCHDEFER_COUNTER_ISA avx512
#include "counter_math.h"

#include <immintrin.h>

#include <cstdint>

namespace torchdefer::counter_math {
namespace avx512 {

// N registers of eight float64 lanes, stepped together: each alone is a long chain of dependent
// multiplies and adds (polynomials in Horner form), and interleaving two keeps the
// floating-point units busy. A double converts to all lanes (the math's scalar constants).
template <int N>
struct Doubles {
  __m512d v[N];

  Doubles() = default;
  Doubles(double x) {  // NOLINT(google-explicit-constructor): the math's constants
    for (__m512d& r : v) {
      r = _mm512_set1_pd(x);
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
  __mmask8 m[N];
};

// One word of each of 16 blocks, in each of four independent sets (one set's rounds are a chain
// of dependent multiplies and permutes; interleaving four gives 2.5x the throughput on Zen 4).
struct Words {
  static constexpr int kSets = 4;
  __m512i set[kSets];
};

}  // namespace avx512

// Note [One definition of the counter math]: float64 lanes.
template <int N>
struct Lanes<avx512::Doubles<N>> {
  using D = avx512::Doubles<N>;
  using Mask = avx512::Masks<N>;
  static constexpr int kWidth = 8 * N;
  static D load(const double* x) {
    D r;
    for (int i = 0; i < N; ++i) {
      r.v[i] = _mm512_loadu_pd(x + 8 * i);
    }
    return r;
  }
  static void store(double* x, const D& v) {
    for (int i = 0; i < N; ++i) {
      _mm512_storeu_pd(x + 8 * i, v.v[i]);
    }
  }
  static D broadcast(double x) { return D(x); }
  template <int Predicate>
  static Mask compare(const D& x, const D& y) {
    Mask r;
    for (int i = 0; i < N; ++i) {
      r.m[i] = _mm512_cmp_pd_mask(x.v[i], y.v[i], Predicate);
    }
    return r;
  }
  static Mask less(const D& x, const D& y) { return compare<_CMP_LT_OQ>(x, y); }
  static Mask less_equal(const D& x, const D& y) { return compare<_CMP_LE_OQ>(x, y); }
  static Mask greater(const D& x, const D& y) { return compare<_CMP_GT_OQ>(x, y); }
  static Mask equal(const D& x, const D& y) { return compare<_CMP_EQ_OQ>(x, y); }
  static Mask both(const Mask& x, const Mask& y) {
    Mask r;
    for (int i = 0; i < N; ++i) {
      r.m[i] = x.m[i] & y.m[i];
    }
    return r;
  }
  static Mask either(const Mask& x, const Mask& y) {
    Mask r;
    for (int i = 0; i < N; ++i) {
      r.m[i] = x.m[i] | y.m[i];
    }
    return r;
  }
  static bool any(const Mask& x) {
    __mmask8 r = 0;
    for (int i = 0; i < N; ++i) {
      r |= x.m[i];
    }
    return r != 0;
  }
  static D select(const Mask& m, const D& x, const D& y) {
    D r;
    for (int i = 0; i < N; ++i) {
      r.v[i] = _mm512_mask_blend_pd(m.m[i], y.v[i], x.v[i]);
    }
    return r;
  }
  static D trunc(const D& x) {
    D r;
    for (int i = 0; i < N; ++i) {
      r.v[i] = _mm512_roundscale_pd(x.v[i], _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    }
    return r;
  }
  static void split_exponent(const D& x, D* m, D* k) {
    for (int i = 0; i < N; ++i) {
      const __m512i bits = _mm512_castpd_si512(x.v[i]);
      k->v[i] = _mm512_cvtepi64_pd(
          _mm512_sub_epi64(_mm512_and_si512(_mm512_srli_epi64(bits, 52), _mm512_set1_epi64(0x7ff)),
                           _mm512_set1_epi64(1023)));
      m->v[i] = _mm512_castsi512_pd(
          _mm512_or_si512(_mm512_and_si512(bits, _mm512_set1_epi64(0x000fffffffffffffll)),
                          _mm512_set1_epi64(0x3ff0000000000000ll)));
    }
  }
  static D pow2(const D& k) {
    D r;
    for (int i = 0; i < N; ++i) {
      const __m512i biased = _mm512_add_epi64(_mm512_cvtpd_epi64(k.v[i]), _mm512_set1_epi64(1023));
      r.v[i] = _mm512_castsi512_pd(_mm512_slli_epi64(biased, 52));
    }
    return r;
  }
  static D sqrt(const D& x) {
    D r;
    for (int i = 0; i < N; ++i) {
      r.v[i] = _mm512_sqrt_pd(x.v[i]);
    }
    return r;
  }
  static D fma(const D& x, const D& y, const D& z) {
    D r;
    for (int i = 0; i < N; ++i) {
      r.v[i] = _mm512_fmadd_pd(x.v[i], y.v[i], z.v[i]);
    }
    return r;
  }
};

// Philox's word lanes.
template <>
struct Lanes<avx512::Words> {
  using W = avx512::Words;
  static W broadcast(uint32_t x) {
    W r;
    for (__m512i& v : r.set) {
      v = _mm512_set1_epi32(static_cast<int>(x));
    }
    return r;
  }
  static W add(const W& x, const W& y) {
    W r;
    for (int i = 0; i < W::kSets; ++i) {
      r.set[i] = _mm512_add_epi32(x.set[i], y.set[i]);
    }
    return r;
  }
  static W xor3(const W& x, const W& y, const W& z) {
    W r;
    for (int i = 0; i < W::kSets; ++i) {
      r.set[i] = _mm512_ternarylogic_epi32(x.set[i], y.set[i], z.set[i], 0x96);
    }
    return r;
  }
  static void multiply(const W& x, uint32_t m, W* hi, W* lo) {
    const __m512i mv = _mm512_set1_epi32(static_cast<int>(m));
    // The high halves of the even and the odd lanes' 64-bit products, in one permute.
    const __m512i high_index =
        _mm512_setr_epi32(1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    for (int i = 0; i < W::kSets; ++i) {
      const __m512i even = _mm512_mul_epu32(x.set[i], mv);
      const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(x.set[i], 32), mv);
      hi->set[i] = _mm512_permutex2var_epi32(even, high_index, odd);
      lo->set[i] = _mm512_mullo_epi32(x.set[i], mv);
    }
  }
};

}  // namespace torchdefer::counter_math

namespace torchdefer::counter_simd {
namespace {

using counter_math::kTwoPow32;
using Words = counter_math::avx512::Words;
// Registers of float64 lanes that the math steps together: its polynomials and series are long
// chains of dependent multiplies and adds, whose latency only independent registers hide.
constexpr int kChains = 8;
using Chains = counter_math::avx512::Doubles<kChains>;

constexpr int kSets = Words::kSets;
constexpr int kGroupBlocks = 16 * kSets;
static_assert(kGroupBlocks == kAvx512GroupBlocks);
constexpr int kGroupVectors = 4 * kSets;  // vectors of 16 words per group

// Philox4x32-10 on blocks base_block + 0 .. 63. In each set of 16, lane 4j + l of the counter
// holds block 4l + j of the set, so that the 4x4 transpose inside each 128-bit lane at the end
// leaves out[4 * set + l] = the 16 words of the set's blocks 4l .. 4l + 3 in order: the words of
// consecutive elements.
void philox(uint64_t base_block, uint64_t stream, uint64_t seed, __m512i out[kGroupVectors]) {
  const __m512i offsets = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  Words c[4];
  for (int set = 0; set < kSets; ++set) {
    const uint64_t base = base_block + 16 * set;
    c[0].set[set] = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(base)), offsets);
    // The low counter word wrapped around in the lanes where it ended below its offset.
    const __mmask16 carry = _mm512_cmplt_epu32_mask(c[0].set[set], offsets);
    const __m512i hi = _mm512_set1_epi32(static_cast<int>(base >> 32));
    c[1].set[set] = _mm512_mask_add_epi32(hi, carry, hi, _mm512_set1_epi32(1));
    c[2].set[set] = _mm512_set1_epi32(static_cast<int>(stream));
    c[3].set[set] = _mm512_set1_epi32(static_cast<int>(stream >> 32));
  }
  using L = counter_math::Lanes<Words>;
  counter_math::philox_rounds<Words>(c, L::broadcast(static_cast<uint32_t>(seed)),
                                     L::broadcast(static_cast<uint32_t>(seed >> 32)));
  for (int set = 0; set < kSets; ++set) {
    const __m512i t0 = _mm512_unpacklo_epi32(c[0].set[set], c[1].set[set]);
    const __m512i t1 = _mm512_unpackhi_epi32(c[0].set[set], c[1].set[set]);
    const __m512i t2 = _mm512_unpacklo_epi32(c[2].set[set], c[3].set[set]);
    const __m512i t3 = _mm512_unpackhi_epi32(c[2].set[set], c[3].set[set]);
    out[4 * set] = _mm512_unpacklo_epi64(t0, t2);
    out[4 * set + 1] = _mm512_unpackhi_epi64(t0, t2);
    out[4 * set + 2] = _mm512_unpacklo_epi64(t1, t3);
    out[4 * set + 3] = _mm512_unpackhi_epi64(t1, t3);
  }
}

// The 32-bit words of 16 consecutive elements as doubles, first eight and last eight.
void words_to_double(__m512i words, __m512d* lo, __m512d* hi) {
  *lo = _mm512_cvtepu32_pd(_mm512_castsi512_si256(words));
  *hi = _mm512_cvtepu32_pd(_mm512_extracti64x4_epi64(words, 1));
}

// The truncated normal's value from its uniform u, as counter_math::truncated_normal_value
// computes it from erfinv(u): clamp(mean + std·(√2·erfinv(u)), low, high), erfinv's ±1 and NaN
// lanes included, and NaN as the x86 default NaN, which to_dtype stores.
Chains truncated_normal(const Job& job, const Chains& u) {
  const __m512d one = _mm512_set1_pd(1.0);
  __mmask8 negative[kChains], special[kChains], unit[kChains];
  Chains a;
  for (int i = 0; i < kChains; ++i) {
    const __m512d magnitude = _mm512_abs_pd(u.v[i]);
    negative[i] = _mm512_cmp_pd_mask(u.v[i], _mm512_setzero_pd(), _CMP_LT_OQ);
    special[i] = _mm512_cmp_pd_mask(magnitude, one, _CMP_NLT_UQ);  // ±1 and NaN
    unit[i] = _mm512_cmp_pd_mask(magnitude, one, _CMP_EQ_OQ);
    a.v[i] = _mm512_maskz_mov_pd(static_cast<__mmask8>(~special[i]), magnitude);
  }
  const Chains g = counter_math::erfinv_magnitude<Chains>(a);
  const __m512d infinity = _mm512_set1_pd(__builtin_inf());
  const __m512d nan =
      _mm512_castsi512_pd(_mm512_set1_epi64(static_cast<int64_t>(0xfff8000000000000ull)));
  Chains out;
  for (int i = 0; i < kChains; ++i) {
    __m512d x =
        _mm512_mask_blend_pd(special[i], g.v[i], _mm512_mask_blend_pd(unit[i], nan, infinity));
    x = _mm512_mask_xor_pd(x, negative[i], x, _mm512_set1_pd(-0.0));
    __m512d value = job.a + job.b * (counter_math::kSqrt2 * x);
    const __mmask8 below = _mm512_cmp_pd_mask(value, _mm512_set1_pd(job.low), _CMP_LT_OQ);
    const __mmask8 above = _mm512_cmp_pd_mask(value, _mm512_set1_pd(job.high), _CMP_GT_OQ);
    value = _mm512_mask_blend_pd(above, value, _mm512_set1_pd(job.high));
    value = _mm512_mask_blend_pd(below, value, _mm512_set1_pd(job.low));
    const __mmask8 unordered = _mm512_cmp_pd_mask(value, value, _CMP_UNORD_Q);
    out.v[i] = _mm512_mask_blend_pd(unordered, value, nan);
  }
  return out;
}

// e^x as counter_math::exp computes it: +∞ above 709.78 and 0 below −745.13, where the lanes'
// own values (replaced by 0 for exp_in_range) are not used.
Chains exp(const Chains& x) {
  __mmask8 over[kChains], under[kChains];
  Chains inside;
  for (int i = 0; i < kChains; ++i) {
    over[i] = _mm512_cmp_pd_mask(x.v[i], _mm512_set1_pd(709.78), _CMP_GT_OQ);
    under[i] = _mm512_cmp_pd_mask(x.v[i], _mm512_set1_pd(-745.13), _CMP_LT_OQ);
    inside.v[i] = _mm512_mask_blend_pd(over[i] | under[i], x.v[i], _mm512_setzero_pd());
  }
  Chains e = counter_math::exp_in_range<Chains>(inside);
  for (int i = 0; i < kChains; ++i) {
    e.v[i] = _mm512_mask_blend_pd(over[i], e.v[i], _mm512_set1_pd(__builtin_inf()));
    e.v[i] = _mm512_mask_blend_pd(under[i], e.v[i], _mm512_setzero_pd());
  }
  return e;
}

// Cauchy's a + b·tan(π(u − ½)) from its uniform u, as counter_math::element computes it.
Chains cauchy(const Job& job, const Chains& u) {
  Chains s, c;
  counter_math::sincos_2pi<Chains>((u - 0.5) * 0.5, &s, &c);
  return job.a + job.b * (s / c);
}

// Geometric's max(1, ⌈ln u / ln(1 − p)⌉) from its u ∈ (0, 1], as counter_math::element computes
// it: ⌈·⌉ through a truncation to int64 (x86's 0x8000000000000000 where it does not fit, as the
// scalar conversion gives).
Chains geometric(const Job& job, const Chains& u) {
  const Chains trials = counter_math::log<Chains>(u) / counter_math::log<double>(1.0 - job.a);
  Chains out;
  for (int i = 0; i < kChains; ++i) {
    const __m512d k = _mm512_cvtepi64_pd(_mm512_cvttpd_epi64(trials.v[i]));
    const __m512d ceiling = _mm512_mask_add_pd(k, _mm512_cmp_pd_mask(k, trials.v[i], _CMP_LT_OQ), k,
                                               _mm512_set1_pd(1.0));
    const __mmask8 above_one = _mm512_cmp_pd_mask(_mm512_set1_pd(1.0), ceiling, _CMP_LT_OQ);
    out.v[i] = _mm512_mask_blend_pd(above_one, _mm512_set1_pd(1.0), ceiling);
  }
  return out;
}

// The normal pair's two values for D's op: mean + std·z, or e to that (log-normal).
void normal_values(const Job& job, const Chains& c, const Chains& s, Chains* cos_value,
                   Chains* sin_value) {
  *cos_value = job.a + job.b * c;
  *sin_value = job.a + job.b * s;
  if (job.op == Op::kLogNormal) {
    *cos_value = exp(*cos_value);
    *sin_value = exp(*sin_value);
  }
}

// float32 to float16 bits, to nearest even; NaN becomes the sign and 0x7E00, as c10::Half does.
__m256i to_half(__m512 f) {
  const __m256i h = _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  const __m256i quiet =
      _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16(-0x8000)), _mm256_set1_epi16(0x7E00));
  return _mm256_mask_blend_epi16(nan, h, quiet);
}

// float32 to bfloat16 bits, to nearest even; NaN becomes 0x7FC0, as c10::BFloat16 does.
__m256i to_bfloat16(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i bias = _mm512_add_epi32(
      _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7FFF));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, _mm512_set1_epi32(0x7FC0)));
}

__m512 from_bfloat16(__m256i b) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// Uniform's last step: a value that rounds to `to` becomes `from` (compared in the dtype).
struct Wrap {
  bool enabled = false;
  double to = 0, from = 0;     // for float64
  float to_f = 0, from_f = 0;  // for float32, and the float32 value of to in 16-bit dtypes
  uint16_t from_bits = 0;      // from, in a 16-bit dtype
};

template <Dtype D>
Wrap make_wrap(bool enabled, double from, double to) {
  Wrap w;
  w.enabled = enabled;
  w.to = to;
  w.from = from;
  w.to_f = static_cast<float>(to);
  w.from_f = static_cast<float>(from);
  if constexpr (D == Dtype::kHalf) {
    w.to_f = _mm512_cvtss_f32(_mm512_cvtph_ps(to_half(_mm512_set1_ps(w.to_f))));
    w.from_bits = static_cast<uint16_t>(
        _mm256_extract_epi16(to_half(_mm512_set1_ps(static_cast<float>(from))), 0));
  } else if constexpr (D == Dtype::kBFloat16) {
    w.to_f = _mm512_cvtss_f32(from_bfloat16(to_bfloat16(_mm512_set1_ps(w.to_f))));
    w.from_bits = static_cast<uint16_t>(
        _mm256_extract_epi16(to_bfloat16(_mm512_set1_ps(static_cast<float>(from))), 0));
  }
  return w;
}

// Stores 16 consecutive values, computed in double, rounded to D.
template <Dtype D>
void store16(void* out, int64_t index, __m512d lo, __m512d hi, const Wrap& wrap) {
  if constexpr (D == Dtype::kDouble) {
    // Float64 reaches here only for bernoulli and random with a range of at most 2^32 (32-bit
    // draws, integers: nothing to wrap); its uniform takes wide_group, which wraps.
    double* dst = static_cast<double*>(out) + index;
    _mm512_storeu_pd(dst, lo);
    _mm512_storeu_pd(dst + 8, hi);
    return;
  }
  const __m512 f =
      _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)), _mm512_cvtpd_ps(hi), 1);
  if constexpr (D == Dtype::kFloat) {
    const __mmask16 wrapped =
        wrap.enabled ? _mm512_cmp_ps_mask(f, _mm512_set1_ps(wrap.to_f), _CMP_EQ_OQ) : 0;
    _mm512_storeu_ps(static_cast<float*>(out) + index,
                     _mm512_mask_blend_ps(wrapped, f, _mm512_set1_ps(wrap.from_f)));
  } else {
    __m256i bits;
    __m512 value;
    if constexpr (D == Dtype::kHalf) {
      bits = to_half(f);
      value = _mm512_cvtph_ps(bits);
    } else {
      bits = to_bfloat16(f);
      value = from_bfloat16(bits);
    }
    const __mmask16 wrapped =
        wrap.enabled ? _mm512_cmp_ps_mask(value, _mm512_set1_ps(wrap.to_f), _CMP_EQ_OQ) : 0;
    bits = _mm256_mask_blend_epi16(wrapped, bits,
                                   _mm256_set1_epi16(static_cast<short>(wrap.from_bits)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + index), bits);
  }
}

// Eight Box–Muller pairs as 16 consecutive elements: c0 s0 c1 s1 ... (the even element cos).
void interleave(__m512d c, __m512d s, __m512d* lo, __m512d* hi) {
  *lo = _mm512_permutex2var_pd(c, _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11), s);
  *hi = _mm512_permutex2var_pd(c, _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15), s);
}

// 32-bit draws: 16 elements per vector of words.
template <Dtype D>
void narrow_group(const Job& job, int64_t index, const __m512i words[kGroupVectors],
                  const Wrap& wrap) {
  if (job.op == Op::kNormal || job.op == Op::kLogNormal) {
    // Each 64-bit lane is one pair: u1 from its low word, u2 from its high word.
    for (int v = 0; v < kGroupVectors; v += kChains) {
      Chains u1, u2, c, s;
      for (int i = 0; i < kChains; ++i) {
        const __m512i w = words[v + i];
        u1.v[i] = (_mm512_cvtepu32_pd(_mm512_cvtepi64_epi32(w)) + 1.0) / kTwoPow32;
        u2.v[i] = _mm512_cvtepu32_pd(_mm512_cvtepi64_epi32(_mm512_srli_epi64(w, 32))) / kTwoPow32;
      }
      counter_math::box_muller<Chains>(u1, u2, &c, &s);
      Chains cos_value, sin_value;
      normal_values(job, c, s, &cos_value, &sin_value);
      for (int i = 0; i < kChains; ++i) {
        __m512d lo, hi;
        interleave(cos_value.v[i], sin_value.v[i], &lo, &hi);
        store16<D>(job.out, index + 16 * (v + i), lo, hi, wrap);
      }
    }
    return;
  }
  if (job.op == Op::kExponential || job.op == Op::kTruncatedNormal || job.op == Op::kCauchy ||
      job.op == Op::kGeometric) {
    // Two registers of elements per vector of words.
    for (int v = 0; v < kGroupVectors; v += kChains / 2) {
      Chains x;
      for (int i = 0; i < kChains / 2; ++i) {
        const bool whole_word = job.op == Op::kExponential || job.op == Op::kGeometric;
        const __m512i w = whole_word ? words[v + i] : _mm512_srli_epi32(words[v + i], 8);
        words_to_double(w, &x.v[2 * i], &x.v[2 * i + 1]);
      }
      Chains value;
      if (job.op == Op::kExponential) {
        // −ln(u)/λ, u = (w + 1)·2^-32.
        value = -counter_math::log<Chains>((x + 1.0) / kTwoPow32) / job.a;
      } else if (job.op == Op::kCauchy) {
        value = cauchy(job, x * 0x1p-24);  // u = (w >> 8)·2^-24
      } else if (job.op == Op::kGeometric) {
        value = geometric(job, (x + 1.0) / kTwoPow32);  // u = (w + 1)·2^-32
      } else {
        // The uniform over [u_low, u_high), u = (w >> 8)·2^-24.
        value = truncated_normal(job, job.u_low + (job.u_high - job.u_low) * (x * 0x1p-24));
      }
      for (int i = 0; i < kChains / 2; ++i) {
        store16<D>(job.out, index + 16 * (v + i), value.v[2 * i], value.v[2 * i + 1], wrap);
      }
    }
    return;
  }
  for (int v = 0; v < kGroupVectors; ++v) {
    __m512d lo, hi;
    switch (job.op) {
      case Op::kUniform: {
        // a + (b − a)·u, u = (w >> 8)·2^-24.
        words_to_double(_mm512_srli_epi32(words[v], 8), &lo, &hi);
        const double range = job.b - job.a;
        lo = job.a + range * (lo * 0x1p-24);
        hi = job.a + range * (hi * 0x1p-24);
        break;
      }
      case Op::kRandom: {
        // from + draw mod range, exactly: the quotient in double is off by at most one, which
        // the remainder's sign and size correct.
        const __m512i range = _mm512_set1_epi64(static_cast<int64_t>(job.range));
        const __m512d range_d = _mm512_set1_pd(static_cast<double>(job.range));
        __m512d halves[2];
        for (int h = 0; h < 2; ++h) {
          const __m512i draw = _mm512_cvtepu32_epi64(
              h == 0 ? _mm512_castsi512_si256(words[v]) : _mm512_extracti64x4_epi64(words[v], 1));
          const __m512i q = _mm512_cvttpd_epi64(_mm512_div_pd(_mm512_cvtepi64_pd(draw), range_d));
          __m512i r = _mm512_sub_epi64(draw, _mm512_mullo_epi64(q, range));
          r = _mm512_mask_add_epi64(r, _mm512_cmplt_epi64_mask(r, _mm512_setzero_si512()), r,
                                    range);
          r = _mm512_mask_sub_epi64(r, _mm512_cmpge_epi64_mask(r, range), r, range);
          halves[h] = _mm512_cvtepi64_pd(_mm512_add_epi64(r, _mm512_set1_epi64(job.from)));
        }
        lo = halves[0];
        hi = halves[1];
        break;
      }
      case Op::kBernoulli: {
        words_to_double(words[v], &lo, &hi);
        const __m512d p = _mm512_set1_pd(job.a);
        const __mmask8 lo_true = _mm512_cmp_pd_mask(lo / kTwoPow32, p, _CMP_LT_OQ);
        const __mmask8 hi_true = _mm512_cmp_pd_mask(hi / kTwoPow32, p, _CMP_LT_OQ);
        lo = _mm512_maskz_mov_pd(lo_true, _mm512_set1_pd(1.0));
        hi = _mm512_maskz_mov_pd(hi_true, _mm512_set1_pd(1.0));
        break;
      }
      case Op::kNormal:
      case Op::kLogNormal:
      case Op::kExponential:
      case Op::kCauchy:
      case Op::kGeometric:
      case Op::kTruncatedNormal:
        break;
    }
    store16<D>(job.out, index + 16 * v, lo, hi, wrap);
  }
}

// The top 53 bits of 64-bit draws, as doubles.
__m512d top53(__m512i x) { return _mm512_cvtepu64_pd(_mm512_srli_epi64(x, 11)); }

// 64-bit draws (float64 only): 8 elements per vector of words.
void wide_group(const Job& job, int64_t index, const __m512i words[kGroupVectors],
                const Wrap& wrap) {
  double* out = static_cast<double*>(job.out) + index;
  if (job.op == Op::kNormal || job.op == Op::kLogNormal) {
    // A pair per block: u1 from the block's first 64-bit word, u2 from its second.
    const __m512i first = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
    const __m512i second = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
    for (int v = 0; v < kGroupVectors; v += 2 * kChains) {
      Chains u1, u2, c, s;
      for (int i = 0; i < kChains; ++i) {
        const __m512i a = words[v + 2 * i];
        const __m512i b = words[v + 2 * i + 1];
        u1.v[i] = (top53(_mm512_permutex2var_epi64(a, first, b)) + 1.0) * 0x1p-53;
        u2.v[i] = top53(_mm512_permutex2var_epi64(a, second, b)) * 0x1p-53;
      }
      counter_math::box_muller<Chains>(u1, u2, &c, &s);
      Chains cos_value, sin_value;
      normal_values(job, c, s, &cos_value, &sin_value);
      for (int i = 0; i < kChains; ++i) {
        __m512d lo, hi;
        interleave(cos_value.v[i], sin_value.v[i], &lo, &hi);
        _mm512_storeu_pd(out + 8 * (v + 2 * i), lo);
        _mm512_storeu_pd(out + 8 * (v + 2 * i) + 8, hi);
      }
    }
    return;
  }
  if (job.op == Op::kExponential || job.op == Op::kTruncatedNormal || job.op == Op::kCauchy ||
      job.op == Op::kGeometric) {
    for (int v = 0; v < kGroupVectors; v += kChains) {
      Chains x;
      for (int i = 0; i < kChains; ++i) {
        x.v[i] = top53(words[v + i]);
      }
      const Chains value =
          job.op == Op::kExponential ? -counter_math::log<Chains>((x + 1.0) * 0x1p-53) / job.a
          : job.op == Op::kGeometric ? geometric(job, (x + 1.0) * 0x1p-53)
          : job.op == Op::kCauchy
              ? cauchy(job, x * 0x1p-53)
              : truncated_normal(job, job.u_low + (job.u_high - job.u_low) * (x * 0x1p-53));
      for (int i = 0; i < kChains; ++i) {
        _mm512_storeu_pd(out + 8 * (v + i), value.v[i]);
      }
    }
    return;
  }
  for (int v = 0; v < kGroupVectors; ++v) {
    __m512d value = job.a + (job.b - job.a) * (top53(words[v]) * 0x1p-53);
    const __mmask8 wrapped = _mm512_cmp_pd_mask(value, _mm512_set1_pd(wrap.to), _CMP_EQ_OQ);
    value = _mm512_mask_blend_pd(wrapped, value, _mm512_set1_pd(wrap.from));
    _mm512_storeu_pd(out + 8 * v, value);
  }
}

template <Dtype D>
int64_t fill(const Job& job) {
  // Random's width is its range's (the caller sends only 32-bit draws here), not the dtype's.
  const bool wide = D == Dtype::kDouble && job.op != Op::kBernoulli && job.op != Op::kRandom;
  const int64_t per_block = wide ? 2 : 4;
  const int64_t per_group = per_block * kGroupBlocks;
  const int64_t groups = job.count / per_group;
  const Wrap wrap = make_wrap<D>(job.op == Op::kUniform, job.a, job.b);
  const uint64_t first_block = job.first / per_block;
  __m512i words[kGroupVectors];
  for (int64_t g = 0; g < groups; ++g) {
    philox(first_block + kGroupBlocks * static_cast<uint64_t>(g), job.stream, job.seed, words);
    if (wide) {
      wide_group(job, g * per_group, words, wrap);
    } else {
      narrow_group<D>(job, g * per_group, words, wrap);
    }
  }
  return groups * per_group;
}

}  // namespace

int64_t fill_avx512(const Job& job) {
  switch (job.dtype) {
    case Dtype::kFloat:
      return fill<Dtype::kFloat>(job);
    case Dtype::kDouble:
      return fill<Dtype::kDouble>(job);
    case Dtype::kHalf:
      return fill<Dtype::kHalf>(job);
    case Dtype::kBFloat16:
      return fill<Dtype::kBFloat16>(job);
  }
  return 0;
}

}  // namespace torchdefer::counter_simd
