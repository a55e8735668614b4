// Region replay (Note [Region replay]).
#include <torchdefer/region_replay.h>

#include <torchdefer/boxed_arguments.h>
#include <torchdefer/counter_rng.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/enum_tag.h>
#include <ATen/ops/empty.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <limits>
#include <string_view>
#include <utility>

#include <torchdefer/replay.h>
#include "recorded_ops.h"

namespace torchdefer::detail {
namespace {

// How a value's index space sits in its storage's base value (Note [Region replay]).
struct BoxView {
  std::vector<int64_t> base_dim;  // per view dimension; -1 for an inserted size-1 dimension
  std::vector<int64_t> origin;    // per base dimension: the view's first coordinate
};

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) {
    strides[d - 1] = strides[d] * std::max<int64_t>(sizes[d], 1);
  }
  return strides;
}

std::optional<BoxView> box_view(const RecordedValue& view, const RecordedValue& base) {
  if (view.dtype != base.dtype || base.strides != contiguous_strides(base.sizes)) {
    return std::nullopt;
  }
  const size_t rank = base.sizes.size();
  BoxView box;
  box.origin.assign(rank, 0);
  int64_t offset = view.storage_offset - base.storage_offset;
  for (size_t d = 0; d < rank; ++d) {
    box.origin[d] = offset / base.strides[d];
    offset %= base.strides[d];
  }
  if (offset != 0) {
    return std::nullopt;
  }
  std::vector<bool> used(rank, false);
  for (size_t j = 0; j < view.sizes.size(); ++j) {
    int64_t match = -1;
    for (size_t d = 0; d < rank && match < 0; ++d) {
      if (!used[d] && base.strides[d] == view.strides[j] &&
          box.origin[d] + view.sizes[j] <= base.sizes[d]) {
        match = static_cast<int64_t>(d);
      }
    }
    if (match < 0 && view.sizes[j] != 1) {
      return std::nullopt;  // a stride no base dimension has: expand, as_strided, a reshape
    }
    if (match >= 0) {
      used[match] = true;
    }
    box.base_dim.push_back(match);
  }
  return box;
}

// Note [Whole reshapes]
// ~~~~~~~~~~~~~~~~~~~~~
// A contiguous view with the same elements as its contiguous base, but another shape (FSDP2
// keeps its padded shard as `padded.view(-1)`), is no box view: a box of it is not a box of the
// base. Its whole box is the base's whole box, though, so materializing all of it works.
bool reshapes_whole_base(const RecordedValue& view, const RecordedValue& base) {
  return view.dtype == base.dtype && view.storage_offset == base.storage_offset &&
         view.strides == contiguous_strides(view.sizes) &&
         base.strides == contiguous_strides(base.sizes) &&
         c10::multiply_integers(view.sizes) == c10::multiply_integers(base.sizes);
}

bool empty(const Box& box) {
  for (size_t d = 0; d < box.start.size(); ++d) {
    if (box.stop[d] <= box.start[d]) {
      return true;
    }
  }
  return false;
}

// The part of view box `view_box` (view coordinates) inside base region `region`, in view
// coordinates; empty if they do not meet.
Box intersect(const BoxView& view, const Box& view_box, const Box& region) {
  Box result = view_box;
  for (size_t j = 0; j < view.base_dim.size(); ++j) {
    const int64_t d = view.base_dim[j];
    if (d < 0) {
      continue;
    }
    result.start[j] = std::max(view_box.start[j], region.start[d] - view.origin[d]);
    result.stop[j] = std::min(view_box.stop[j], region.stop[d] - view.origin[d]);
  }
  for (size_t d = 0; d < view.origin.size(); ++d) {
    const bool mapped = std::find(view.base_dim.begin(), view.base_dim.end(),
                                  static_cast<int64_t>(d)) != view.base_dim.end();
    if (!mapped && (view.origin[d] < region.start[d] || view.origin[d] >= region.stop[d])) {
      result.stop = result.start;  // the view's fixed coordinate lies outside the region
    }
  }
  return result;
}

// `local` holds base region `region`; returns the view of it that is `view_box` of the view.
at::Tensor view_part(const at::Tensor& local, const Box& region, const BoxView& view,
                     const Box& view_box) {
  at::Tensor t = local;
  std::vector<bool> mapped(region.start.size(), false);
  for (size_t j = 0; j < view.base_dim.size(); ++j) {
    const int64_t d = view.base_dim[j];
    if (d >= 0) {
      mapped[d] = true;
      t = t.narrow(d, view.origin[d] + view_box.start[j] - region.start[d],
                   view_box.stop[j] - view_box.start[j]);
    }
  }
  std::vector<int64_t> order;
  for (const int64_t d : view.base_dim) {
    if (d >= 0) {
      order.push_back(d);
    }
  }
  for (size_t d = 0; d < mapped.size(); ++d) {
    if (!mapped[d]) {
      t = t.narrow(static_cast<int64_t>(d), view.origin[d] - region.start[d], 1);
      order.push_back(static_cast<int64_t>(d));
    }
  }
  t = t.permute(order);
  for (size_t k = order.size(); k-- > 0;) {
    if (!mapped[order[k]]) {
      t = t.select(static_cast<int64_t>(k), 0);
    }
  }
  for (size_t j = 0; j < view.base_dim.size(); ++j) {
    if (view.base_dim[j] < 0) {
      t = t.unsqueeze(static_cast<int64_t>(j));
    }
  }
  return t;
}

