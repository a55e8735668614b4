// What the Python extension (bindings/src/module.cpp) uses beyond the installed API: exported from
// libtorchdefer, since the extension is another shared object, but declared only here and never
// installed, so that no C++ program is written against it. The C++ suite uses it too.
#pragma once

#include <torchdefer/deferred_init.h>
#include <torchdefer/export.h>
#include <torchdefer/materialize.h>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torchdefer {

// A DeferredInitGuard that may live on the heap: a Python block (`with deferred():`, the
// recording Python's deferred_init opens) begins and ends in two calls, so the extension holds it
// between them. It must still end on the thread that opened it (Note [A scope dropped on another
// thread]).
class TORCHDEFER_API RecordingScope {
 public:
  explicit RecordingScope(std::string context, DeferredInitOptions options = {});
  ~RecordingScope();
  RecordingScope(const RecordingScope&) = delete;
  RecordingScope& operator=(const RecordingScope&) = delete;

 private:
  DeferredInitGuard guard_;
};

// Gives up `scope` on a thread other than the one that opened it, which cannot restore that
// thread's state (Note [A scope dropped on another thread], api/src/extension.cpp): the scope is
// left to its thread, never destroyed, and no longer counts as a recording open in the process.
TORCHDEFER_API void abandon_on_another_thread(std::unique_ptr<RecordingScope> scope);

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

// The same for every CUDA generator that recordings drawing from CUDA's generator owe samplers
// (Note [Torch-mode draws on CUDA] in recorder/internal/torchdefer/cuda_draws.h): runs them on the
// GPU and leaves each generator where eager has it, for code about to read its state
// (torch.cuda.get_rng_state, fork_rng).
TORCHDEFER_API void pay_cuda_generator_debts();

// True if `t` is a real tensor that `.data = fake` gave a fake's metadata and dispatch keys but
// not its recording: it can be neither read nor materialized (the Python package refuses it).
TORCHDEFER_API bool has_fake_metadata_only(const at::TensorBase& t) noexcept;

// The storage a fake shares with its views and detached copies: two fakes alias exactly when
// their identities are equal. What Python's deepcopy keys its storage copies by; {nullptr, 0} for
// a tensor that is not fake.
struct FakeStorage {
  const void* identity = nullptr;
  int64_t nbytes = 0;
};
TORCHDEFER_API FakeStorage fake_storage(const at::TensorBase& t) noexcept;

// A tensor of a module, by qualified name, for callers that walk their own module trees (the
// Python package). Shard layouts split parameters and keep buffers whole.
struct NamedTensor {
  std::string name;
  at::Tensor tensor;
  bool parameter = true;
};

// materialize_module for a list of named tensors (check_fn and buffers_only are the caller's).
TORCHDEFER_API MaterializeStats materialize_named_tensors(const std::vector<NamedTensor>& tensors,
                                                          const MaterializeOptions& options = {});

// The same with a checkpoint: `module_tensors` names every parameter and buffer of the module,
// under each of its names (tied ones), real ones and those check_fn skips included, so that the
// checkpoint's names are checked against the whole module (Note [Checking a checkpoint first]).
TORCHDEFER_API MaterializeStats materialize_named_tensors(
    const std::vector<NamedTensor>& tensors, const std::vector<NamedTensor>& module_tensors,
    const MaterializeOptions& options);

// What this libtorchdefer was built with and what it uses on the machine it runs on, for
// diagnostics and bug reports (`python -m torchdefer` prints them). The instruction set
// counter-mode materialization fills CPU tensors with here: "avx512", "avx2" or "scalar", chosen
// from the CPU at run time and capped by TORCHDEFER_CPU_CAPABILITY.
TORCHDEFER_API std::string counter_fill_cpu_capability();

// The version of the counter scheme this build's counter mode computes (Note [Counter scheme
// versions]): the same version gives the same counter-mode weights.
TORCHDEFER_API int counter_scheme_version();

// The generator the recorder follows in place of `original` (Note [Followed generators],
// recorder/internal/torchdefer/followed_generator.h): one of `original`'s state, or `original`
// itself when it is followed already. For the extension to give a Python torch.Generator (Note
// [Swapping a Python generator], bindings/src/module.cpp).
TORCHDEFER_API at::Generator followed_generator_of(const at::Generator& original);

// Whether the CUDA counter fill is compiled in, so that counter mode fills CUDA tensors on the
// GPU; without it they are filled on the CPU and copied.
TORCHDEFER_API bool has_cuda_kernels();

}  // namespace torchdefer
