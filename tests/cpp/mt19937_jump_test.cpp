// MT19937 jump-ahead agrees with drawing one word at a time, at every block boundary.
#include <torchdefer/mt19937_jump.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace torchdefer {
namespace {

std::vector<uint32_t> next_words(at::mt19937& engine, int n) {
  std::vector<uint32_t> words(n);
  for (auto& w : words) {
    w = engine();
  }
  return words;
}

void expect_jump_matches_drawing(uint64_t seed, uint64_t warmup, uint64_t draws) {
  at::mt19937 drawn(seed);
  for (uint64_t i = 0; i < warmup; ++i) {
    drawn();
  }
  at::mt19937 jumped = drawn;
  for (uint64_t i = 0; i < draws; ++i) {
    drawn();
  }
  mt19937_discard(jumped, draws);
  EXPECT_EQ(next_words(jumped, 700), next_words(drawn, 700))
      << "seed " << seed << ", warm-up " << warmup << ", jump " << draws;
}

TEST(Mt19937Jump, MatchesDrawingForShortJumpsAcrossBlockBoundaries) {
  for (uint64_t warmup : {0, 1, 623, 624, 625, 1000}) {
    for (uint64_t draws : {0, 1, 2, 622, 623, 624, 625, 1247, 1248, 1249, 5000}) {
      expect_jump_matches_drawing(42, warmup, draws);
    }
  }
}

TEST(Mt19937Jump, MatchesDrawingForLongJumps) {
  for (uint64_t warmup : {0, 7, 624}) {
    for (uint64_t draws : {10'000, 10'001, 624 * 777, 3'000'017}) {
      expect_jump_matches_drawing(2024, warmup, draws);
    }
  }
}

// The generator's untempered words from `seed`: the seeded state, then `more` words of the
// recurrence.
std::vector<uint32_t> untempered_words(uint64_t seed, int more) {
  const at::mt19937_data_pod pod = at::mt19937(seed).data();
  std::vector<uint32_t> words(pod.state_.begin(), pod.state_.end());
  for (int i = 0; i < more; ++i) {
    const size_t k = words.size() - 624;
    const uint32_t y = (words[k] & 0x80000000u) | (words[k + 1] & 0x7fffffffu);
    words.push_back(words[k + 397] ^ (y >> 1) ^ ((words[k + 1] & 1u) ? 0x9908b0dfu : 0u));
  }
  return words;
}

TEST(Mt19937Jump, CharacteristicPolynomialAnnihilatesEveryBitOfTheGeneratorsWords) {
  const auto& exponents = mt19937_characteristic_exponents();
  ASSERT_EQ(exponents.back(), 19937);
  const std::vector<uint32_t> words = untempered_words(5489, 19937 + 2000);
  // The first word's low 31 bits never reach the future, so the relation holds from word 1 on.
  for (size_t offset = 1; offset + 19937 < words.size(); offset += 7) {
    uint32_t sum = 0;
    for (const uint16_t e : exponents) {
      sum ^= words[offset + e];
    }
    ASSERT_EQ(sum, 0u) << "at word " << offset;
  }
}

TEST(Mt19937Jump, ComposesWithItself) {
  at::mt19937 once(7);
  at::mt19937 twice(7);
  mt19937_discard(once, 200'000'000'000);
  mt19937_discard(twice, 123'456'789'012);
  mt19937_discard(twice, 200'000'000'000 - 123'456'789'012);
  EXPECT_EQ(next_words(once, 1000), next_words(twice, 1000));
}

}  // namespace
}  // namespace torchdefer
