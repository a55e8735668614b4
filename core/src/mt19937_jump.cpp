#include <torchdefer/mt19937_jump.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

namespace torchdefer {
namespace {

constexpr int kN = 624;
constexpr int kM = 397;
constexpr int kDegree = 19937;
constexpr uint32_t kMatrixA = 0x9908b0df;
constexpr uint32_t kUpper = 0x80000000;
constexpr uint32_t kLower = 0x7fffffff;

using Window = std::array<uint32_t, kN>;

// A polynomial over GF(2): bit i of the vector is the coefficient of x^i.
using Poly = std::vector<uint64_t>;

constexpr size_t kPolyWords = (kDegree + 1 + 63) / 64;  // room for degree 19937 (φ itself)

bool bit(const Poly& p, size_t i) { return (p[i / 64] >> (i % 64)) & 1u; }
void flip(Poly& p, size_t i) { p[i / 64] ^= uint64_t{1} << (i % 64); }

uint32_t next_word(uint32_t x0, uint32_t x1, uint32_t x397) {
  const uint32_t y = (x0 & kUpper) | (x1 & kLower);
  return x397 ^ (y >> 1) ^ ((x1 & 1u) ? kMatrixA : 0u);
}

// A window of 624 consecutive words of the recurrence, as a ring, so that a step is O(1).
class Ring {
 public:
  Ring() { words_.fill(0); }
  explicit Ring(const Window& w) : words_(w) {}

  void step() {
    words_[start_] = next_word(words_[start_], words_[wrap(start_ + 1)], words_[wrap(start_ + kM)]);
    start_ = wrap(start_ + 1);
  }
  void add(const Window& w) {
    const int tail = kN - start_;
    for (int i = 0; i < tail; ++i) {
      words_[start_ + i] ^= w[i];
    }
    for (int i = tail; i < kN; ++i) {
      words_[i - tail] ^= w[i];
    }
  }
  uint32_t front() const { return words_[start_]; }
  Window window() const {
    Window w;
    for (int i = 0; i < kN; ++i) {
      w[i] = words_[wrap(start_ + i)];
    }
    return w;
  }

 private:
  static int wrap(int i) { return i >= kN ? i - kN : i; }
  Window words_;
  int start_ = 0;
};

// Berlekamp–Massey over GF(2): the minimal polynomial of the bit sequence `s` (length 2·degree),
// as connection polynomial C(x) = 1 + c1 x + ... + cL x^L. Returned reversed, so that it is the
// characteristic polynomial x^L + c1 x^(L-1) + ... + cL of the recurrence.
Poly minimal_polynomial(const std::vector<uint8_t>& s) {
  const size_t n = s.size();
  const size_t words = (n + 63) / 64 + 1;
  // r holds s reversed, so that sum_{i=1..L} c_i s[N-i] is a word-wise AND of C with a slice of r.
  Poly r(words + 1, 0);
  for (size_t j = 0; j < n; ++j) {
    if (s[n - 1 - j]) {
      flip(r, j);
    }
  }
  auto r_slice = [&](size_t offset, size_t w) {
    const size_t word = offset / 64 + w;
    const unsigned shift = offset % 64;
    const uint64_t low = word < r.size() ? r[word] : 0;
    const uint64_t high = word + 1 < r.size() ? r[word + 1] : 0;
    return shift == 0 ? low : (low >> shift) | (high << (64 - shift));
  };
  Poly c(words, 0), b(words, 0);
  c[0] = b[0] = 1;
  size_t length = 0;
  size_t m = 1;
  for (size_t i = 0; i < n; ++i) {
    // d = s[i] + sum_{k=1..L} c_k s[i-k]; with c_0 = 1 that is sum_{k=0..L} c_k r[n-1-i+k].
    uint64_t acc = 0;
    const size_t base = n - 1 - i;
    for (size_t w = 0; w * 64 <= length; ++w) {
      acc ^= c[w] & r_slice(base, w);
    }
    if (__builtin_parityll(acc) == 0) {
      ++m;
      continue;
    }
    Poly previous = c;
    const size_t word_shift = m / 64;
    const unsigned bit_shift = m % 64;
    for (size_t w = words; w-- > word_shift;) {
      const size_t from = w - word_shift;
      uint64_t v = b[from] << bit_shift;
      if (bit_shift != 0 && from > 0) {
        v |= b[from - 1] >> (64 - bit_shift);
      }
      c[w] ^= v;
    }
    if (2 * length <= i) {
      length = i + 1 - length;
      b = std::move(previous);
      m = 1;
    } else {
      ++m;
    }
  }
  Poly reversed(kPolyWords, 0);
  for (size_t k = 0; k <= length; ++k) {
    if (bit(c, k)) {
      flip(reversed, length - k);
    }
  }
  TORCH_INTERNAL_ASSERT(length == kDegree, "torchdefer: MT19937 recurrence has degree ", length);
  return reversed;
}

// Note [Reduction modulo φ by byte tables]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A jump squares a polynomial of degree < 19937 once per bit of its length and reduces the square
// modulo φ; the reduction is nearly all of a jump's time. Reducing bit by bit XORs one shifted φ
// per set bit above the degree (~10,000 of them). Instead, the bits above the degree are taken 64
// at a time, from the top: a 64-bit group at bit 19937 + 64m stands for
// sum_k c_k(x) · x^(19937 + 8k) · x^(64m) with bytes c_k, and c_k(x) · x^(19937 + 8k) mod φ is a
// precomputed row (8 byte lanes × 256 values, 5 MB, built once per process from φ). The row has
// degree < 19937, so XORed in at word m it lands below the group: the groups under it pick up its
// bits before they are read, and one aligned pass over 312 words per group replaces 64 single-bit
// steps.
class Characteristic {
 public:
  Characteristic() {
    // The low bits of consecutive untempered words, from an arbitrary nonzero state.
    at::mt19937 engine(5489);
    Ring ring(engine.data().state_);
    std::vector<uint8_t> sequence(2 * kDegree);
    for (auto& b : sequence) {
      ring.step();
      b = ring.front() & 1u;  // any fixed bit position obeys the same recurrence
    }
    Poly low = minimal_polynomial(sequence);
    flip(low, kDegree);  // x^19937 ≡ φ - x^19937 (mod φ)
    low.resize(kPolyWords);
    build_rows(std::move(low));
  }

