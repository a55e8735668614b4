#include "meta_rules.h"

#include <torchdefer/core_kernels.h>
#include <torchdefer/op_table.h>

#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/result_type.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace torchdefer::detail {
namespace {

at::Tensor like(const at::Tensor& t) { return at::empty_like(t); }

at::Tensor meta_empty(c10::IntArrayRef sizes, const at::Tensor& options_from,
                      c10::ScalarType dtype) {
  return at::empty(sizes, options_from.options().dtype(dtype));
}

// The dtype batch-norm statistics are kept in: float for reduced-precision inputs.
c10::ScalarType stats_dtype(const at::Tensor& input) {
  const c10::ScalarType dtype = input.scalar_type();
  return dtype == at::kHalf || dtype == at::kBFloat16 ? at::kFloat : dtype;
}

}  // namespace

namespace meta_rules {

Outputs same_shape(Arguments args) { return {like(args[0].toTensor())}; }

// abs of a complex tensor is real.
Outputs abs(Arguments args) {
  const at::Tensor& self = args[0].toTensor();
  return {meta_empty(self.sizes(), self, c10::toRealValueType(self.scalar_type()))};
}

Outputs in_place(Arguments args) { return {args[0]}; }

Outputs with_empty_buffer(Arguments args) {
  const at::Tensor& self = args[0].toTensor();
  return {like(self), meta_empty({0}, self, self.scalar_type())};
}

Outputs where_self(Arguments args) {
  const at::Tensor& condition = args[0].toTensor();
  const at::Tensor& self = args[1].toTensor();
  const at::Tensor& other = args[2].toTensor();
  const auto sizes = at::infer_size_dimvector(
      at::infer_size_dimvector(condition.sizes(), self.sizes()), other.sizes());
  return {meta_empty(sizes, self, at::result_type(self, other))};
}

Outputs index_select(Arguments args) {
  const at::Tensor& self = args[0].toTensor();
  const int64_t dim = c10::maybe_wrap_dim(args[1].toInt(), std::max<int64_t>(self.dim(), 1));
  const at::Tensor& index = args[2].toTensor();
  std::vector<int64_t> sizes = self.sizes().vec();
  if (!sizes.empty()) {
    sizes[dim] = index.numel();
  }
  return {meta_empty(sizes, self, self.scalar_type())};
}

namespace {

Outputs batch_norm_outputs(const at::Tensor& input, bool training, int extra_outputs) {
  const int64_t channels = input.dim() > 1 ? input.size(1) : 1;
  const int64_t stats = training ? channels : 0;
  Outputs outputs = {like(input), meta_empty({stats}, input, stats_dtype(input)),
                     meta_empty({stats}, input, stats_dtype(input))};
  for (int i = 0; i < extra_outputs; ++i) {
    outputs.emplace_back(meta_empty({0}, input, at::kByte));
  }
  return outputs;
}

}  // namespace

// native_batch_norm / _native_batch_norm_legit(input, weight, bias, running_mean, running_var,
// training, momentum, eps)
Outputs batch_norm(Arguments args) {
  return batch_norm_outputs(args[0].toTensor(), args[5].toBool(), 0);
}

// _native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
Outputs batch_norm_no_stats(Arguments args) {
  return batch_norm_outputs(args[0].toTensor(), args[3].toBool(), 0);
}

// _batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps)
Outputs batch_norm_with_update(Arguments args) {
  return batch_norm_outputs(args[0].toTensor(), /*training=*/true, /*extra_outputs=*/1);
}

// cudnn_batch_norm(input, weight, bias, running_mean, running_var, training,
// exponential_average_factor, epsilon): what batch_norm picks on CUDA where cuDNN is built in,
// which LibTorch gives no C++ Meta kernel. Its reserve space is cuDNN's workspace, sized by cuDNN
// on the device; batch_norm drops it, so its fake is empty.
Outputs cudnn_batch_norm(Arguments args) {
  return batch_norm_outputs(args[0].toTensor(), args[5].toBool(), /*extra_outputs=*/1);
}

// native_dropout(input, p, train)
Outputs native_dropout(Arguments args) {
  const at::Tensor& input = args[0].toTensor();
  return {like(input), meta_empty(input.sizes(), input, at::kBool)};
}

// _adaptive_avg_pool2d(self, output_size)
Outputs adaptive_avg_pool2d(Arguments args) {
  const at::Tensor& self = args[0].toTensor();
  std::vector<int64_t> sizes(self.sizes().begin(), self.sizes().end() - 2);
  for (int64_t s : args[1].toIntVector()) {
    sizes.push_back(s);
  }
  return {meta_empty(sizes, self, self.scalar_type())};
}

namespace {

// A per-dimension parameter given once for all spatial dimensions or once per dimension.
int64_t per_dim(const std::vector<int64_t>& values, int64_t d) {
  return values.size() == 1 ? values[0] : values.at(static_cast<size_t>(d));
}

}  // namespace

// convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
Outputs convolution(Arguments args) {
  const at::Tensor& input = args[0].toTensor();
  const at::Tensor& weight = args[1].toTensor();
  const std::vector<int64_t> stride = args[3].toIntVector();
  const std::vector<int64_t> padding = args[4].toIntVector();
  const std::vector<int64_t> dilation = args[5].toIntVector();
  const bool transposed = args[6].toBool();
  const std::vector<int64_t> output_padding = args[7].toIntVector();
  const int64_t groups = args[8].toInt();
  TORCH_CHECK(input.dim() == weight.dim(), "convolution: expected a batched input of ",
              weight.dim(), " dimensions for a weight of ", weight.dim(), " dimensions, got ",
              input.sizes());
  std::vector<int64_t> sizes = {input.size(0),
                                transposed ? weight.size(1) * groups : weight.size(0)};
  for (int64_t d = 0; d + 2 < input.dim(); ++d) {
    const int64_t in = input.size(d + 2);
    const int64_t kernel =
        dilation.empty() ? weight.size(d + 2) : per_dim(dilation, d) * (weight.size(d + 2) - 1) + 1;
    const int64_t out = transposed
                            ? (in - 1) * per_dim(stride, d) - 2 * per_dim(padding, d) + kernel +
                                  per_dim(output_padding, d)
                            : (in + 2 * per_dim(padding, d) - kernel) / per_dim(stride, d) + 1;
    TORCH_CHECK(out > 0, "convolution: calculated output size ", out, " along spatial dimension ",
                d, " is too small for input ", input.sizes(), " and weight ", weight.sizes());
    sizes.push_back(out);
  }
  return {meta_empty(sizes, input, input.scalar_type())};
}

// _thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias, hidden_bias)
Outputs fused_lstm_cell(Arguments args) {
  const at::Tensor& gates = args[0].toTensor();
  const at::Tensor& cx = args[2].toTensor();
  return {like(cx), like(cx), like(gates)};
}

// mkldnn_rnn_layer(input, weight0..3, hx_, cx_, reverse, batch_sizes, mode, hidden_size,
// num_layers, has_biases, bidirectional, batch_first, train)
Outputs mkldnn_rnn_layer(Arguments args) {
  const at::Tensor& input = args[0].toTensor();
  const int64_t hidden_size = args[10].toInt();
  // [seq, batch] or [batch, seq] (batch_first): the output keeps the input's order.
  const std::vector<int64_t> sizes = {input.size(0), input.size(1), hidden_size};
  return {meta_empty(sizes, input, input.scalar_type()), like(args[5].toTensor()),
          like(args[6].toTensor()), meta_empty({0}, input, at::kByte)};
}

// randperm(n, *, [generator,] dtype=long, layout, device, pin_memory)
Outputs randperm(Arguments args) {
  c10::ScalarType dtype = at::kLong;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i].isInt()) {
      dtype = static_cast<c10::ScalarType>(args[i].toInt());
      break;
    }
  }
  return {at::empty({args[0].toInt()}, at::TensorOptions().dtype(dtype).device(at::kMeta))};
}

