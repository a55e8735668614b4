// Meta kernels for the ATen operators that have none in C++ (PyTorch registers theirs from
// Python), so that fake tensors work in a C++-only process too.
#pragma once

namespace torchdefer::detail {

// Note [Meta rules]
// ~~~~~~~~~~~~~~~~~
// The Fake fallback computes outputs by running an op's meta kernel on meta shadows. In LibTorch
// 2.13, about 340 ATen ops with a CPU kernel have neither a C++ meta kernel nor a composite one;
// Python fills the gap from torch/_meta_registrations.py, which a C++ program never loads. Among
// them are ops that module forward passes use: relu, convolution, batch norm, dropout, where,
// index_select (inside embedding), the LSTM cells, randperm. A rule computes such an op's outputs
// from its meta arguments, the way the op's CPU kernel shapes them.
//
// Rules are registered as Meta kernels, because composite meta kernels call these ops internally
// (embedding calls index_select on meta tensors, below any hook of ours). A rule is registered
// only for an op that has no Meta kernel when torchdefer loads, so it never replaces PyTorch's
// own kernel, and in a Python process (where torch registers its Python meta kernels before any
// extension loads) it steps aside entirely. Loading torchdefer thus only makes meta tensors work
// for more ops; it never changes a result.
//
// Returns how many rules were registered (the rest had a Meta kernel already).
int register_meta_rules();

}  // namespace torchdefer::detail
