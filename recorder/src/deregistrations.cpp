#include "deregistrations.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <memory>

namespace torchdefer::detail {
namespace {

std::atomic<uint64_t> deregistrations{0};

class DeregistrationCounter final : public c10::OpRegistrationListener {
 public:
  void onOperatorRegistered(const c10::OperatorHandle&) override {}
  void onOperatorDeregistered(const c10::OperatorHandle&) override {
    deregistrations.fetch_add(1, std::memory_order_acq_rel);
  }
};

}  // namespace

uint64_t deregistrations_so_far() {
  // Never removed: the dispatcher owns the listener, and removing it at exit could run after the
  // dispatcher is gone.
  static const c10::RegistrationHandleRAII* const listening =
      new c10::RegistrationHandleRAII(c10::Dispatcher::singleton().addRegistrationListener(
          std::make_unique<DeregistrationCounter>()));
  (void)listening;
  return deregistrations.load(std::memory_order_acquire);
}

}  // namespace torchdefer::detail