// geqrf(self): the Householder vectors `a`, shaped like self and batched column-major as LAPACK
// writes them, and `tau`, one scalar per reflection: [*batch, min(m, n)].
Outputs geqrf(Arguments args) {
  const at::Tensor& self = args[0].toTensor();
  TORCH_CHECK(self.dim() >= 2, "geqrf: expected a matrix or a batch of matrices, got ",
              self.sizes());
  const int64_t m = self.size(-2);
  const int64_t n = self.size(-1);
  std::vector<int64_t> transposed = self.sizes().vec();
  std::swap(transposed[transposed.size() - 1], transposed[transposed.size() - 2]);
  std::vector<int64_t> tau(self.sizes().begin(), self.sizes().end() - 2);
  tau.push_back(std::min(m, n));
  return {meta_empty(transposed, self, self.scalar_type()).mT(),
          meta_empty(tau, self, self.scalar_type())};
}

namespace {

// The sizes of `self` reduced over `dims` (all dimensions when empty or absent).
std::vector<int64_t> reduced_sizes(const at::Tensor& self, const c10::IValue& dims, bool keepdim) {
  if (self.dim() == 0) {
    return {};  // a 0-dim tensor reduces to itself, whichever dimension (0 or -1) is named
  }
  std::vector<bool> reduced(static_cast<size_t>(self.dim()), dims.isNone());
  if (!dims.isNone()) {
    const std::vector<int64_t> list = dims.toIntVector();
    if (list.empty()) {
      std::fill(reduced.begin(), reduced.end(), true);
    }
    for (int64_t d : list) {
      const auto wrapped = static_cast<size_t>(c10::maybe_wrap_dim(d, self.dim()));
      TORCH_CHECK(!reduced[wrapped], "dimension ", d,
                  " appears more than once in the reduction's dims ", c10::IntArrayRef(list),
                  ", as eager refuses.");
      reduced[wrapped] = true;
    }
  }
  std::vector<int64_t> sizes;
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (!reduced[static_cast<size_t>(d)]) {
      sizes.push_back(self.size(d));
    } else if (keepdim) {
      sizes.push_back(1);
    }
  }
  return sizes;
}