  // Row c_k(x) · x^(19937 + 8k) mod φ, kPolyWords words.
  const uint64_t* row(int lane, uint64_t byte) const {
    return rows_.data() + (static_cast<size_t>(lane) * 256 + byte) * kPolyWords;
  }

 private:
  void build_rows(Poly power) {
    rows_.assign(size_t{8} * 256 * kPolyWords, 0);
    for (int lane = 0; lane < 8; ++lane) {
      for (int b = 0; b < 8; ++b) {
        // power = x^(19937 + 8·lane + b) mod φ; its row is the single bit b of the byte.
        uint64_t* single = mutable_row(lane, uint64_t{1} << b);
        std::copy(power.begin(), power.end(), single);
        times_x(power);
      }
      for (uint64_t byte = 3; byte < 256; ++byte) {
        const uint64_t lowest = byte & (~byte + 1);
        if (lowest == byte) {
          continue;
        }
        const uint64_t* rest = row(lane, byte ^ lowest);
        const uint64_t* bit_row = row(lane, lowest);
        uint64_t* out = mutable_row(lane, byte);
        for (size_t w = 0; w < kPolyWords; ++w) {
          out[w] = rest[w] ^ bit_row[w];
        }
      }
    }
  }

  uint64_t* mutable_row(int lane, uint64_t byte) {
    return rows_.data() + (static_cast<size_t>(lane) * 256 + byte) * kPolyWords;
  }

  // p · x mod φ for p of degree < 19937, while only the x^19937 row exists (lane 0, byte 1).
  void times_x(Poly& p) const {
    const bool overflow = bit(p, kDegree - 1);
    for (size_t w = kPolyWords; w-- > 0;) {
      p[w] = (p[w] << 1) | (w > 0 ? p[w - 1] >> 63 : 0);
    }
    if (overflow) {
      flip(p, kDegree);
      const uint64_t* x_degree = row(0, 1);
      for (size_t w = 0; w < kPolyWords; ++w) {
        p[w] ^= x_degree[w];
      }
    }
  }

