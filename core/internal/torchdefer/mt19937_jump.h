// Skipping PyTorch's CPU random generator (MT19937) ahead by any number of draws, in time that
// grows with the logarithm of the jump, so that any random op of a recording can be replayed
// from its own draw offset.
#pragma once

#include <ATen/core/MT19937RNGEngine.h>

#include <cstdint>

namespace torchdefer {

// Advances `engine` exactly as `draws` calls of engine() would.
//
// Note [MT19937 jump-ahead]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// MT19937's untempered words follow a linear recurrence over GF(2) whose characteristic
// polynomial φ has degree 19937; jumping K words ahead applies x^K mod φ to the state
// (Haramoto, Matsumoto, L'Ecuyer, "Efficient jump ahead for F2-linear random number generators",
// 2008). φ is found once per process by Berlekamp–Massey on the generator's own output (a few
// tens of ms, with the reduction tables of Note [Reduction modulo φ by byte tables]), x^K mod φ by
// square-and-multiply (log2 K squarings of a 19937-bit polynomial), and the jump by Horner's rule
// a byte of x^K mod φ at a time on a 624-word window. PyTorch's engine regenerates its state a
// block of 624 words at a time; a jump moves whole blocks this way and sets the position inside
// the block. A jump costs a few milliseconds, growing with log K (BM_Mt19937Jump in
// bench/micro); short ones just run the recurrence.
void mt19937_discard(at::mt19937& engine, uint64_t draws);

}  // namespace torchdefer
