// The boxed kernels of the core layer, for the one file that registers every kernel torchdefer
// adds to the dispatcher (recorder/src/registrations.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>

namespace torchdefer::detail {

// What a caller of fake_fallback() already knows of the operator (the recorder asks once per
// operator and thread), so that the Fake layer does not ask again on every call.
struct KnownOperator {
  bool random = false;          // is_random(op)
  bool may_read_values = true;  // false: value_reading_api() answers nullopt whatever the arguments
};

// The fallback for kFakeKey: runs an op on fakes as the same op on their meta shadows (Note [The
// Fake fallback]); `known`, if given, answers what it would ask of the operator (Note [A caller
// that knows the operator]).
void fake_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                   torch::jit::Stack* stack, const KnownOperator* known = nullptr);

// The Meta kernel of an op with a meta rule in the op table (Note [Meta rules]).
void meta_rule_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torchdefer::detail