  std::vector<uint64_t> rows_;
};

const Characteristic& characteristic() {
  static const Characteristic phi;
  return phi;
}

constexpr uint64_t kTopWordMask = (uint64_t{1} << (kDegree % 64)) - 1;

// The 64 bits of `p` from bit `first` on (zeros past its end).
uint64_t bits_from(const Poly& p, size_t first) {
  const size_t word = first / 64;
  const unsigned shift = first % 64;
  const uint64_t low = word < p.size() ? p[word] : 0;
  const uint64_t high = word + 1 < p.size() ? p[word + 1] : 0;
  return shift == 0 ? low : (low >> shift) | (high << (64 - shift));
}

// p mod φ, for p of degree < 2·19937 (Note [Reduction modulo φ by byte tables]).
void reduce(Poly& p) {
  const Characteristic& phi = characteristic();
  const size_t bits = p.size() * 64;
  for (size_t m = bits > kDegree ? (bits - kDegree + 63) / 64 : 0; m-- > 0;) {
    const uint64_t group = bits_from(p, kDegree + 64 * m);
    if (group == 0) {
      continue;
    }
    const uint64_t* r[8];
    for (int lane = 0; lane < 8; ++lane) {
      r[lane] = phi.row(lane, (group >> (8 * lane)) & 0xff);
    }
    // A nonzero group lies inside p, so the row's nonzero bits (below it) do too.
    const size_t words = std::min(kPolyWords, p.size() - m);
    uint64_t* out = p.data() + m;
    for (size_t w = 0; w < words; ++w) {
      out[w] ^= r[0][w] ^ r[1][w] ^ r[2][w] ^ r[3][w] ^ r[4][w] ^ r[5][w] ^ r[6][w] ^ r[7][w];
    }
  }
  p.resize(kPolyWords);
  p[kPolyWords - 1] &= kTopWordMask;
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

// x^k mod φ.
Poly x_power_mod(uint64_t k) {
  Poly g(kPolyWords, 0);
  g[0] = 1;
  for (int b = 63; b >= 0; --b) {
    Poly square(2 * kPolyWords, 0);
    for (size_t w = 0; w < kPolyWords; ++w) {
      square[2 * w] = spread(static_cast<uint32_t>(g[w]));
      square[2 * w + 1] = spread(static_cast<uint32_t>(g[w] >> 32));
    }
    reduce(square);
    g = std::move(square);
    if ((k >> b) & 1u) {
      Poly shifted(kPolyWords + 1, 0);
      for (size_t w = 0; w < kPolyWords; ++w) {
        shifted[w] |= g[w] << 1;
        shifted[w + 1] |= g[w] >> 63;
      }
      reduce(shifted);
      g = std::move(shifted);
    }
  }
  return g;
}

// The window `steps` words further along the recurrence.
Window advance_window(const Window& window, uint64_t steps) {
  Ring ring(window);
  constexpr uint64_t kShortJump = 16 * kN;
  if (steps <= kShortJump) {
    for (uint64_t i = 0; i < steps; ++i) {
      ring.step();
    }
    return ring.window();
  }
  // One step first: the low 31 bits of the window's first word never influence the future, so
  // only after a step does the window lie in the space φ annihilates (Note [MT19937 jump-ahead]).
  ring.step();
  const Window start = ring.window();
  const Poly g = x_power_mod(steps - 1);
  // Horner's rule a byte of g at a time (a sliding window): acc ← F^8·acc + (byte)(F)·start, with
  // the 256 combinations of F^0..F^7 applied to start tabled first. 8 steps and one add per byte
  // instead of one add per set bit.
  std::vector<Window> table(256);
  std::array<Window, 8> powers;
  Ring walker(start);
  for (auto& power : powers) {
    power = walker.window();
    walker.step();
  }
  table[0].fill(0);
  for (size_t byte = 1; byte < 256; ++byte) {
    const size_t lowest = byte & (~byte + 1);
    const Window& rest = table[byte ^ lowest];
    const Window& power = powers[__builtin_ctzll(lowest)];
    for (int i = 0; i < kN; ++i) {
      table[byte][i] = rest[i] ^ power[i];
    }
  }
  Ring acc;
  for (size_t chunk = (kDegree + 7) / 8; chunk-- > 0;) {
    for (int i = 0; i < 8; ++i) {
      acc.step();
    }
    const uint64_t byte = (g[chunk / 8] >> (8 * (chunk % 8))) & 0xff;
    if (byte != 0) {
      acc.add(table[byte]);
    }
  }
  return acc.window();
}

}  // namespace

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
