// DeferredInitGuard: deferred_init for a block of code instead of a callable. While a guard lives,
// every module and tensor its thread constructs is fake and its initialization recorded:
//
//   torch::manual_seed(0);
//   std::shared_ptr<Llama> model;
//   {
//     torchdefer::DeferredInitGuard deferred("Llama");
//     model = std::make_shared<Llama>(config);
//     head = torch::nn::Linear(4096, 32000);
//   }
//   torchdefer::materialize_module(*model);  // eager's values, bit for bit (torch RNG mode)
#pragma once

#include <torchdefer/deferred_init.h>
#include <torchdefer/export.h>

#include <cstddef>
#include <string>

namespace torchdefer {

// Note [A guard is a scope]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// The guard opens what deferred_init opens around its callable, a RecordingScope, so the block
// behaves as the callable would: guards nest with each other and with deferred_init (each inner
// one records its own graph), other threads are untouched, the default generator is left where
// eager construction leaves it, and an exception that unwinds the guard leaves no recording
// state behind (the fakes built so far stay fake). The recording state is a per-thread stack, so
// a guard must end on its thread, after every guard created inside it: a local variable always
// does. The guard can be neither copied, moved nor allocated with new, so that it cannot outlive
// its block or end on another thread.
class TORCHDEFER_API DeferredInitGuard {
 public:
  // `context` names the block in errors ("while recording aten::view in deferred_init of
  // <context>"); `options` are deferred_init's (DeferredInitOptions::exact_generator).
  explicit DeferredInitGuard(std::string context = "DeferredInitGuard",
                             DeferredInitOptions options = {});
  ~DeferredInitGuard();

  DeferredInitGuard(const DeferredInitGuard&) = delete;
  DeferredInitGuard& operator=(const DeferredInitGuard&) = delete;
  DeferredInitGuard(DeferredInitGuard&&) = delete;
  DeferredInitGuard& operator=(DeferredInitGuard&&) = delete;
  static void* operator new(std::size_t) = delete;
  static void* operator new[](std::size_t) = delete;

 private:
  RecordingScope scope_;
};

}  // namespace torchdefer
