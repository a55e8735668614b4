#include <torchdefer/fake_tensor.h>
#include <torchdefer/fake_tensor_impl.h>
#include <torchdefer/torch_compat.h>

namespace torchdefer {
namespace {

// The innermost FakeMode's default device on this thread (Note [The Fake fallback], step 3).
thread_local std::optional<c10::Device> tls_default_device;

}  // namespace

FakeMode::FakeMode() : include_fake_(kFakeKey), saved_default_device_(tls_default_device) {}

FakeMode::FakeMode(c10::Device default_device) : FakeMode() {
  tls_default_device = normalize_fake_device(default_device);
}

FakeMode::~FakeMode() { tls_default_device = saved_default_device_; }

bool FakeMode::is_active() { return c10::impl::tls_is_dispatch_key_included(kFakeKey); }

std::optional<c10::Device> FakeMode::default_device() { return tls_default_device; }

}  // namespace torchdefer
