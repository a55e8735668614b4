// DeferredInitGuard: a RecordingScope with a public name (Note [A guard is a scope]).
#include <torchdefer/deferred_init_guard.h>

#include <string>
#include <utility>

namespace torchdefer {

DeferredInitGuard::DeferredInitGuard(std::string context, DeferredInitOptions options)
    : scope_(std::move(context), options) {}

DeferredInitGuard::~DeferredInitGuard() = default;

}  // namespace torchdefer
