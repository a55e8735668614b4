// erfinv over a chunk of elements with vector lanes (Note [Vectorized truncated normal]), for the
// kernel translation unit that includes it: its Lanes<V> adds kWidth, load and store.
#pragma once

#include "counter_math.h"

#include <cstdint>

namespace torchdefer::counter_math {
inline namespace TORCHDEFER_COUNTER_ISA {

// out[i] = erfinv(u[i]) for i < count, bit for bit: erfinv_magnitude on the lanes of |u|, whose
// lanes of ±1 and NaN (given 0 there) take the scalar function afterwards.
template <typename V>
void erfinv_lanes(const double* u, double* out, int64_t count) {
  using L = Lanes<V>;
  constexpr int kWidth = L::kWidth;
  double lanes[kWidth];
  for (int64_t i = 0; i < count; i += kWidth) {
    const int64_t width = count - i < kWidth ? count - i : kWidth;
    for (int64_t l = 0; l < kWidth; ++l) {
      const double a = l < width ? (u[i + l] < 0 ? -u[i + l] : u[i + l]) : 0.0;
      lanes[l] = a < 1.0 ? a : 0.0;
    }
    L::store(lanes, erfinv_magnitude<V>(L::load(lanes)));
    for (int64_t l = 0; l < width; ++l) {
      const double v = u[i + l];
      const double a = v < 0 ? -v : v;
      out[i + l] = !(a < 1.0) ? erfinv(v) : (v < 0 ? -lanes[l] : lanes[l]);
    }
  }
}

}  // namespace TORCHDEFER_COUNTER_ISA
}  // namespace torchdefer::counter_math