Box to_base(const BoxView& view, const Box& view_box, size_t base_rank) {
  Box box;
  box.start.assign(base_rank, 0);
  box.stop.assign(base_rank, 0);
  for (size_t d = 0; d < base_rank; ++d) {
    box.start[d] = view.origin[d];
    box.stop[d] = view.origin[d] + 1;
  }
  for (size_t j = 0; j < view.base_dim.size(); ++j) {
    const int64_t d = view.base_dim[j];
    if (d >= 0) {
      box.start[d] = view.origin[d] + view_box.start[j];
      box.stop[d] = view.origin[d] + view_box.stop[j];
    }
  }
  return box;
}

bool is_factory(std::string_view name) {
  static constexpr std::string_view kFactories[] = {
      "aten::zeros",         "aten::ones",       "aten::full",      "aten::empty",
      "aten::empty_strided", "aten::zeros_like", "aten::ones_like", "aten::full_like",
      "aten::empty_like",    "aten::new_zeros",  "aten::new_ones",  "aten::new_full",
      "aten::new_empty"};
  return std::find(std::begin(kFactories), std::end(kFactories), name) != std::end(kFactories);
}

// Note [Region-exact pointwise ops]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A pointwise op computed on a region must give the bits it gives on the whole tensor. ATen does
// not promise that: its CPU loops run a vectorized body and a scalar tail, and for some ops the
// two differ in the last bit (sigmoid, exp2, pow with a fractional exponent, gelu in float32 and
// float64; rsqrt in bfloat16; add/sub with alpha in float16 and bfloat16). Which elements land in
// the tail depends on where a region starts, so such an op would make shards disagree with the
// full tensor. Only ops whose results are exactly rounded or computed the same way on both paths
// are listed here; tests/cpp/shard_test.cpp checks every one of them, for every floating dtype,
// at region boundaries that are not vector aligned, so a PyTorch that changes a kernel fails CI
// instead of producing shards that do not concatenate. Everything else falls back.
bool region_exact_pointwise(const RecordedNode& node, c10::ScalarType dtype) {
  static constexpr std::string_view kOps[] = {
      "aten::add",       "aten::sub",       "aten::rsub",    "aten::mul",         "aten::div",
      "aten::neg",       "aten::abs",       "aten::sqrt",    "aten::exp",         "aten::log",
      "aten::log1p",     "aten::expm1",     "aten::sin",     "aten::cos",         "aten::tanh",
      "aten::erf",       "aten::erfinv",    "aten::atan",    "aten::clamp",       "aten::clamp_min",
      "aten::clamp_max", "aten::where",     "aten::sign",    "aten::maximum",     "aten::minimum",
      "aten::fmod",      "aten::remainder", "aten::square",  "aten::reciprocal",  "aten::floor",
      "aten::ceil",      "aten::round",     "aten::trunc",   "aten::masked_fill", "aten::fill",
      "aten::zero",      "aten::addcmul",   "aten::addcdiv", "aten::lerp",        "aten::eq",
      "aten::ne",        "aten::lt",        "aten::le",      "aten::gt",          "aten::ge",
      "aten::to",        "aten::_to_copy",  "aten::clone",   "aten::contiguous",  "aten::copy"};
  std::string_view name = node.op.schema().name();
  if (!name.empty() && name.back() == '_') {
    name.remove_suffix(1);
  }
  if (std::find(std::begin(kOps), std::end(kOps), name) == std::end(kOps)) {
    return false;
  }
  if (name == "aten::add" || name == "aten::sub") {
    const std::optional<double> alpha = double_argument(node, "alpha");
    return !alpha || *alpha == 1.0 ||
           (dtype != c10::ScalarType::Half && dtype != c10::ScalarType::BFloat16);
  }
  return true;
}

