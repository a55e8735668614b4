// What only the Python extension uses (torchdefer/extension.h), asked of the layers that know.
#include <torchdefer/extension.h>

#include <torchdefer/counter_rng.h>
#include <torchdefer/cuda_draws.h>
#include <torchdefer/fake_tensor_impl.h>
#include <torchdefer/followed_generator.h>
#include <torchdefer/generator_sharing.h>
#include <torchdefer/recording.h>
#include <torchdefer/torch_compat.h>

#include <memory>
#include <string>
#include <utility>

namespace torchdefer {

RecordingScope::RecordingScope(std::string context, DeferredInitOptions options)
    : guard_(std::move(context), options) {}

RecordingScope::~RecordingScope() = default;

// Note [A scope dropped on another thread]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A recording changes its thread's state (the deferred_init key, the open recordings, the
// thread's graph) and must end on that thread; a C++ guard always does. A Python block entered and
// never exited (a thread that ended inside it, a suspended generator) is dropped by whichever
// thread releases its last reference, which cannot restore another thread's state: destroying the
// scope there crashed or corrupted the dropping thread. The bindings give such a scope up instead:
// it is left to its thread, and it stops counting as an open recording (Note [Replays that lend
// themselves the default generator]), so that other threads' replays are not refused for good.
void abandon_on_another_thread(std::unique_ptr<RecordingScope> scope) {
  detail::forget_recording_of_another_thread();
  (void)scope.release();
}

bool made_in_inference_mode(const at::Tensor& t) { return detail::made_in_inference_mode(t); }

uint64_t inference_tensors_made() { return detail::inference_tensors_made(); }

void refuse_inference_tensor(const std::string& what) { detail::refuse_inference_tensor(what); }

void settle_default_generator(bool about_to_read) {
  detail::settle_default_generator(about_to_read);
}

void pay_cuda_generator_debts() { detail::pay_cuda_generator_debts(); }

bool has_fake_metadata_only(const at::TensorBase& t) noexcept {
  return t.defined() && !is_fake(t) && t.key_set().has(kFakeKey);
}

FakeStorage fake_storage(const at::TensorBase& t) noexcept {
  const FakeTensorImpl* impl = fake_impl(t);
  if (impl == nullptr || !impl->meta().defined()) {
    return {};
  }
  return {impl->storage_identity(), static_cast<int64_t>(impl->meta().storage().nbytes())};
}

std::string counter_fill_cpu_capability() { return counter_fill_isa(); }

int counter_scheme_version() { return kCounterSchemeVersion; }

at::Generator followed_generator_of(const at::Generator& original) {
  return detail::followed_generator_of(original);
}

bool has_cuda_kernels() { return counter_fill_has_cuda_kernel(); }

}  // namespace torchdefer
