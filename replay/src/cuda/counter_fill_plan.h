// Which elements each thread of the CUDA counter fill writes, and how (Note [CUDA counter fill
// tiles]): host and device code, so that counter_fill_plan_test.cpp runs every thread of a launch
// on the CPU with the kernel's own code.
#pragma once

#include "counter_fill_cuda.h"

#include <cstdint>
#include <cstring>

namespace torchdefer::counter_cuda {

// Note [CUDA counter fill tiles]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The kernel writes at HBM speed only if a thread spends a few integer operations per element on
// finding it, and a warp's store instructions write 16 bytes per thread to adjacent addresses.
// The unit is a row, the last dimension of the merged layout (Note [Merged rows]), whose
// elements have consecutive global indices (its global stride is 1):
//
//  * A row is cut into pieces of 16 bytes' worth of elements (16 / sizeof(T)). Where the rows
//    are contiguous in `out` and `out` is aligned to its element size, the cuts fall on 16-byte
//    boundaries of memory: each row has a lead, the elements before its first boundary counted
//    back from one piece before the row, and every whole piece is written with one 16-byte
//    store. The row's head and tail pieces are partial and written element by element, as is
//    every piece of a strided row.
//  * A thread takes a tile: up to four pieces, 16 elements of up to 4 bytes (four Philox blocks
//    of 32-bit draws) or 8 of 8 bytes (four blocks of 64-bit draws). The row's pieces form as
//    many bands as a tile has pieces, and tile t of a row takes piece t of each band, so that
//    the threads of a warp, on consecutive tiles, store to consecutive 16-byte pieces: one
//    512-byte run per store instruction.
//  * Thread t of a launch of n threads takes tiles t, t + n, t + 2n, ...; tile u is tile u % K of
//    row u / K, K tiles per row. A tile costs one division per dimension (none in a one-row
//    layout), its elements none.
//  * Every element is math::element of its own global index. math::Draws keys what it keeps by
//    Philox block and by Box–Muller pair, so a piece that starts in the middle of either computes
//    it itself: the bits do not depend on where pieces begin, and are the CPU fill's.
// Where a row's first global index and its place in memory disagree modulo a piece (sizes that
// are not multiples of 4), a piece of 32-bit draws spans two Philox blocks instead of one. Whole
// tensors, and shards whose sizes are multiples of 4, agree; cutting at Philox blocks instead
// would leave the other rows with no aligned piece to store at once.

// 16 bytes of a row, stored at once.
struct alignas(16) Chunk {
  uint32_t words[4];
};

// How many pieces a tile has for elements of `element_size` bytes: 16 elements of up to 4 bytes,
// 8 of 8.
TORCHDEFER_HOST_DEVICE constexpr int pieces_per_tile(int element_size) {
  return element_size == 8 ? 4 : element_size;
}

// Elements with consecutive global indices, at `out` + offset + k · stride for k < count.
struct Piece {
  int64_t offset = 0;
  int64_t stride = 1;
  uint64_t global = 0;
  int count = 0;
  // A whole piece, contiguous, at a 16-byte aligned address: one 16-byte store.
  bool vector = false;
};

// Where tile t of a row starts: the row's first element in `out` and in the global numbering,
// and the row's lead.
struct TileRow {
  int64_t offset = 0;
  uint64_t global = 0;
  int64_t lead = 0;
  int64_t t = 0;
};

// A launch's tiles: what each thread of counter_fill_kernel reads of the layout.
struct FillPlan {
  Layout layout;  // at least one dimension
  int element_size = 1;
  int piece_elements = 16;  // 16 / element_size
  int pieces_per_tile = 1;
  // Rows are cut at 16-byte boundaries of memory: they are contiguous in `out`, and `out`,
  // `misalignment` bytes past a 16-byte boundary, is aligned to its element size.
  bool aligned_rows = false;
  uint32_t misalignment = 0;
  int64_t row_length = 1;
  int64_t tiles_per_row = 0;  // pieces per band
  int64_t tiles = 0;

  // The lead of a row at `row_offset` (elements of `out`).
  TORCHDEFER_HOST_DEVICE int64_t lead(int64_t row_offset) const {
    if (!aligned_rows) {
      return 0;
    }
    const uint64_t bytes =
        (misalignment + static_cast<uint64_t>(row_offset) * static_cast<uint64_t>(element_size)) &
        15u;
    const int64_t head = static_cast<int64_t>(((16u - bytes) & 15u) / element_size);
    return head == 0 ? 0 : piece_elements - head;
  }

  TORCHDEFER_HOST_DEVICE TileRow tile_row(int64_t u) const {
    const int last = layout.dims - 1;
    TileRow row;
    int64_t r = 0;
    row.t = u;
    if (last > 0) {
      r = u / tiles_per_row;
      row.t = u - r * tiles_per_row;
    }
    int64_t global = layout.start[last];
    for (int d = last - 1; d >= 0; --d) {
      const int64_t q = r / layout.sizes[d];
      const int64_t i = r - q * layout.sizes[d];
      r = q;
      row.offset += i * layout.strides[d];
      global += (layout.start[d] + i) * layout.global_strides[d];
    }
    row.global = static_cast<uint64_t>(global);
    row.lead = lead(row.offset);
    return row;
  }