// The box of an input of shape `input` that broadcasting maps onto `region` of an output of shape
// `output` (sizes aligned from the right; a size-1 input dimension is read whole), or nullopt if
// `input` does not broadcast to `output`.
std::optional<Box> broadcast_box(c10::IntArrayRef input, c10::IntArrayRef output,
                                 const Box& region) {
  if (input.size() > output.size()) {
    return std::nullopt;
  }
  const size_t lead = output.size() - input.size();
  Box box = whole(input);
  for (size_t i = 0; i < input.size(); ++i) {
    if (input[i] == output[lead + i]) {
      box.start[i] = region.start[lead + i];
      box.stop[i] = region.stop[lead + i];
    } else if (input[i] != 1) {
      return std::nullopt;
    }
  }
  return box;
}

}  // namespace

at::Tensor slice(const at::Tensor& t, const Box& box) {
  at::Tensor part = t;
  for (size_t d = 0; d < box.start.size(); ++d) {
    part = part.narrow(static_cast<int64_t>(d), box.start[d], box.stop[d] - box.start[d]);
  }
  return part;
}

RegionReplay::RegionReplay(std::shared_ptr<OpGraph> graph, ReplayConfig config)
    : graph_(std::move(graph)),
      config_(std::move(config)),
      seed_(config_.counter_seed.value_or(graph_->counter_seed())) {}

bool RegionReplay::fail(std::string why) {
  why_ = std::move(why);
  return false;
}

c10::Device RegionReplay::device_of(const RecordedValue& value) const {
  return config_.device.value_or(value.device);
}

at::Tensor RegionReplay::allocate(const Box& region, const RecordedValue& like) {
  at::Tensor t =
      at::empty(region.sizes(), at::TensorOptions().dtype(like.dtype).device(device_of(like)));
  bytes_computed_ += static_cast<int64_t>(t.nbytes());
  return t;
}

std::optional<at::Tensor> RegionReplay::local(int64_t value, const Box& box) {
  return local_before(value, box, std::numeric_limits<int64_t>::max());
}

std::optional<at::Tensor> RegionReplay::local_before(int64_t value_index, const Box& box,
                                                     int64_t before) {
  const RecordedValue& value = graph_->values()[value_index];
  const RecordedStorage& storage = graph_->storages()[value.storage];
  if (storage.base_value < 0) {
    fail("a tensor this recording did not create");
    return std::nullopt;
  }
  const RecordedValue& base = graph_->values()[storage.base_value];
  // Checked before the view's geometry, so that the stats name the op when both fail.
  const RecordedNode& creator = graph_->nodes()[storage.creator];
  if (!(creator.draws && has_counter_definition(creator)) &&
      !is_factory(creator.op.schema().name()) && !region_exact_pointwise(creator, base.dtype)) {
    fail(c10::toString(creator.op.schema().operator_name()));
    return std::nullopt;
  }
  const std::optional<BoxView> view = box_view(value, base);
  if (!view && box == whole(value.sizes) && reshapes_whole_base(value, base)) {
    std::optional<at::Tensor> base_local = storage_region(value.storage, whole(base.sizes), before);
    return base_local ? std::optional<at::Tensor>(base_local->view(value.sizes)) : std::nullopt;
  }
  if (!view) {
    fail("a view with geometry that is not a box of its base");
    return std::nullopt;
  }
  const Box region = to_base(*view, box, base.sizes.size());
  std::optional<at::Tensor> base_local = storage_region(value.storage, region, before);
  if (!base_local) {
    return std::nullopt;
  }
  return view_part(*base_local, region, *view, box);
}

std::optional<at::Tensor> RegionReplay::storage_region(int64_t storage_index, const Box& region,
                                                       int64_t before) {
  const RecordedStorage& storage = graph_->storages()[storage_index];
  const RecordedValue& base = graph_->values()[storage.base_value];
  std::optional<at::Tensor> result = created(storage.creator, base, region);
  if (!result) {
    return std::nullopt;
  }
  for (size_t i = 1; i < storage.writers.size() && storage.writers[i] < before; ++i) {
    if (!apply_write(storage.writers[i], base, region, *result)) {
      return std::nullopt;
    }
  }
  return result;
}

std::optional<at::Tensor> RegionReplay::input_region(const RecordedInput& input,
                                                     c10::IntArrayRef output_sizes,
                                                     const Box& region, int64_t reader) {
  switch (input.kind) {
    case RecordedInput::Kind::kUndefined:
      return at::Tensor();
    case RecordedInput::Kind::kValue: {
      const RecordedValue& value = graph_->values()[input.value];
      const std::optional<Box> box = broadcast_box(value.sizes, output_sizes, region);
      if (!box) {
        fail("an input that does not broadcast to the output");
        return std::nullopt;
      }
      return local_or_whole(input.value, *box, reader);
    }
    case RecordedInput::Kind::kReal:
    case RecordedInput::Kind::kConstant: {
      const std::optional<Box> box = broadcast_box(input.tensor.sizes(), output_sizes, region);
      if (!box) {
        fail("an input that does not broadcast to the output");
        return std::nullopt;
      }
      return slice(input.tensor, *box);
    }
    case RecordedInput::Kind::kForeignFake:
      fail("a fake of another recording");
      return std::nullopt;
  }
  return std::nullopt;
}

