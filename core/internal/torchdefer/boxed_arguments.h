// Reading boxed operator arguments: visiting the tensors inside them, reading int arguments, and
// recognizing device arguments. The Fake fallback, the recorder and the replay engine all rewrite
// argument stacks tensor by tensor, in the same order.
#pragma once

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <optional>
#include <string_view>

namespace torchdefer {

// Calls `f` on every tensor in a boxed argument or return (a Tensor, a Tensor[] or a Tensor?[];
// undefined tensors included), in order, and returns the value with each tensor replaced by what
// `f` returned. Other values come back unchanged. The order is the same on every call, so one
// pass can record tensors and a later pass can substitute them by position.
template <typename F>
c10::IValue map_tensors(const c10::IValue& value, const F& f) {
  if (value.isTensor()) {
    return f(value.toTensor());
  }
  if (!value.isList()) {
    return value;  // asked first: isTensorList() is a call, and most arguments are scalars
  }
  if (value.isTensorList()) {
    const c10::List<at::Tensor> list = value.toTensorList();
    c10::List<at::Tensor> mapped;
    mapped.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      mapped.push_back(f(list.get(i)));
    }
    return mapped;
  }
  const c10::List<c10::IValue> list = value.toList();
  c10::impl::GenericList mapped(list.elementType());
  mapped.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const c10::IValue& element = list.get(i);
    mapped.push_back(element.isTensor() ? c10::IValue(f(element.toTensor())) : element);
  }
  return mapped;
}

// True if the operator writes this argument in place (`Tensor(a!)`): from the schema's alias
// annotations, never from op names.
inline bool is_written(const c10::Argument& argument) {
  return argument.alias_info() != nullptr && argument.alias_info()->isWrite();
}

// True for in-place ops: the first argument (`self`) is written.
inline bool writes_first_argument(const c10::FunctionSchema& schema) {
  return !schema.arguments().empty() && is_written(schema.arguments()[0]);
}

// The int argument named `name` of a call to `schema` with `arguments`, if it was given one.
inline std::optional<int64_t> int_argument(const c10::FunctionSchema& schema,
                                           c10::ArrayRef<c10::IValue> arguments,
                                           std::string_view name) {
  for (size_t i = 0; i < schema.arguments().size() && i < arguments.size(); ++i) {
    if (schema.arguments()[i].name() == name && arguments[i].isInt()) {
      return arguments[i].toInt();
    }
  }
  return std::nullopt;
}

// True for a `Device` or `Device?` argument (factories' `device=`, `_to_copy`'s target).
inline bool is_device_argument(const c10::Argument& argument) {
  const auto& type = argument.type();
  if (type->kind() == c10::TypeKind::DeviceObjType) {
    return true;
  }
  const auto* optional = type->castRaw<c10::OptionalType>();
  return optional != nullptr && optional->getElementType()->kind() == c10::TypeKind::DeviceObjType;
}

// Whether an argument of this type can hold a generator: `Generator`, `Generator?` (kOne) or a
// list of either (kList).
enum class GeneratorArgument { kNone, kOne, kList };
inline GeneratorArgument generator_argument_kind(const c10::Argument& argument) {
  const auto unwrapped = [](const c10::Type& type) -> const c10::Type& {
    const auto* optional = type.castRaw<c10::OptionalType>();
    return optional != nullptr ? *optional->getElementType() : type;
  };
  const c10::Type& type = unwrapped(*argument.type());
  if (type.kind() == c10::TypeKind::GeneratorType) {
    return GeneratorArgument::kOne;
  }
  const auto* list = type.castRaw<c10::ListType>();
  if (list != nullptr &&
      unwrapped(*list->getElementType()).kind() == c10::TypeKind::GeneratorType) {
    return GeneratorArgument::kList;
  }
  return GeneratorArgument::kNone;
}

}  // namespace torchdefer
