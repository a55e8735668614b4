// deferred_init: construct a module, or run any callable, without allocating a single parameter.
// Every operation on its tensors is recorded so that materialize_module can replay it later.
//
//   auto linear = torchdefer::deferred_init<torch::nn::Linear>(8192, 8192);
//   auto model = torchdefer::deferred_init([&] { return Llama(config); });
#pragma once

#include <torchdefer/export.h>
#include <torchdefer/fake_tensor.h>

#include <ATen/core/Tensor.h>
#include <c10/util/Type.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace torchdefer {

class OpGraph;

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

 private:
  bool exact_generator_ = false;
};

namespace detail {

// Whether a deferred_init argument list starts with its options (then the overloads that take
// options explicitly apply, not the ones that would pass them on to a constructor).
template <typename... Args>
struct StartsWithOptions : std::false_type {};
template <typename First, typename... Rest>
struct StartsWithOptions<First, Rest...> : std::is_same<std::decay_t<First>, DeferredInitOptions> {
};

}  // namespace detail

// What deferred_init opens around construction; exported for bindings that open and close it
// themselves (the Python package's deferred_init). While a RecordingScope lives on a thread,
// factories return fakes (as under FakeMode) and every operator on fakes is recorded into a new
// OpGraph (Note [The op graph]). Scopes nest, each with its own graph; a scope that unwinds
// because construction threw leaves no key in TLS, and its graph goes away with the fakes that
// referred to it.
class TORCHDEFER_API RecordingScope {
 public:
  explicit RecordingScope(std::string context, DeferredInitOptions options = {});
  ~RecordingScope();
  RecordingScope(const RecordingScope&) = delete;
  RecordingScope& operator=(const RecordingScope&) = delete;

 private:
  FakeMode fake_;
  c10::impl::IncludeDispatchKeyGuard include_deferred_init_;
  std::shared_ptr<OpGraph> saved_graph_;
  bool exact_generator_;
};

// Gives up `scope` on a thread other than the one that opened it, which cannot restore that
// thread's state (Note [A scope dropped on another thread], recording.cpp): the scope is left to
// its thread, never destroyed, and no longer counts as a recording open in the process.
TORCHDEFER_API void abandon_on_another_thread(std::unique_ptr<RecordingScope> scope);

// Constructs `ModuleHolder(args...)` (a torch::nn module holder such as torch::nn::Linear, or any
// type) with its parameters and buffers fake and their initialization recorded.
template <typename ModuleHolder, typename... Args,
          std::enable_if_t<std::is_constructible_v<ModuleHolder, Args&&...> &&
                               !detail::StartsWithOptions<Args...>::value,
                           int> = 0>
ModuleHolder deferred_init(Args&&... args) {
  RecordingScope scope(c10::demangle_type<ModuleHolder>());
  return ModuleHolder(std::forward<Args>(args)...);
}

// Calls `f(args...)` with every tensor it creates fake and every operation recorded.
// (`ExplicitArgumentBarrier` keeps deferred_init<SomeHolder>(...) from considering this overload:
// asking whether a module holder is invocable instantiates its forward() with the wrong types.)
template <int&... ExplicitArgumentBarrier, typename F, typename... Args,
          std::enable_if_t<
              std::is_invocable_v<F&&, Args&&...> && !detail::StartsWithOptions<F>::value, int> = 0>
std::invoke_result_t<F&&, Args&&...> deferred_init(F&& f, Args&&... args) {
  RecordingScope scope(c10::demangle_type<std::decay_t<F>>());
  return std::invoke(std::forward<F>(f), std::forward<Args>(args)...);
}

// deferred_init with options: `deferred_init(options, f, args...)` calls `f(args...)` and
// `deferred_init<ModuleHolder>(options, args...)` constructs a module.
template <typename ModuleHolder, typename... Args,
          std::enable_if_t<std::is_constructible_v<ModuleHolder, Args&&...>, int> = 0>
ModuleHolder deferred_init(const DeferredInitOptions& options, Args&&... args) {
  RecordingScope scope(c10::demangle_type<ModuleHolder>(), options);
  return ModuleHolder(std::forward<Args>(args)...);
}

template <int&... ExplicitArgumentBarrier, typename F, typename... Args,
          std::enable_if_t<std::is_invocable_v<F&&, Args&&...>, int> = 0>
std::invoke_result_t<F&&, Args&&...> deferred_init(const DeferredInitOptions& options, F&& f,
                                                   Args&&... args) {
  RecordingScope scope(c10::demangle_type<std::decay_t<F>>(), options);
  return std::invoke(std::forward<F>(f), std::forward<Args>(args)...);
}

// Inside deferred_init, or after it returned: a real tensor, private to the caller, holding the
// values `t` has so far, as eager would have computed them, for code that reads small tensors
// (`Tensor::item()` and the other data-dependent ops call it for you). Costs a replay of the
// recorded ops behind `t` and changes nothing else (Note [Reading values while recording]).
// Returns `t` itself when it is real; raises for a fake of a FakeMode, or, inside a deferred_init,
// of a recording that is not the one in progress on this thread.
TORCHDEFER_API at::Tensor read_values(const at::Tensor& t);

// Whether the recorded fake `t` was made while torch.inference_mode() was on, where eager makes an
// inference tensor that materialization would not (Note [Inference mode while recording]).
TORCHDEFER_API bool made_in_inference_mode(const at::Tensor& t);

// How many tensors recordings in this process made in inference mode so far: Python's
// deferred_init looks for one in the module it returns only when this moved.
TORCHDEFER_API uint64_t inference_tensors_made();

// Refuses a tensor made_in_inference_mode(), `what` naming it ("cannot materialize w: it").
[[noreturn]] TORCHDEFER_API void refuse_inference_tensor(const std::string& what);

// Inside deferred_init: leaves PyTorch's default CPU generator where eager construction would
// have it at this point, for code about to read or set its state (torch.get_rng_state,
// torch.random.fork_rng). The recorder applies a recording's draws to the generator lazily, in
// one jump (Note [Torch-mode draw offsets]); this applies them now, resolving value-dependent
// samplers first if any (Note [Lazy RNG anchors]), and the next random op starts a new anchor.
// Does nothing when no draws are pending (Note [The generator's state read while recording] in
// bindings/torchdefer/_generator_state.py). With `about_to_read` false (code about to set the
// state: torch.manual_seed, set_rng_state), value-dependent samplers are not resolved: the set
// makes their draws moot, and the generator stays owed until the set replaces it (Note [The owed
// generator's mark]), so a reseed costs no eager work.
TORCHDEFER_API void settle_default_generator(bool about_to_read = true);

// The recorded operations that will produce `t`'s data, in order, one line, e.g.
// "empty([4096, 4096]) → uniform_(-0.015625, 0.015625)". Says so when `t` is real or a fake that
// nothing recorded.
TORCHDEFER_API std::string explain(const at::Tensor& t);

}  // namespace torchdefer