// The dtype a sum or product accumulates in: integers (and bool) in long, unless one is given.
c10::ScalarType accumulated_dtype(const at::Tensor& self, const c10::IValue& dtype) {
  if (!dtype.isNone()) {
    return static_cast<c10::ScalarType>(dtype.toInt());
  }
  const c10::ScalarType own = self.scalar_type();
  return c10::isIntegralType(own, /*includeBool=*/true) ? at::kLong : own;
}

Outputs values_and_indices_along(const at::Tensor& self, int64_t dim, bool keepdim) {
  std::vector<int64_t> sizes = self.sizes().vec();
  if (!sizes.empty()) {
    const int64_t wrapped = c10::maybe_wrap_dim(dim, self.dim());
    if (keepdim) {
      sizes[static_cast<size_t>(wrapped)] = 1;
    } else {
      sizes.erase(sizes.begin() + wrapped);
    }
  }
  return {meta_empty(sizes, self, self.scalar_type()), meta_empty(sizes, self, at::kLong)};
}

}  // namespace

Outputs full_reduction(Arguments args) {
  const at::Tensor& self = args[0].toTensor();
  return {meta_empty({}, self, self.scalar_type())};
}

Outputs full_extremum(Arguments args) {
  const at::Tensor& self = args[0].toTensor();
  TORCH_CHECK(self.numel() > 0, "max()/min() of an empty tensor ", self.sizes(),
              " has no value, as in eager; give the reduction a dim.");
  return {meta_empty({}, self, self.scalar_type())};
}

// prod(self, *, dtype=None)
Outputs full_reduction_to_long(Arguments args) {
  const at::Tensor& self = args[0].toTensor();
  const c10::IValue none;
  return {meta_empty({}, self, accumulated_dtype(self, args.size() > 1 ? args[1] : none))};
}

Outputs trace(Arguments args) {
  const at::Tensor& self = args[0].toTensor();
  TORCH_CHECK(self.dim() == 2, "trace() of a ", self.dim(),
              "-dimensional tensor: trace takes a matrix, as in eager.");
  return full_reduction_to_long(args);
}

// std/var.correction(self, dim=None, *, correction=None, keepdim=False)
void check_variance_dtype(const at::Tensor& self) {
  TORCH_CHECK(at::isFloatingType(self.scalar_type()) || at::isComplexType(self.scalar_type()),
              "std/var of a ", self.scalar_type(),
              " tensor: they take floating or complex tensors only, as in eager.");
}

Outputs variance(Arguments args) {
  const at::Tensor& self = args[0].toTensor();
  check_variance_dtype(self);
  return {meta_empty(reduced_sizes(self, args[1], args[3].toBool()), self,
                     c10::toRealValueType(self.scalar_type()))};
}

// std_mean/var_mean.correction(self, dim=None, *, correction=None, keepdim=False)
Outputs variance_and_mean(Arguments args) {
  const at::Tensor& self = args[0].toTensor();
  check_variance_dtype(self);
  const std::vector<int64_t> sizes = reduced_sizes(self, args[1], args[3].toBool());
  return {meta_empty(sizes, self, c10::toRealValueType(self.scalar_type())),
          meta_empty(sizes, self, self.scalar_type())};
}

