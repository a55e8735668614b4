// explain(): the recorded history of a tensor's storage, as one readable line.
#include <torchdefer/boxed_arguments.h>
#include <torchdefer/node_stack.h>
#include <torchdefer/op_graph.h>
#include <torchdefer/recording.h>

#include <c10/core/ScalarType.h>

#include <iomanip>
#include <set>
#include <sstream>
#include <string>

namespace torchdefer {
namespace {

std::string shape_of(c10::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

std::string describe_input(const OpGraph& graph, const RecordedInput& input) {
  switch (input.kind) {
    case RecordedInput::Kind::kUndefined:
      return "None";
    case RecordedInput::Kind::kValue:
      return shape_of(graph.values()[input.value].sizes);
    case RecordedInput::Kind::kReal:
      return "real " + describe(input.tensor);
    case RecordedInput::Kind::kConstant:
      return "constant " + describe(input.tensor);
    case RecordedInput::Kind::kForeignFake:
      return describe(input.tensor);
  }
  return "?";
}

bool is_default(const c10::Argument& argument, const c10::IValue& value) {
  if (value.isNone()) {
    return true;
  }
  const auto& fallback = argument.default_value();
  if (!fallback.has_value()) {
    return false;
  }
  if (value.isDouble() && fallback->isDouble()) {
    return value.toDouble() == fallback->toDouble();
  }
  if (value.isInt() && fallback->isInt()) {
    return value.toInt() == fallback->toInt();
  }
  if (value.isBool() && fallback->isBool()) {
    return value.toBool() == fallback->toBool();
  }
  return false;
}

std::string describe_scalar(const c10::Argument& argument, const c10::IValue& value) {
  std::ostringstream out;
  if (value.isInt() &&
      (argument.type()->kind() == c10::TypeKind::ScalarTypeType || argument.name() == "dtype")) {
    out << c10::toString(static_cast<c10::ScalarType>(value.toInt()));
  } else if (value.isDouble()) {
    out << std::setprecision(6) << value.toDouble();
  } else if (value.isBool()) {
    out << (value.toBool() ? "true" : "false");
  } else {
    out << value;
  }
  return out.str();
}

// "uniform_(-0.353553, 0.353553)": the op without namespace or overload; the tensor it writes in
// place left out; tensors as their shapes; trailing and keyword arguments at their defaults left
// out.
std::string describe_node(const OpGraph& graph, const RecordedNode& node) {
  const c10::FunctionSchema& schema = node.op.schema();
  std::vector<std::string> texts(schema.arguments().size());
  std::vector<bool> shown(schema.arguments().size(), false);
  std::vector<std::vector<std::string>> tensors_of(schema.arguments().size());
  for_each_input(node, [&](size_t argument, size_t, const RecordedInput& input) {
    tensors_of[argument].push_back(describe_input(graph, input));
  });
  size_t last_shown_positional = 0;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::Argument& argument = schema.arguments()[i];
    const std::vector<std::string>& tensors = tensors_of[i];
    const bool written_self = i == 0 && is_written(argument);
    if (written_self) {
      continue;
    }
    if (!tensors.empty()) {
      texts[i] = tensors.size() == 1 && node.arguments[i].isTensor() ? tensors[0] : "[...]";
    } else if (node.arguments[i].isNone()) {
      continue;
    } else {
      texts[i] = describe_scalar(argument, node.arguments[i]);
    }
    shown[i] = argument.kwarg_only() ? !is_default(argument, node.arguments[i]) : true;
    if (!argument.kwarg_only() && (!tensors.empty() || !is_default(argument, node.arguments[i]))) {
      last_shown_positional = i + 1;
    }
  }
  std::string name = schema.name();
  std::ostringstream out;
  out << name.substr(name.find("::") + 2) << "(";
  bool first = true;
  for (size_t i = 0; i < texts.size(); ++i) {
    const c10::Argument& argument = schema.arguments()[i];
    if (!shown[i] || (!argument.kwarg_only() && i >= last_shown_positional)) {
      continue;
    }
    out << (first ? "" : ", ") << (argument.kwarg_only() ? argument.name() + "=" : "") << texts[i];
    first = false;
  }
  out << ")";
  return out.str();
}

// Every node that writes `storage` or, recursively, a storage those nodes read; in record order.
std::set<int64_t> nodes_producing(const OpGraph& graph, int64_t storage) {
  std::set<int64_t> nodes;
  std::set<int64_t> seen_storages = {storage};
  std::vector<int64_t> pending = {storage};
  while (!pending.empty()) {
    const RecordedStorage& current = graph.storages()[pending.back()];
    pending.pop_back();
    for (const int64_t writer : current.writers) {
      if (!nodes.insert(writer).second) {
        continue;
      }
      for (const RecordedInput& input : graph.nodes()[writer].inputs) {
        if (input.kind == RecordedInput::Kind::kValue &&
            seen_storages.insert(graph.values()[input.value].storage).second) {
          pending.push_back(graph.values()[input.value].storage);
        }
      }
    }
  }
  return nodes;
}

}  // namespace

std::string detail::explain(const at::Tensor& t) {
  const RecordedFake* rec = recorded(t);
  if (rec == nullptr) {
    return is_fake(t) ? describe(t) + ": made under a FakeMode, not recorded"
                      : describe(t) + ": real, nothing to replay";
  }
  const OpGraph& graph = *rec->graph;
  const auto lock = rec->graph->lock();
  std::ostringstream out;
  bool first = true;
  for (const int64_t node : nodes_producing(graph, graph.values()[rec->value].storage)) {
    out << (first ? "" : " → ") << describe_node(graph, graph.nodes()[node]);
    first = false;
  }
  return out.str();
}

}  // namespace torchdefer
