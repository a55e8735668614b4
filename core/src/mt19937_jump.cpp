#include <torchdefer/mt19937_jump.h>

#include <algorithm>
#include <array>
#include <vector>

namespace torchdefer {
namespace {

constexpr int kN = 624;
constexpr int kM = 397;
constexpr int kDegree = 19937;
constexpr uint32_t kMatrixA = 0x9908b0df;
constexpr uint32_t kUpper = 0x80000000;
constexpr uint32_t kLower = 0x7fffffff;

// The exponents of φ's terms (Note [MT19937 jump-ahead]), ascending: the minimal polynomial that
// Berlekamp–Massey finds on any fixed bit of the generator's untempered words.
// MtCharacteristic.AnnihilatesTheGeneratorsBits checks it against the generator.
constexpr std::array<uint16_t, 135> kPhiExponents = {
    0,     1189,  1416,  1585,  1643,  1870,  2493,  2773,  3000,  3227,  3454,  3681,  3908,
    4135,  4362,  4753,  5661,  6337,  6569,  7129,  7477,  7525,  7583,  7752,  7979,  8206,
    9505,  9901,  9969,  10128, 10693, 10761, 10920, 11089, 11147, 11157, 11215, 11321, 11374,
    11384, 11485, 11611, 11712, 11717, 11838, 11881, 11944, 11997, 12277, 12335, 12393, 12504,
    12509, 12620, 12673, 12731, 12736, 12789, 12905, 12958, 12963, 13137, 13185, 13190, 13243,
    13301, 13412, 13528, 13533, 13639, 13697, 13760, 13813, 13866, 14093, 14151, 14209, 14320,
    14325, 14436, 14547, 14552, 14605, 14721, 14774, 14779, 14953, 15001, 15006, 15059, 15117,
    15228, 15344, 15349, 15455, 15513, 15576, 15629, 15682, 15909, 15967, 16025, 16136, 16141,
    16252, 16363, 16368, 16421, 16537, 16590, 16595, 16817, 16822, 16875, 16933, 17044, 17160,
    17271, 17329, 17445, 17498, 17725, 17783, 17841, 17952, 18068, 18179, 18237, 18406, 18633,
    18691, 18860, 19087, 19314, 19937};
static_assert(kPhiExponents.back() == kDegree);

// φ's terms below x^19937 (x^19937 ≡ their sum, mod φ).
constexpr int kLowTerms = kPhiExponents.size() - 1;
constexpr int kHighestLowTerm = kPhiExponents[kLowTerms - 1];

// Note [Reduction modulo φ by its terms]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A jump squares a polynomial of degree < 19937 once per bit of its length and reduces the square
// modulo φ; the reduction is most of a squaring's time. φ is sparse: 135 terms, the highest below
// x^19937 being x^19314. So bits at and above a boundary B fold down as
// x^B ≡ x^(B − 19937)·(φ's 134 lower terms): one shifted XOR of the bits per term, each landing at
// least 623 bits lower. Folding 9 words (576 bits < 623) at a time from the top, the folded bits
// land wholly below the words being folded, so the words below pick them up before they are read.
// A fold shifts its 9 words once per distinct shift among the terms (55) and XORs them in 134
// times; the reduction of a square is ~47,000 word XORs, where taking 64-bit groups through byte
// tables of x^(19937 + 8k) mod φ (this file's previous scheme) read ~780,000 words and built 5 MB
// of tables per process. B is 19968, a word boundary, which keeps every fold word-aligned: between
// squarings a polynomial is kept "almost reduced" (degree < 19968), and its last 31 bits are folded
// once, at the end.
constexpr int kWords = 312;                 // an almost reduced polynomial: degree < 19968
constexpr int kAlmostDegree = 64 * kWords;  // 19968
constexpr int kFoldWords = 9;
static_assert(64 * kFoldWords + (kAlmostDegree - kDegree) + kHighestLowTerm < kAlmostDegree,
              "folded bits must land below the words they come from");

using Poly = std::array<uint64_t, kWords>;
// A square before its fold: degree < 2·19968, in words up to a whole number of folds.
constexpr int kFolds = (kWords + kFoldWords - 1) / kFoldWords;
using Product = std::array<uint64_t, kWords + kFolds * kFoldWords>;

// Where a term x^t of φ puts bits folded from x^19968 on: word and shift of x^(t + 31).
struct FoldTerm {
  int word;
  unsigned shift;
};

// φ's lower terms as fold targets, ordered by shift, so that a fold shifts its words once per
// distinct shift (55 of them) rather than once per term.
constexpr std::array<FoldTerm, kLowTerms> fold_terms() {
  std::array<FoldTerm, kLowTerms> terms{};
  for (int k = 0; k < kLowTerms; ++k) {
    const int at = kPhiExponents[k] + (kAlmostDegree - kDegree);
    FoldTerm term{at / 64, static_cast<unsigned>(at % 64)};
    int i = k;
    for (; i > 0 && terms[i - 1].shift > term.shift; --i) {
      terms[i] = terms[i - 1];
    }
    terms[i] = term;
  }
  return terms;
}
constexpr std::array<FoldTerm, kLowTerms> kFoldTerms = fold_terms();

// out[0..words] = the `words` words of h, shifted up by `shift` bits (< 64).
template <int words>
void shift_up(const uint64_t* h, unsigned shift, uint64_t* out) {
  if (shift == 0) {
    std::copy(h, h + words, out);
    out[words] = 0;
    return;
  }
  out[0] = h[0] << shift;
  for (int i = 1; i < words; ++i) {
    out[i] = (h[i] << shift) | (h[i - 1] >> (64 - shift));
  }
  out[words] = h[words - 1] >> (64 - shift);
}

// p mod φ, almost reduced, for p of degree < 2·19968 (Note [Reduction modulo φ by its terms]).
// Its XORs of ten words vectorize: compiled for AVX2 as well, a squaring takes ~21 µs instead of
// ~25 (BM_Mt19937Jump between 16.7M and 8·10^9 draws: 9 squarings more), with the same bits.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx2", "default")))
#endif
void fold(Product& p, Poly& out) {
  for (int f = kFolds; f-- > 0;) {
    uint64_t* folded = p.data() + kWords + f * kFoldWords;
    uint64_t h[kFoldWords];
    std::copy(folded, folded + kFoldWords, h);
    std::fill(folded, folded + kFoldWords, 0);
    uint64_t* base = p.data() + f * kFoldWords;
    uint64_t shifted[kFoldWords + 1];
    for (int k = 0; k < kLowTerms;) {
      const unsigned shift = kFoldTerms[k].shift;
      shift_up<kFoldWords>(h, shift, shifted);
      for (; k < kLowTerms && kFoldTerms[k].shift == shift; ++k) {
        uint64_t* dst = base + kFoldTerms[k].word;
        for (int i = 0; i <= kFoldWords; ++i) {
          dst[i] ^= shifted[i];
        }
      }
    }
  }
  std::copy(p.begin(), p.begin() + kWords, out.begin());
}

// Almost reduced p mod φ, fully reduced (degree < 19937).
void finish(Poly& p) {
  constexpr unsigned kTopShift = kDegree % 64;
  const uint64_t group = p[kWords - 1] >> kTopShift;
  p[kWords - 1] &= (uint64_t{1} << kTopShift) - 1;
  for (int k = 0; k < kLowTerms; ++k) {
    const int at = kPhiExponents[k];
    uint64_t shifted[2];
    shift_up<1>(&group, at % 64, shifted);
    p[at / 64] ^= shifted[0];
    p[at / 64 + 1] ^= shifted[1];
  }
}

uint64_t spread(uint32_t x) {
  uint64_t v = x;
  v = (v | (v << 16)) & 0x0000FFFF0000FFFFull;
  v = (v | (v << 8)) & 0x00FF00FF00FF00FFull;
  v = (v | (v << 4)) & 0x0F0F0F0F0F0F0F0Full;
  v = (v | (v << 2)) & 0x3333333333333333ull;
  v = (v | (v << 1)) & 0x5555555555555555ull;
  return v;
}

// x^k mod φ: square-and-multiply from the highest bits of k, which give a power of x below 19968
// without any reduction.
Poly x_power_mod(uint64_t k) {
  int low_bits = 0;
  while ((k >> low_bits) >= static_cast<uint64_t>(kAlmostDegree)) {
    ++low_bits;
  }
  Poly g{};
  const uint64_t start = k >> low_bits;
  g[start / 64] = uint64_t{1} << (start % 64);
  Product square{};
  for (int b = low_bits - 1; b >= 0; --b) {
    for (int w = 0; w < kWords; ++w) {
      square[2 * w] = spread(static_cast<uint32_t>(g[w]));
      square[2 * w + 1] = spread(static_cast<uint32_t>(g[w] >> 32));
    }
    if ((k >> b) & 1u) {  // times x: the square has degree < 2·19968 − 1
      for (int w = 2 * kWords - 1; w > 0; --w) {
        square[w] = (square[w] << 1) | (square[w - 1] >> 63);
      }
      square[0] <<= 1;
    }
    fold(square, g);
  }
  finish(g);
  return g;
}

uint32_t next_word(uint32_t x0, uint32_t x1, uint32_t x397) {
  const uint32_t y = (x0 & kUpper) | (x1 & kLower);
  return x397 ^ (y >> 1) ^ ((x1 & 1u) ? kMatrixA : 0u);
}

using Window = std::array<uint32_t, kN>;

// Consecutive words of the recurrence in one array, the current 624 at the end, so that a step
// appends a word and adding a window is one contiguous XOR. Moves its last window to the front
// when full.
class Sequence {
 public:
  explicit Sequence(const Window& w) : words_(kN + kRoom) {
    std::copy(w.begin(), w.end(), words_.begin());
  }

