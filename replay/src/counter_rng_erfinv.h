// erfinv over a chunk of elements with vector lanes (Note [Vectorized truncated normal]), for the
// kernel translation unit that includes it: its Lanes<V> adds kWidth, load and store.
#pragma once

#include "counter_math.h"

#include <cstdint>

namespace torchdefer::counter_math {
inline namespace TORCHDEFER_COUNTER_ISA {

// out[i] = erfinv(u[i]) for i < count ≤ kMaxCount, bit for bit. Every element first takes the
// central region's lanes; those of the tail, about a tenth of a trunc_normal_ with wide bounds,
// are gathered into lanes of their own, since computing both regions in every lane would cost
// each element the tail's 600 divisions. ±1 and NaN take the scalar function. The tail's lane
// type T is wider than the central one's, V: its continued fraction is a chain of divisions
// whose latency only more independent registers hide.
template <typename V, typename T, int64_t kMaxCount>
void erfinv_lanes(const double* u, double* out, int64_t count) {
  using L = Lanes<V>;
  constexpr int kWidth = L::kWidth;
  constexpr int kTailWidth = Lanes<T>::kWidth;
  double lanes[kWidth];
  double tail_lanes[kTailWidth];
  int64_t tail[kMaxCount];
  int64_t tails = 0;
  for (int64_t i = 0; i < count; i += kWidth) {
    const int64_t width = count - i < kWidth ? count - i : kWidth;
    for (int64_t l = 0; l < kWidth; ++l) {
      const double a = l < width ? (u[i + l] < 0 ? -u[i + l] : u[i + l]) : 0.0;
      lanes[l] = a <= 0.9 ? a : 0.0;
    }
    L::store(lanes, erfinv_central<V>(L::load(lanes)));
    for (int64_t l = 0; l < width; ++l) {
      const double v = u[i + l];
      const double a = v < 0 ? -v : v;
      if (!(a < 1.0)) {
        out[i + l] = erfinv(v);
      } else if (a > 0.9) {
        tail[tails++] = i + l;
      } else {
        out[i + l] = v < 0 ? -lanes[l] : lanes[l];
      }
    }
  }
  for (int64_t k = 0; k < tails; k += kTailWidth) {
    const int64_t width = tails - k < kTailWidth ? tails - k : kTailWidth;
    for (int64_t l = 0; l < kTailWidth; ++l) {
      const double v = l < width ? u[tail[k + l]] : 0.95;
      tail_lanes[l] = v < 0 ? -v : v;
    }
    Lanes<T>::store(tail_lanes, erfinv_tail<T>(Lanes<T>::load(tail_lanes)));
    for (int64_t l = 0; l < width; ++l) {
      const int64_t j = tail[k + l];
      out[j] = u[j] < 0 ? -tail_lanes[l] : tail_lanes[l];
    }
  }
}

}  // namespace TORCHDEFER_COUNTER_ISA
}  // namespace torchdefer::counter_math
