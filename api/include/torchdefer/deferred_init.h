// deferred_init: construct a module, or run any callable, without allocating a single parameter.
// Every operation on its tensors is recorded so that materialize_module can replay it later.
//
//   auto linear = torchdefer::deferred_init<torch::nn::Linear>(8192, 8192);
//   auto model = torchdefer::deferred_init([&] { return Llama(config); });
//
// DeferredInitGuard does the same for a block of code instead of a callable:
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

#include <torchdefer/export.h>
#include <torchdefer/fake_tensor.h>

#include <ATen/core/Tensor.h>
#include <c10/util/Type.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace torchdefer {

// Which generator a random op on a CUDA tensor draws from in torch RNG mode (Note [Torch-mode
// draws on CUDA] in recorder/internal/torchdefer/cuda_draws.h).
enum class CudaDraws {
  // kCudaGenerator where a CUDA device is present, else kCpuGenerator: eager construction's values
  // on this machine.
  kAuto,
  // CUDA's Philox generator, as eager construction on the GPU draws: eager's bits on this GPU
  // model, and CUDA's generator left where eager leaves it.
  kCudaGenerator,
  // The default CPU generator, as eager construction on the CPU draws: the same bits on every
  // device and GPU model.
  kCpuGenerator,
};

// Options of one deferred_init call, builder-style:
//   deferred_init(DeferredInitOptions().exact_generator(true), [&] { return Llama(config); });
class DeferredInitOptions {
 public:
  // Leave the default CPU generator exactly where eager construction leaves it when deferred_init
  // returns, even after random ops whose draws depend on values (trunc_normal_): they are then
  // computed once at the end of recording, on a scratch tensor, as eager does (Note [The generator
  // after deferred_init]). Off by default: the generator is then owed until a materialization.
  DeferredInitOptions& exact_generator(bool exact) {
    exact_generator_ = exact;
    return *this;
  }
  bool exact_generator() const { return exact_generator_; }

  // Which generator random ops on CUDA tensors draw from in torch RNG mode (kAuto by default).
  DeferredInitOptions& cuda_draws(CudaDraws draws) {
    cuda_draws_ = draws;
    return *this;
  }
  CudaDraws cuda_draws() const { return cuda_draws_; }

 private:
  bool exact_generator_ = false;
  CudaDraws cuda_draws_ = CudaDraws::kAuto;
};

namespace detail {

// Whether a deferred_init argument list starts with its options (then the overloads that take
// options explicitly apply, not the ones that would pass them on to a constructor).
template <typename... Args>
struct StartsWithOptions : std::false_type {};
template <typename First, typename... Rest>
struct StartsWithOptions<First, Rest...> : std::is_same<std::decay_t<First>, DeferredInitOptions> {
};

class Recording;

}  // namespace detail

// Note [A guard is a scope]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// deferred_init opens a guard around its callable, so a guarded block behaves as the callable
// would: guards nest with each other and with deferred_init (each inner one records its own
// graph), other threads are untouched, the default generator is left where eager construction
// leaves it, and an exception that unwinds the guard leaves no recording state behind (the fakes
// built so far stay fake). The recording state is a per-thread stack, so
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
  std::unique_ptr<detail::Recording> recording_;  // Note [Who reads values]
};

// Constructs `ModuleHolder(args...)` (a torch::nn module holder such as torch::nn::Linear, or any
// type) with its parameters and buffers fake and their initialization recorded.
template <typename ModuleHolder, typename... Args,
          std::enable_if_t<std::is_constructible_v<ModuleHolder, Args&&...> &&
                               !detail::StartsWithOptions<Args...>::value,
                           int> = 0>
ModuleHolder deferred_init(Args&&... args) {
  DeferredInitGuard guard(c10::demangle_type<ModuleHolder>());
  return ModuleHolder(std::forward<Args>(args)...);
}

// Calls `f(args...)` with every tensor it creates fake and every operation recorded.
// (`ExplicitArgumentBarrier` keeps deferred_init<SomeHolder>(...) from considering this overload:
// asking whether a module holder is invocable instantiates its forward() with the wrong types.)
template <int&... ExplicitArgumentBarrier, typename F, typename... Args,
          std::enable_if_t<
              std::is_invocable_v<F&&, Args&&...> && !detail::StartsWithOptions<F>::value, int> = 0>
std::invoke_result_t<F&&, Args&&...> deferred_init(F&& f, Args&&... args) {
  DeferredInitGuard guard(c10::demangle_type<std::decay_t<F>>());
  return std::invoke(std::forward<F>(f), std::forward<Args>(args)...);
}

// deferred_init with options: `deferred_init(options, f, args...)` calls `f(args...)` and
// `deferred_init<ModuleHolder>(options, args...)` constructs a module.
template <typename ModuleHolder, typename... Args,
          std::enable_if_t<std::is_constructible_v<ModuleHolder, Args&&...>, int> = 0>
ModuleHolder deferred_init(const DeferredInitOptions& options, Args&&... args) {
  DeferredInitGuard guard(c10::demangle_type<ModuleHolder>(), options);
  return ModuleHolder(std::forward<Args>(args)...);
}

template <int&... ExplicitArgumentBarrier, typename F, typename... Args,
          std::enable_if_t<std::is_invocable_v<F&&, Args&&...>, int> = 0>
std::invoke_result_t<F&&, Args&&...> deferred_init(const DeferredInitOptions& options, F&& f,
                                                   Args&&... args) {
  DeferredInitGuard guard(c10::demangle_type<std::decay_t<F>>(), options);
  return std::invoke(std::forward<F>(f), std::forward<Args>(args)...);
}

// Inside deferred_init, or after it returned: a real tensor, private to the caller, holding the
// values `t` has so far, as eager would have computed them, for code that reads small tensors
// (`Tensor::item()` and the other data-dependent ops call it for you). Costs a replay of the
// recorded ops behind `t` and changes nothing else (Note [Reading values while recording]).
// Returns `t` itself when it is real; raises for a fake of a FakeMode, or, inside a deferred_init,
// of a recording that is not the one in progress on this thread.
TORCHDEFER_API at::Tensor read_values(const at::Tensor& t);

// The recorded operations that will produce `t`'s data, in order, one line, e.g.
// "empty([4096, 4096]) → uniform_(-0.015625, 0.015625)". Says so when `t` is real or a fake that
// nothing recorded.
TORCHDEFER_API std::string explain(const at::Tensor& t);

}  // namespace torchdefer
