// Region replay (Note [Region replay]).
#include <torchdefer/region_replay.h>

#include <torchdefer/ambient_state.h>
#include <torchdefer/boxed_arguments.h>
#include <torchdefer/counter_rng.h>
#include <torchdefer/fake_tensor.h>
#include <torchdefer/node_stack.h>
#include <torchdefer/op_table.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/enum_tag.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/core/WrapDimMinimal.h>
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

std::vector<int64_t> contiguous_strides(c10::IntArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) {
    strides[d - 1] = strides[d] * std::max<int64_t>(sizes[d], 1);
  }
  return strides;
}

std::optional<BoxView> box_view(const RecordedValue& view, const RecordedValue& base) {
  if (view.dtype != base.dtype ||
      c10::IntArrayRef(base.strides) != contiguous_strides(base.sizes)) {
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
         c10::IntArrayRef(view.strides) == contiguous_strides(view.sizes) &&
         c10::IntArrayRef(base.strides) == contiguous_strides(base.sizes) &&
         c10::multiply_integers(view.sizes) == c10::multiply_integers(base.sizes);
}

// Note [Views that miss the region]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A write through a view touches the region only where the view's box meets it. A view that
// fixes a base coordinate (select, `t[5]`, `dirac_`'s element writes) meets it only if that
// coordinate lies inside the region. Whether they meet is an answer of its own, never encoded
// as a box with stop == start: a view with no dimensions left (`bias[8]`) has no dimension
// along which a box could be empty, and taking such a view as meeting the region would narrow
// the region at a coordinate outside it: an index error, or a negative start that silently
// wraps to the wrong element.

// Note [Empty boxes]
// ~~~~~~~~~~~~~~~~~~
// A trailing rank's chunk can be empty (torch.chunk of a size-1 dimension over two ranks). Its
// box holds no element, so nothing is computed for it. Mapping it through its view would be
// wrong besides: a dimension the view inserted (`zeros(4)[None]`, `unsqueeze(0)`) has no base
// dimension, so to_base() cannot carry its emptiness, and the part would come back whole.

// The part of view box `view_box` (view coordinates) inside base region `region`, in view
// coordinates; nullopt if they do not meet.
std::optional<Box> intersect(const BoxView& view, const Box& view_box, const Box& region) {
  for (size_t d = 0; d < view.origin.size(); ++d) {
    const bool mapped = std::find(view.base_dim.begin(), view.base_dim.end(),
                                  static_cast<int64_t>(d)) != view.base_dim.end();
    if (!mapped && (view.origin[d] < region.start[d] || view.origin[d] >= region.stop[d])) {
      return std::nullopt;  // the view's fixed coordinate lies outside the region
    }
  }
  Box result = view_box;
  for (size_t j = 0; j < view.base_dim.size(); ++j) {
    const int64_t d = view.base_dim[j];
    if (d < 0) {
      continue;
    }
    result.start[j] = std::max(view_box.start[j], region.start[d] - view.origin[d]);
    result.stop[j] = std::min(view_box.stop[j], region.stop[d] - view.origin[d]);
  }
  for (size_t j = 0; j < result.start.size(); ++j) {
    if (result.stop[j] <= result.start[j]) {
      return std::nullopt;
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

// The op table's region rule for `node` (in-place and functional forms share one).
bool is_factory(const RecordedNode& node) { return region_rule(node) == RegionRule::kFactory; }

// Note [Region rules for cat and stack]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Fused weights (`torch.cat([q.weight, k.weight, v.weight])`) and init-then-concatenate code
// make a tensor whose slices are slices of its inputs. cat lays its inputs one after another
// along `dim`, so a region of its output is, for each input it meets, the same region shifted
// into that input; stack puts input i at index i of a new dimension `dim`, so a region is, for
// each i it covers, the region without `dim` of input i. Each part is computed from its own
// region (or whole and sliced, where its input has no rule) and the parts are concatenated.
// cat casts every input to the promoted dtype with the copy kernel; casting a part with to()
// does the same conversion, so the bits are those of the full tensor. A 1-D input of size 0,
// which cat skips whatever its other tensors' shapes, takes no room. A region inside one input
// is that input's part itself, computed once; one spanning several inputs costs the parts and
// their concatenation, twice the slice. Splitting (split, chunk, unbind, split_with_sizes) needs
// no rule: its outputs are views of its input, which box views already map.
bool joins_inputs(const RecordedNode& node) {
  return node.op.schema().overload_name().empty() && region_rule(node) == RegionRule::kJoinsInputs;
}

// The fill value of a full, full_like or new_full call as recorded: an integer beyond double
// precision, a bool or a complex number fills exactly what the full replay fills.
c10::Scalar fill_value(const RecordedNode& node) {
  const auto& arguments = node.op.schema().arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (arguments[i].name() == "fill_value") {
      return node.arguments[i].toScalar();
    }
  }
  TORCH_CHECK(false, "torchdefer: ", node.op.schema().operator_name(), " has no fill_value");
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
  if (c10::multiply_integers(box.sizes()) == 0) {
    return allocate(box, value);  // Note [Empty boxes]
  }
  const RecordedStorage& storage = graph_->storages()[value.storage];
  if (storage.base_value < 0) {
    fail("a tensor this recording did not create");
    return std::nullopt;
  }
  const RecordedValue& base = graph_->values()[storage.base_value];
  // Checked before the view's geometry, so that the stats name the op when both fail.
  const RecordedNode& creator = graph_->nodes()[storage.creator];
  if (!(creator.draws && has_counter_definition(creator)) && !is_factory(creator) &&
      !region_exact_pointwise(creator, base.dtype) && !joins_inputs(creator)) {
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
      check_unchanged(input, reader);
      [[fallthrough]];
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

void RegionReplay::check_unchanged(const RecordedInput& input, int64_t reader) const {
  if (input.tensor.is_inference() || input.tensor._version() == input.version) {
    return;
  }
  const RecordedNode& node = graph_->nodes()[reader];
  TORCH_CHECK(false, "torchdefer: ", node.op.schema().operator_name(), " in deferred_init of ",
              graph_->context(), " read the real tensor ", describe(input.tensor),
              ", which was modified in place after recording (version ", input.version, " then, ",
              input.tensor._version(),
              " now), so replaying it would not give what construction computed. Keep tensors "
              "that a model's construction reads unchanged until it is materialized; a real "
              "parameter sliced by a sharded materialization counts as modified, so materialize "
              "what reads it in the same call.");
}

at::Tensor RegionReplay::local_or_whole(int64_t value, const Box& box, int64_t before) {
  if (std::optional<at::Tensor> part = local_before(value, box, before)) {
    return *part;
  }
  return whole_then_sliced(value, box, before);
}

at::Tensor RegionReplay::whole_then_sliced(int64_t value, const Box& box, int64_t before) {
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
    counter_fill_node(node, result, counter_key(*graph_, node, seed_), {base.sizes, region.start});
    return result;
  }
  if (is_factory(node)) {
    at::Tensor result = allocate(region, base);
    if (name.find("zeros") != std::string::npos) {
      result.zero_();
    } else if (name.find("ones") != std::string::npos) {
      result.fill_(1);
    } else if (name.find("full") != std::string::npos) {
      result.fill_(fill_value(node));
    }
    return result;
  }
  if (joins_inputs(node)) {
    return joined(node, index, base, region);
  }
  if (!region_exact_pointwise(node, base.dtype)) {
    fail(op);
    return std::nullopt;
  }
  bool ok = true;
  std::vector<at::Tensor> read;
  torch::jit::Stack stack = node_stack(
      node,
      [&](size_t, const RecordedInput& input) {
        std::optional<at::Tensor> part = input_region(input, base.sizes, region, index);
        ok = ok && part.has_value();
        read.push_back(part.value_or(at::Tensor()));
        return read.back();
      },
      device_of(base));
  if (!ok) {
    return std::nullopt;
  }
  const AmbientStateGuard ambient(node.ambient);
  node.op.callBoxed(&stack);
  at::Tensor result = stack.front().toTensor();
  // `contiguous` or `to` given a part that needs no change return that part itself, which can be
  // a real input's memory; the region is written next, so it must be this replay's own.
  if (std::any_of(read.begin(), read.end(), [&](const at::Tensor& input) {
        return input.defined() && result.is_alias_of(input);
      })) {
    result = result.clone();
  }
  bytes_computed_ += static_cast<int64_t>(result.nbytes());
  return result;
}

std::optional<at::Tensor> RegionReplay::joined(const RecordedNode& node, int64_t index,
                                               const RecordedValue& base, const Box& region) {
  const bool stack = node.op.schema().name() == "aten::stack";
  const auto rank = static_cast<int64_t>(base.sizes.size());
  const int64_t dim =
      c10::maybe_wrap_dim(int_argument(node.op.schema(), node.arguments, "dim").value_or(0), rank);
  const c10::Device device = device_of(base);
  std::vector<at::Tensor> parts;
  bool fresh = false;  // the last part was computed from its region
  int64_t offset = 0;  // where the next input starts along `dim`
  for (const RecordedInput& input : node.inputs) {
    const c10::IntArrayRef sizes = input.kind == RecordedInput::Kind::kValue
                                       ? c10::IntArrayRef(graph_->values()[input.value].sizes)
                                       : input.tensor.sizes();
    if (!stack && rank != 1 && sizes.size() == 1 && sizes[0] == 0) {
      continue;  // Note [Region rules for cat and stack]: skipped by cat
    }
    const int64_t extent = stack ? 1 : sizes[dim];
    const int64_t start = std::max(region.start[dim], offset);
    const int64_t stop = std::min(region.stop[dim], offset + extent);
    Box box = region;
    box.start[dim] = start - offset;
    box.stop[dim] = stop - offset;
    offset += extent;
    if (start >= stop) {
      continue;
    }
    if (stack) {
      box.start.erase(box.start.begin() + dim);
      box.stop.erase(box.stop.begin() + dim);
    }
    // A part computed from its region is this replay's own tensor; any other (a real input, a
    // whole replay that may reuse a materialized storage) is copied before it can be written.
    std::optional<at::Tensor> part;
    fresh = false;
    if (input.kind == RecordedInput::Kind::kValue) {
      part = local_before(input.value, box, index);
      fresh = part.has_value();
      if (!part) {
        part = whole_then_sliced(input.value, box, index);
      }
    } else {
      part = input_region(input, sizes, box, index);
    }
    if (!part) {
      return std::nullopt;
    }
    parts.push_back(stack ? part->unsqueeze(dim) : *part);
  }
  if (parts.size() == 1 && fresh && parts[0].scalar_type() == base.dtype &&
      parts[0].device() == device) {
    return parts[0];
  }
  if (parts.empty()) {
    return allocate(region, base);  // the region is empty
  }
  for (at::Tensor& part : parts) {
    part = part.to(device, base.dtype);
  }
  at::Tensor result = at::cat(parts, dim);
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
  const std::optional<Box> met = intersect(*view, whole(target.sizes), region);
  if (!met) {
    return true;  // Note [Views that miss the region]
  }
  const Box& part_box = *met;
  at::Tensor part = view_part(local, region, *view, part_box);
  if (node.draws) {
    return (config_.counter_rng && counter_fill_node(node, part, counter_key(*graph_, node, seed_),
                                                     {target.sizes, part_box.start})) ||
           fail(op);
  }
  if (!region_exact_pointwise(node, target.dtype)) {
    return fail(op);
  }
  bool ok = true;
  torch::jit::Stack stack = node_stack(node, [&](size_t position, const RecordedInput& input) {
    if (position == 0) {
      return part;
    }
    std::optional<at::Tensor> region_input = input_region(input, target.sizes, part_box, index);
    ok = ok && region_input.has_value();
    return region_input.value_or(at::Tensor());
  });
  if (!ok) {
    return false;
  }
  const AmbientStateGuard ambient(node.ambient);
  node.op.callBoxed(&stack);
  return true;
}

}  // namespace torchdefer::detail
