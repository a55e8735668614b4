// Every kernel torchdefer registers with PyTorch's dispatcher, in one place.
#include <torchdefer/core_kernels.h>
#include <torchdefer/op_table.h>
#include <torchdefer/torch_compat.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/enum_tag.h>
#include <c10/core/DispatchKey.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "recorder_kernels.h"

namespace torchdefer::detail {
namespace {

// Note [What loading torchdefer changes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A program that links or imports torchdefer and never calls it behaves exactly as without it.
// Loading the library has these process-wide effects, and no others:
//
//  1. A boxed fallback for kFakeKey (Note [The Fake fallback]). Only fake tensors carry that key,
//     and only torchdefer makes them.
//  2. A boxed fallback for kDeferredInitKey (Note [Recording an op]). Only deferred_init puts the
//     key in TLS, and only recorded fakes carry it. Every op registered by then that has no
//     CompositeImplicitAutograd kernel falls through that key instead, and its calls are recorded
//     by the kFakeKey fallback (Note [Where an op is recorded]); both only for calls whose key set
//     has one of the two keys.
//  3. A Meta kernel for each op with a meta rule in the op table (Note [Meta rules]), registered
//     only if the op has no Meta kernel when the library loads. So a meta tensor computes with
//     torch's own Meta kernel wherever torch has one, and only ops that would raise "not
//     implemented" on meta work now. In a Python process, torch registers its Python meta kernels
//     (torch/ _meta_registrations.py) when `torch` is imported, before any extension loads, and the
//     rules step aside for all but randperm.generator (2.13), whose composite torch's Python
//     meta kernel for randperm.generator_out serves; the rule computes the same output.
//     tests/python/test_registrations.py checks that nothing else changes.
//  4. The operator torchdefer::trunc_normal_ in torchdefer's own namespace (Note [trunc_normal_ as
//     one operator]), which only the Python package calls while recording.
//  5. A boxed fallback for kFollowedGeneratorKey (Note [Followed generators]). Only the generators
//     a recording follows carry that key, and only calls given one reach the fallback.
//
// Not at load, but when the first fake on a device type with no device guard at all is made
// (a fake CUDA tensor in a CPU-only build): a stand-in guard for that type (Note [Stand-in device
// guards]). A device type with a real guard keeps it; a process that makes no such fake gets
// none.

// Whether torch has a Meta kernel for `op`. A composite kernel does not count: the ops with meta
// rules are those whose composite reaches an op with no meta kernel (randperm.generator calls
// randperm.generator_out), which is why they need a rule.
bool has_meta_kernel(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::Meta);
}

c10::OperatorName operator_name(std::string_view key) {
  const size_t dot = key.find('.');
  return c10::OperatorName(std::string(key.substr(0, dot)), dot == std::string_view::npos
                                                                ? std::string()
                                                                : std::string(key.substr(dot + 1)));
}

int register_meta_rules(torch::Library& library) {
  int registered = 0;
  for (const OpInfo& info : op_table()) {
    if (info.meta == nullptr) {
      continue;
    }
    const auto op = c10::Dispatcher::singleton().findOp(operator_name(info.name));
    if (!op || has_meta_kernel(*op)) {
      continue;
    }
    const std::string unqualified(info.name.substr(info.name.find("::") + 2));
    library.impl(unqualified.c_str(),
                 torch::CppFunction::makeFromBoxedFunction<&meta_rule_kernel>());
    ++registered;
  }
  return registered;
}

// Note [Where an op is recorded]: an op whose kernels below kDeferredInitKey all pass the same
// call down to the Fake key, which is any op without a CompositeImplicitAutograd kernel (that
// kernel would decompose it above the Fake key) and not one the op table records as its parts.
bool recorded_below_autograd(const c10::OperatorHandle& op) {
  if (op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
    return false;
  }
  const OpInfo* info = find_op_info(op.schema().operator_name());
  return info == nullptr || !info->records_its_parts;
}

std::vector<c10::RegistrationHandleRAII> fall_through_deferred_init_key() {
  std::vector<c10::RegistrationHandleRAII> handles;
  c10::Dispatcher& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    const std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
    if (!op || !op->hasSchema() || !recorded_below_autograd(*op)) {
      continue;
    }
    handles.push_back(dispatcher.registerImpl(name, kDeferredInitKey,
                                              c10::KernelFunction::makeFallthrough(), std::nullopt,
                                              nullptr, "torchdefer: recorded at the Fake key"));
  }
  return handles;
}

// Namespace-scope Libraries rather than TORCH_LIBRARY_IMPL, so that the keys come from
// torch_compat.h (Note [Dispatch keys]) instead of being spelled here.
struct Registrations {
  Registrations()
      : fake(torch::Library::IMPL, "_", kFakeKey, __FILE__, __LINE__),
        deferred_init(torch::Library::IMPL, "_", kDeferredInitKey, __FILE__, __LINE__),
        meta(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__),
        followed_generator(torch::Library::IMPL, "_", kFollowedGeneratorKey, __FILE__, __LINE__) {
    fake.fallback(torch::CppFunction::makeFromBoxedFunction<&recording_fake_fallback>());
    deferred_init.fallback(torch::CppFunction::makeFromBoxedFunction<&deferred_init_fallback>());
    followed_generator.fallback(
        torch::CppFunction::makeFromBoxedFunction<&followed_generator_fallback>());
    meta_rules = register_meta_rules(meta);
    fall_throughs = fall_through_deferred_init_key();
  }

  torch::Library fake;
  torch::Library deferred_init;
  torch::Library meta;
  torch::Library followed_generator;
  int meta_rules = 0;
  std::vector<c10::RegistrationHandleRAII> fall_throughs;
};

const Registrations registrations;

}  // namespace

TORCH_LIBRARY(torchdefer, m) {
  m.def(
      "trunc_normal_(Tensor(a!) self, float mean, float std, float a, float b, *, "
      "Generator? generator=None) -> Tensor(a!)",
      {at::Tag::nondeterministic_seeded});
}

TORCH_LIBRARY_IMPL(torchdefer, CompositeExplicitAutograd, m) {
  m.impl("trunc_normal_", &trunc_normal_kernel);
}

int registered_meta_rules() { return registrations.meta_rules; }

}  // namespace torchdefer::detail
