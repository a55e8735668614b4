// The boxed kernels of the core layer, for the one file that registers every kernel torchdefer
// adds to the dispatcher (recorder/src/registrations.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>

namespace torchdefer::detail {

// The fallback for kFakeKey: runs an op on fakes as the same op on their meta shadows (Note [The
// Fake fallback]).
void fake_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                   torch::jit::Stack* stack);

// The Meta kernel of an op with a meta rule in the op table (Note [Meta rules]).
void meta_rule_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torchdefer::detail
