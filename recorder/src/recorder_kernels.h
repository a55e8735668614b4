// The kernels of the recorder layer, for the file that registers every kernel torchdefer
// adds to the dispatcher (registrations.cpp).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>

#include <optional>

namespace torchdefer::detail {

// The fallback for kDeferredInitKey: records the calls of composite ops on recorded fakes, and of
// composite factories while deferred_init runs (Note [Recording an op]).
void deferred_init_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                            torch::jit::Stack* stack);

// torchdefer::trunc_normal_: torch.nn.init.trunc_normal_ as one random operator (Note
// [trunc_normal_ as one operator]).
at::Tensor& trunc_normal_kernel(at::Tensor& self, double mean, double std, double a, double b,
                                std::optional<at::Generator> generator);

// The fallback for kFakeKey: records the calls of ops that fall through kDeferredInitKey, then
// runs the Fake layer (Note [Where an op is recorded]).
void recording_fake_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                             torch::jit::Stack* stack);

// The fallback for kFollowedGeneratorKey: pays the followed generators a call is given, unless it
// computes on meta tensors, and passes the call on (Note [Followed generators]).
void followed_generator_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                                 torch::jit::Stack* stack);

// How many meta rules loading the library registered (Note [What loading torchdefer changes]).
int registered_meta_rules();

}  // namespace torchdefer::detail
