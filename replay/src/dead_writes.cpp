#include "dead_writes.h"

#include <torchdefer/boxed_arguments.h>
#include <torchdefer/op_table.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace torchdefer::detail {
namespace {

const OpInfo* overwriting_op(const RecordedNode& node) {
  const OpInfo* info = find_op_info(node.op.schema().operator_name());
  if (info == nullptr || !info->overwrites_self || !writes_first_argument(node.op.schema())) {
    return nullptr;
  }
  return info;
}

// The value `node` writes as its first argument, if it is one of this graph's fakes.
const RecordedValue* written_value(const OpGraph& graph, const RecordedNode& node) {
  if (node.inputs.empty() || node.inputs[0].kind != RecordedInput::Kind::kValue) {
    return nullptr;
  }
  return &graph.values()[node.inputs[0].value];
}

int64_t numel(const RecordedValue& value) {
  int64_t n = 1;
  for (const int64_t size : value.sizes) {
    n *= size;
  }
  return n;
}

// True if `value` covers exactly the storage elements [offset, offset + numel) once each.
bool dense_and_non_overlapping(const RecordedValue& value) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims above size 1
  for (size_t d = 0; d < value.sizes.size(); ++d) {
    if (value.sizes[d] != 1) {
      dims.emplace_back(value.strides[d], value.sizes[d]);
    }
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) {
      return false;
    }
    expected *= size;
  }
  return true;
}

// True if every element `inner` touches is one of `outer`'s, a dense non-overlapping view.
bool contains(const RecordedValue& outer, const RecordedValue& inner) {
  if (inner.dtype != outer.dtype || !dense_and_non_overlapping(outer)) {
    return false;
  }
  const int64_t n = numel(inner);
  if (n == 0) {
    return true;
  }
  int64_t last = inner.storage_offset;
  for (size_t d = 0; d < inner.sizes.size(); ++d) {
    if (inner.strides[d] < 0) {
      return false;
    }
    last += (inner.sizes[d] - 1) * inner.strides[d];
  }
  return inner.storage_offset >= outer.storage_offset && last < outer.storage_offset + numel(outer);
}

bool reads_storage(const OpGraph& graph, const RecordedNode& node, int64_t storage,
                   size_t from_input) {
  for (size_t i = from_input; i < node.inputs.size(); ++i) {
    const RecordedInput& input = node.inputs[i];
    if (input.kind == RecordedInput::Kind::kValue &&
        graph.values()[input.value].storage == storage) {
      return true;
    }
  }
  return false;
}

}  // namespace

bool overwritten_before_read(const OpGraph& graph, const RecordedStorage& storage, size_t writer,
                             int64_t stop_before) {
  if (writer + 1 >= storage.writers.size()) {
    return false;
  }
  const int64_t first = storage.writers[writer];
  const int64_t next = storage.writers[writer + 1];
  if (first == storage.creator || next >= stop_before) {
    return false;
  }
  const RecordedNode& dead = graph.nodes()[first];
  const RecordedNode& covering = graph.nodes()[next];
  if (overwriting_op(dead) == nullptr || overwriting_op(covering) == nullptr) {
    return false;
  }
  // A fill placed from a known place (an anchor and offset, or CUDA's seed and offset) can be
  // skipped; one whose end anchors later ops is needed for where they start.
  if (dead.draws && dead.draws->kind != RecordedDraws::Kind::kPlaced &&
      !(dead.draws->kind == RecordedDraws::Kind::kCudaGenerator && dead.draws->end_anchor < 0)) {
    return false;
  }
  const RecordedValue* dead_view = written_value(graph, dead);
  const RecordedValue* covering_view = written_value(graph, covering);
  if (dead_view == nullptr || covering_view == nullptr ||
      covering_view->storage != dead_view->storage || !contains(*covering_view, *dead_view)) {
    return false;
  }
  const int64_t id = dead_view->storage;
  if (reads_storage(graph, covering, id, 1)) {
    return false;
  }
  for (int64_t node = first + 1; node < next; ++node) {
    if (reads_storage(graph, graph.nodes()[node], id, 0)) {
      return false;
    }
  }
  return true;
}

}  // namespace torchdefer::detail
