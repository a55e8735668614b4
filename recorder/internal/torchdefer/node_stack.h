// Rebuilding a recorded node's boxed argument stack, to call its operator again: the recorder's
// scratch runs, full replay and region replay all run a node this way, and explain() reads it.
#pragma once

#include <torchdefer/boxed_arguments.h>
#include <torchdefer/op_graph.h>

#include <ATen/core/stack.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <optional>

namespace torchdefer {

// Calls `f(argument_index, input_position, input)` for every tensor argument of `node` (undefined
// optional tensors included), in schema and map_tensors order.
template <typename F>
void for_each_input(const RecordedNode& node, const F& f) {
  size_t position = 0;
  for (size_t i = 0; i < node.arguments.size(); ++i) {
    map_tensors(node.arguments[i], [&](const at::Tensor& t) {
      f(i, position, node.inputs[position]);
      ++position;
      return t;
    });
  }
}

// The argument stack of `node`: each tensor argument is `tensor_for(input_position, input)`. With
// `device`, every device argument that names a device, and the absent device of a call without
// tensor arguments (a factory's default), is `device`: where the node runs now.
template <typename TensorFor>
torch::jit::Stack node_stack(const RecordedNode& node, const TensorFor& tensor_for,
                             std::optional<c10::Device> device = std::nullopt) {
  const auto& arguments = node.op.schema().arguments();
  const bool has_tensor_inputs = std::any_of(
      node.inputs.begin(), node.inputs.end(),
      [](const RecordedInput& input) { return input.kind != RecordedInput::Kind::kUndefined; });
  torch::jit::Stack stack;
  stack.reserve(node.arguments.size());
  size_t position = 0;
  for (size_t i = 0; i < node.arguments.size(); ++i) {
    const c10::IValue& argument = node.arguments[i];
    if (device && is_device_argument(arguments[i]) &&
        (argument.isDevice() || (argument.isNone() && !has_tensor_inputs))) {
      stack.emplace_back(*device);
      continue;
    }
    stack.push_back(map_tensors(argument, [&](const at::Tensor&) {
      const size_t current = position++;
      return tensor_for(current, node.inputs[current]);
    }));
  }
  return stack;
}

}  // namespace torchdefer