  void step() {
    if (start_ + kN == words_.size()) {
      std::copy(words_.end() - kN, words_.end(), words_.begin());
      start_ = 0;
    }
    uint32_t* x = words_.data() + start_;
    x[kN] = next_word(x[0], x[1], x[kM]);
    ++start_;
  }
  void add(const uint32_t* w) {
    uint32_t* x = words_.data() + start_;
    for (int i = 0; i < kN; ++i) {
      x[i] ^= w[i];
    }
  }
  const uint32_t* window() const { return words_.data() + start_; }
  Window window_copy() const {
    Window w;
    std::copy(window(), window() + kN, w.begin());
    return w;
  }

 private:
  static constexpr size_t kRoom = 16 * kN;
  std::vector<uint32_t> words_;
  size_t start_ = 0;
};

// g(F)·start, F the recurrence's step, by Horner's rule a byte of g at a time (a sliding window):
// acc ← F^8·acc + (byte)(F)·start, with the 256 combinations of F^0..F^7 applied to start tabled
// first. 8 steps and one add per byte instead of one add per set bit.
// The adds are most of its time, and they vectorize: it is compiled for AVX2 as well, which halves
// it where the CPU has it (the bits are the same either way).
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx2", "default")))
#endif
Window
apply_polynomial(const Poly& g, const Window& start) {
  std::vector<uint32_t> table(256 * kN, 0);
  Sequence powers(start);
  for (int b = 0; b < 8; ++b) {
    std::copy(powers.window(), powers.window() + kN, table.begin() + (size_t{1} << b) * kN);
    powers.step();
  }
  for (size_t byte = 3; byte < 256; ++byte) {
    const size_t lowest = byte & (~byte + 1);
    if (lowest == byte) {
      continue;
    }
    const uint32_t* rest = table.data() + (byte ^ lowest) * kN;
    const uint32_t* power = table.data() + lowest * kN;
    uint32_t* out = table.data() + byte * kN;
    for (int i = 0; i < kN; ++i) {
      out[i] = rest[i] ^ power[i];
    }
  }
  Sequence acc(Window{});
  for (size_t chunk = (kDegree + 7) / 8; chunk-- > 0;) {
    for (int i = 0; i < 8; ++i) {
      acc.step();
    }
    const uint64_t byte = (g[chunk / 8] >> (8 * (chunk % 8))) & 0xff;
    if (byte != 0) {
      acc.add(table.data() + byte * kN);
    }
  }
  return acc.window_copy();
}

// The window `steps` words further along the recurrence.
Window advance_window(const Window& window, uint64_t steps) {
  Sequence sequence(window);
  constexpr uint64_t kShortJump = 16 * kN;
  if (steps <= kShortJump) {
    for (uint64_t i = 0; i < steps; ++i) {
      sequence.step();
    }
    return sequence.window_copy();
  }
  // One step first: the low 31 bits of the window's first word never influence the future, so
  // only after a step does the window lie in the space φ annihilates (Note [MT19937 jump-ahead]).
  sequence.step();
  return apply_polynomial(x_power_mod(steps - 1), sequence.window_copy());
}

}  // namespace

const std::array<uint16_t, 135>& mt19937_characteristic_exponents() { return kPhiExponents; }

void discard_draws(at::CPUGeneratorImpl& generator, uint64_t draws) {
  if (draws == 0) {
    return;
  }
  at::mt19937 engine = generator.engine();
  mt19937_discard(engine, draws);
  generator.set_engine(engine);
}

at::Generator cpu_generator_at(const at::Tensor& state, uint64_t draws) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>();
  generator.set_state(state);
  discard_draws(*generator.get<at::CPUGeneratorImpl>(), draws);
  return generator;
}

void mt19937_discard(at::mt19937& engine, uint64_t draws) {
  if (draws == 0) {
    return;
  }
  at::mt19937_data_pod pod = engine.data();
  // Words of the current block already handed out; a freshly seeded engine (left_ == 1) has its
  // whole block consumed: the next draw regenerates.
  const uint64_t consumed = pod.left_ == 1 ? kN : pod.next_;
  const uint64_t target = consumed + draws;
  if (target > static_cast<uint64_t>(kN)) {
    const uint64_t blocks = (target - 1) / kN;
    pod.state_ = advance_window(pod.state_, blocks * kN);
    const uint64_t position = target - blocks * kN;
    pod.next_ = static_cast<uint32_t>(position);
    pod.left_ = static_cast<int>(kN + 1 - position);
  } else {
    pod.next_ = static_cast<uint32_t>(target);
    pod.left_ = static_cast<int>(kN + 1 - target);
  }
  engine.set_data(pod);
}

}  // namespace torchdefer