at::Tensor RegionReplay::local_or_whole(int64_t value, const Box& box, int64_t before) {
  if (std::optional<at::Tensor> part = local_before(value, box, before)) {
    return *part;
  }
  if (std::find(whole_inputs_.begin(), whole_inputs_.end(), why_) == whole_inputs_.end()) {
    whole_inputs_.push_back(why_);
  }
  return slice(compute_whole(value, before), box);
}

at::Tensor RegionReplay::compute_whole(int64_t value, int64_t before) {
  GraphReplay replay(graph_, config_);
  replay.add_value(value);
  replay.stop_before(before);
  replay.plan();
  replay.run();
  at::Tensor full = replay.result(0);
  bytes_computed_ += static_cast<int64_t>(full.storage().nbytes());
  return full;
}

std::optional<at::Tensor> RegionReplay::created(int64_t index, const RecordedValue& base,
                                                const Box& region) {
  const RecordedNode& node = graph_->nodes()[index];
  const std::string& name = node.op.schema().name();
  const std::string op = c10::toString(node.op.schema().operator_name());
  if (node.draws) {
    if (!config_.counter_rng || !has_counter_definition(node)) {
      fail(op);
      return std::nullopt;
    }
    at::Tensor result = allocate(region, base);
    counter_fill_node(node, result, seed_, {base.sizes, region.start});
    return result;
  }
  if (is_factory(name)) {
    at::Tensor result = allocate(region, base);
    if (name.find("zeros") != std::string::npos) {
      result.zero_();
    } else if (name.find("ones") != std::string::npos) {
      result.fill_(1);
    } else if (name.find("full") != std::string::npos) {
      result.fill_(*double_argument(node, "fill_value"));
    }
    return result;
  }
  if (!region_exact_pointwise(node, base.dtype)) {
    fail(op);
    return std::nullopt;
  }
  const auto& arguments = node.op.schema().arguments();
  torch::jit::Stack stack;
  size_t next_input = 0;
  bool ok = true;
  for (size_t i = 0; i < node.arguments.size(); ++i) {
    if (is_device_argument(arguments[i]) && node.arguments[i].isDevice()) {
      stack.emplace_back(device_of(base));
      continue;
    }
    stack.push_back(map_tensors(node.arguments[i], [&](const at::Tensor&) {
      std::optional<at::Tensor> input =
          input_region(node.inputs[next_input++], base.sizes, region, index);
      ok = ok && input.has_value();
      return input.value_or(at::Tensor());
    }));
  }
  if (!ok) {
    return std::nullopt;
  }
  node.op.callBoxed(&stack);
  at::Tensor result = stack.front().toTensor();
  bytes_computed_ += static_cast<int64_t>(result.nbytes());
  return result;
}

bool RegionReplay::apply_write(int64_t index, const RecordedValue& base, const Box& region,
                               at::Tensor& local) {
  const RecordedNode& node = graph_->nodes()[index];
  const std::string op = c10::toString(node.op.schema().operator_name());
  if (!writes_first_argument(node.op.schema()) || node.inputs.empty() ||
      node.inputs[0].kind != RecordedInput::Kind::kValue) {
    return fail(op);
  }
  const RecordedValue& target = graph_->values()[node.inputs[0].value];
  const std::optional<BoxView> view = box_view(target, base);
  if (!view) {
    return fail(op + " through a view that is not a box");
  }
  const Box part_box = intersect(*view, whole(target.sizes), region);
  if (empty(part_box)) {
    return true;
  }
  at::Tensor part = view_part(local, region, *view, part_box);
  if (node.draws) {
    return (config_.counter_rng &&
            counter_fill_node(node, part, seed_, {target.sizes, part_box.start})) ||
           fail(op);
  }
  if (!region_exact_pointwise(node, target.dtype)) {
    return fail(op);
  }
  torch::jit::Stack stack;
  size_t next_input = 0;
  bool ok = true;
  for (size_t i = 0; i < node.arguments.size(); ++i) {
    stack.push_back(map_tensors(node.arguments[i], [&](const at::Tensor&) {
      const size_t position = next_input++;
      if (position == 0) {
        return part;
      }
      std::optional<at::Tensor> input =
          input_region(node.inputs[position], target.sizes, part_box, index);
      ok = ok && input.has_value();
      return input.value_or(at::Tensor());
    }));
  }
  if (!ok) {
    return false;
  }
  node.op.callBoxed(&stack);
  return true;
}

}  // namespace torchdefer::detail