  // Piece c of the tile: piece row.t + c · tiles_per_row of its row, empty past the row's end.
  TORCHDEFER_HOST_DEVICE Piece piece(const TileRow& row, int c) const {
    const int64_t j = row.t + c * tiles_per_row;
    const int64_t start = j * piece_elements - row.lead;
    const int64_t begin = start > 0 ? start : 0;
    const int64_t stop = start + piece_elements;
    const int64_t end = stop < row_length ? stop : row_length;
    Piece piece;
    piece.stride = layout.strides[layout.dims - 1];
    piece.offset = row.offset + begin * piece.stride;
    piece.global = row.global + static_cast<uint64_t>(begin);
    piece.count = end > begin ? static_cast<int>(end - begin) : 0;
    piece.vector = aligned_rows && piece.count == piece_elements;
    return piece;
  }
};

// The plan for filling `layout` at device address `out` with elements of `element_size` bytes.
inline FillPlan make_plan(const Layout& layout, const void* out, int element_size) {
  FillPlan plan;
  plan.layout = layout;
  if (plan.layout.dims == 0) {
    plan.layout.dims = 1;
    plan.layout.sizes[0] = 1;
    plan.layout.strides[0] = 1;
    plan.layout.start[0] = 0;
    plan.layout.global_strides[0] = 1;
  }
  const Layout& l = plan.layout;
  const int last = l.dims - 1;
  const auto address = reinterpret_cast<uintptr_t>(out);
  plan.element_size = element_size;
  plan.piece_elements = 16 / element_size;
  plan.pieces_per_tile = pieces_per_tile(element_size);
  plan.aligned_rows = l.strides[last] == 1 && address % static_cast<uintptr_t>(element_size) == 0;
  plan.misalignment = static_cast<uint32_t>(address & 15u);
  plan.row_length = l.sizes[last];
  int64_t rows = 1;
  // Whether every row has row 0's lead.
  bool same_lead = true;
  for (int d = 0; d < last; ++d) {
    rows *= l.sizes[d];
    same_lead = same_lead && (l.sizes[d] == 1 || (l.strides[d] * element_size) % 16 == 0);
  }
  const int64_t lead = !plan.aligned_rows || same_lead ? plan.lead(0) : plan.piece_elements - 1;
  const int64_t pieces = (lead + plan.row_length + plan.piece_elements - 1) / plan.piece_elements;
  plan.tiles_per_row = (pieces + plan.pieces_per_tile - 1) / plan.pieces_per_tile;
  plan.tiles = rows * plan.tiles_per_row;
  return plan;
}

// Calls f(piece) for each piece that thread `thread` of a launch of `threads` threads writes.
template <typename F>
TORCHDEFER_HOST_DEVICE inline void for_each_piece(const FillPlan& plan, int64_t thread,
                                                  int64_t threads, F&& f) {
  for (int64_t u = thread; u < plan.tiles; u += threads) {
    const TileRow row = plan.tile_row(u);
    for (int c = 0; c < plan.pieces_per_tile; ++c) {
      f(plan.piece(row, c));
    }
  }
}

// Appends an element's bytes to the end of a chunk, dropping its first element's: after
// 16 / sizeof(T) calls the chunk holds those elements in order (little-endian, as CUDA devices
// and the hosts that build this are). Shifts by constants only: a loop that indexed an array of
// the piece's values at run time would keep them in local memory, and unrolling the loop over
// math::element instead multiplies the kernel's code and compile time by the piece's length.
template <typename T>
TORCHDEFER_HOST_DEVICE inline void shift_in(Chunk& chunk, T value) {
  uint32_t* w = chunk.words;
  if constexpr (sizeof(T) == 8) {
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    w[0] = w[2];
    w[1] = w[3];
    w[2] = static_cast<uint32_t>(bits);
    w[3] = static_cast<uint32_t>(bits >> 32);
  } else if constexpr (sizeof(T) == 4) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    w[0] = w[1];
    w[1] = w[2];
    w[2] = w[3];
    w[3] = bits;
  } else {
    static_assert(sizeof(T) == 2 || sizeof(T) == 1);
    constexpr int kBits = 8 * sizeof(T);
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    w[0] = (w[0] >> kBits) | (w[1] << (32 - kBits));
    w[1] = (w[1] >> kBits) | (w[2] << (32 - kBits));
    w[2] = (w[2] >> kBits) | (w[3] << (32 - kBits));
    w[3] = (w[3] >> kBits) | (bits << (32 - kBits));
  }
}

// Writes one piece of `out` with the values of `params` (completed by math::for_dtype<T>).
template <typename T>
TORCHDEFER_HOST_DEVICE inline void fill_piece(T* out, const Piece& piece,
                                              const counter_math::ElementParams& params,
                                              counter_math::Draws& draws) {
  if (piece.vector) {
    Chunk chunk{};
    for (int k = 0; k < static_cast<int>(16 / sizeof(T)); ++k) {
      shift_in(chunk, counter_math::element<T>(params, draws, piece.global + k));
    }
#if defined(__CUDA_ARCH__)
    *reinterpret_cast<Chunk*>(out + piece.offset) = chunk;
#else
    std::memcpy(out + piece.offset, &chunk, sizeof(chunk));
#endif
    return;
  }
  for (int k = 0; k < piece.count; ++k) {
    out[piece.offset + k * piece.stride] =
        counter_math::element<T>(params, draws, piece.global + k);
  }
}

// What thread `thread` of a launch of `threads` threads writes.
template <typename T>
TORCHDEFER_HOST_DEVICE inline void fill_thread(T* out, const FillPlan& plan,
                                               const counter_math::ElementParams& params,
                                               int64_t thread, int64_t threads) {
  counter_math::Draws draws(params);
  for_each_piece(plan, thread, threads,
                 [&](const Piece& piece) { fill_piece<T>(out, piece, params, draws); });
}

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

// The launch's blocks of kThreadsPerBlock threads: one tile per thread, up to kMaxBlocks.
inline int64_t launch_blocks(const FillPlan& plan) {
  const int64_t blocks = (plan.tiles + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return blocks < kMaxBlocks ? blocks : kMaxBlocks;
}

}  // namespace torchdefer::counter_cuda
