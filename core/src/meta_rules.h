// Meta kernels for the ATen operators that have none in C++ (PyTorch registers theirs from
// Python), so that fake tensors work in a C++-only process too. The op table (op_table.cpp) says
// which op gets which rule; registrations.cpp registers them.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <vector>

namespace torchdefer::detail::meta_rules {

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
// (embedding calls index_select on meta tensors, below any hook of ours). Which ops have a rule is
// the op table's `meta` column; when a rule is registered (only where torch has no Meta kernel of
// its own) is Note [What loading torchdefer changes].

using Arguments = c10::ArrayRef<c10::IValue>;
using Outputs = std::vector<c10::IValue>;

Outputs same_shape(Arguments args);
Outputs abs(Arguments args);  // a complex input gives a real output
Outputs in_place(Arguments args);
Outputs with_empty_buffer(Arguments args);  // log_sigmoid_forward's (output, buffer)
Outputs where_self(Arguments args);
Outputs index_select(Arguments args);
Outputs batch_norm(Arguments args);
Outputs batch_norm_no_stats(Arguments args);
Outputs batch_norm_with_update(Arguments args);
Outputs cudnn_batch_norm(Arguments args);
Outputs native_dropout(Arguments args);
Outputs adaptive_avg_pool2d(Arguments args);
Outputs convolution(Arguments args);
Outputs fused_lstm_cell(Arguments args);
Outputs mkldnn_rnn_layer(Arguments args);
Outputs randperm(Arguments args);
Outputs geqrf(Arguments args);  // parametrizations.orthogonal's QR

// Note [Meta rules of value-reading reductions]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Init code reads statistics of the tensors it builds: `w.abs().max().item()`, `w.std()`,
// `torch.isnan(w).any()`, a median or a k-th value to clip by. The reduction itself is recorded
// (its value comes from the recording) and only the `item()` after it reads values (Note [Reading
// values while recording]); so the reduction must run on fakes, which takes a meta kernel. In a
// C++-only process these have none: the rules below shape and lay them out as their CPU kernels
// do, and refuse what those refuse (an empty max(), a vector's trace, an integer var, k out of
// range, a repeated dim), so a call eager rejects fails while recording, not at materialization.
Outputs full_reduction(Arguments args);          // median(), nanmedian(): 0-dim
Outputs full_extremum(Arguments args);           // max(), min(): 0-dim, of a non-empty tensor
Outputs full_reduction_to_long(Arguments args);  // prod(): integers accumulate in long
Outputs trace(Arguments args);                   // trace() of a matrix, as prod()
Outputs variance(Arguments args);                // std/var.correction: real dtype
Outputs variance_and_mean(Arguments args);       // std_mean/var_mean.correction
Outputs values_and_indices(Arguments args);  // median.dim, kthvalue, mode: (self, .., dim, keepdim)
Outputs cumulative_values_and_indices(Arguments args);  // cummax, cummin
Outputs count_nonzero(Arguments args);                  // count_nonzero.dim_IntList
Outputs nansum(Arguments args);
Outputs same_shape_bool(Arguments args);  // isnan, logical_not
Outputs broadcast_bool(Arguments args);   // logical_and, logical_or, logical_xor
Outputs searchsorted(Arguments args);     // searchsorted.Tensor and .Scalar
Outputs cdist_forward(Arguments args);

}  // namespace torchdefer::detail::meta_rules