// median.dim(self, dim, keepdim), mode(self, dim, keepdim), kthvalue(self, k, dim, keepdim): the
// last two arguments are the dimension and keepdim.
Outputs values_and_indices(Arguments args) {
  const size_t n = args.size();
  const at::Tensor& self = args[0].toTensor();
  const int64_t dim = args[n - 2].toInt();
  const int64_t size = self.dim() == 0 ? 1 : self.size(c10::maybe_wrap_dim(dim, self.dim()));
  TORCH_CHECK(size > 0, "median/mode/kthvalue along dimension ", dim, " of size 0 of a tensor ",
              self.sizes(), " has no value, as in eager.");
  if (n == 4) {  // kthvalue(self, k, dim, keepdim)
    const int64_t k = args[1].toInt();
    TORCH_CHECK(k >= 1 && k <= size, "kthvalue(k=", k, ") along dimension ", dim, " of size ", size,
                ": k must be in [1, ", size, "], as in eager.");
  }
  return values_and_indices_along(self, dim, args[n - 1].toBool());
}

// cummax/cummin(self, dim): both outputs contiguous, as ATen's kernels make them.
Outputs cumulative_values_and_indices(Arguments args) {
  const at::Tensor& self = args[0].toTensor();
  return {meta_empty(self.sizes(), self, self.scalar_type()),
          meta_empty(self.sizes(), self, at::kLong)};
}

// count_nonzero.dim_IntList(self, dim): the dimensions are removed.
Outputs count_nonzero(Arguments args) {
  const at::Tensor& self = args[0].toTensor();
  return {meta_empty(reduced_sizes(self, args[1], /*keepdim=*/false), self, at::kLong)};
}

// nansum(self, dim=None, keepdim=False, *, dtype=None)
Outputs nansum(Arguments args) {
  const at::Tensor& self = args[0].toTensor();
  return {meta_empty(reduced_sizes(self, args[1], args[2].toBool()), self,
                     accumulated_dtype(self, args[3]))};
}

// Laid out like `self`, as TensorIterator lays out a pointwise op's output.
Outputs same_shape_bool(Arguments args) {
  const at::Tensor& self = args[0].toTensor();
  return {at::empty_like(self, self.options().dtype(at::kBool))};
}

Outputs broadcast_bool(Arguments args) {
  const at::Tensor& self = args[0].toTensor();
  const at::Tensor& other = args[1].toTensor();
  return {meta_empty(at::infer_size_dimvector(self.sizes(), other.sizes()), self, at::kBool)};
}

// searchsorted.Tensor(sorted_sequence, self, *, out_int32, right, side, sorter): shaped like
// `self`; searchsorted.Scalar: 0-dim.
Outputs searchsorted(Arguments args) {
  const at::Tensor& sorted = args[0].toTensor();
  const c10::ScalarType dtype = args[2].toBool() ? at::kInt : at::kLong;
  if (!args[1].isTensor()) {
    return {meta_empty({}, sorted, dtype)};
  }
  return {meta_empty(args[1].toTensor().sizes(), sorted, dtype)};
}

// _cdist_forward(x1, x2, p, compute_mode): [*broadcast batch, rows of x1, rows of x2].
Outputs cdist_forward(Arguments args) {
  const at::Tensor& x1 = args[0].toTensor();
  const at::Tensor& x2 = args[1].toTensor();
  TORCH_CHECK(x1.dim() >= 2 && x2.dim() >= 2, "cdist: expected at least 2-dimensional inputs, got ",
              x1.sizes(), " and ", x2.sizes());
  auto sizes = at::infer_size_dimvector(x1.sizes().slice(0, x1.dim() - 2),
                                        x2.sizes().slice(0, x2.dim() - 2));
  sizes.push_back(x1.size(-2));
  sizes.push_back(x2.size(-2));
  return {meta_empty(sizes, x1, x1.scalar_type())};
}

}  // namespace meta_rules

void meta_rule_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const OpInfo* info = find_op_info(op.operator_name());
  TORCH_INTERNAL_ASSERT(info != nullptr && info->meta != nullptr, "torchdefer: no meta rule for ",
                        op.operator_name());
  const size_t num_arguments = op.schema().arguments().size();
  meta_rules::Outputs outputs = info->meta(torch::jit::last(*stack, num_arguments));
  torch::jit::drop(*stack, num_arguments);
  for (c10::IValue& output : outputs) {
    torch::jit::push(*stack, std::move(output));
  }
}

}  // namespace torchdefer::detail
