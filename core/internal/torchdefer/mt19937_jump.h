// Skipping PyTorch's CPU random generator (MT19937) ahead by any number of draws, in time that
// grows with the logarithm of the jump, so that any random op of a recording can be replayed
// from its own draw offset.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/core/MT19937RNGEngine.h>
#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

namespace torchdefer {

// Advances `engine` exactly as `draws` calls of engine() would.
//
// Note [MT19937 jump-ahead]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// MT19937's untempered words follow a linear recurrence over GF(2) whose characteristic
// polynomial φ has degree 19937; jumping K words ahead applies x^K mod φ to the state
// (Haramoto, Matsumoto, L'Ecuyer, "Efficient jump ahead for F2-linear random number generators",
// 2008). φ has 135 terms and is a constant of this library (found once by Berlekamp–Massey on the
// generator's output, and checked against it by a test); x^K mod φ comes from square-and-multiply
// (log2 K − 14 squarings of a 19937-bit polynomial, each reduced by φ's terms: Note [Reduction
// modulo φ by its terms]), and the jump from Horner's rule a byte of x^K mod φ at a time on a
// 624-word window. PyTorch's engine regenerates its state a block of 624 words at a time; a jump
// moves whole blocks this way and sets the position inside the block. A jump costs well under a
// millisecond, growing with log K (BM_Mt19937Jump in bench/micro); short ones just run the
// recurrence.
void mt19937_discard(at::mt19937& engine, uint64_t draws);

// Moves `generator` `draws` words along its stream (mt19937_discard of its engine). The caller
// holds its mutex when others can reach it.
void discard_draws(at::CPUGeneratorImpl& generator, uint64_t draws);

// A new CPU generator at `state` (a CPU generator's get_state()) and then `draws` words further:
// a private copy of a recorded place on a stream.
at::Generator cpu_generator_at(const at::Tensor& state, uint64_t draws);

// The exponents of φ's nonzero terms, ascending (Note [MT19937 jump-ahead]), for the test that
// checks them against the generator.
const std::array<uint16_t, 135>& mt19937_characteristic_exponents();

}  // namespace torchdefer
