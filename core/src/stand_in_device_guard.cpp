#include "stand_in_device_guard.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <array>
#include <mutex>

namespace torchdefer::detail {
namespace {

// See Note [Stand-in device guards].
class StandInDeviceGuard final : public c10::impl::DeviceGuardImplInterface {
 public:
  explicit StandInDeviceGuard(c10::DeviceType type) : type_(type) {}

  c10::DeviceType type() const override { return type_; }
  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device previous = getDevice();
    uncheckedSetDevice(device);
    return previous;
  }
  c10::Device getDevice() const override { return c10::Device(type_, current_index()); }
  void setDevice(c10::Device device) const override { uncheckedSetDevice(device); }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    current_index() = device.has_index() ? device.index() : c10::DeviceIndex{0};
  }
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }
  // No device, so that autograd starts no worker threads for it (Note [Stand-in device guards]).
  c10::DeviceIndex deviceCount() const noexcept override { return 0; }
  void record(void** /*event*/, const c10::Stream& /*stream*/, c10::DeviceIndex /*device_index*/,
              c10::EventFlag /*flag*/) const override {}
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* /*event*/, c10::DeviceIndex /*device_index*/) const noexcept override {}

 private:
  static c10::DeviceIndex& current_index() {
    thread_local c10::DeviceIndex index = 0;
    return index;
  }

  c10::DeviceType type_;
};

std::array<const StandInDeviceGuard*,
           static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>
    stand_ins{};
std::mutex stand_ins_mutex;

}  // namespace

void install_stand_in_device_guard(c10::DeviceType type) {
  if (c10::impl::hasDeviceGuardImpl(type)) {
    return;
  }
  const std::lock_guard<std::mutex> lock(stand_ins_mutex);
  if (c10::impl::hasDeviceGuardImpl(type)) {
    return;
  }
  // Lives for the rest of the process, like every registered guard.
  auto* guard = new StandInDeviceGuard(type);
  stand_ins[static_cast<size_t>(type)] = guard;
  c10::impl::DeviceGuardImplRegistrar(type, guard);
}

bool has_stand_in_device_guard(c10::DeviceType type) {
  if (!c10::impl::hasDeviceGuardImpl(type)) {
    return false;
  }
  const std::lock_guard<std::mutex> lock(stand_ins_mutex);
  return stand_ins[static_cast<size_t>(type)] == c10::impl::getDeviceGuardImpl(type);
}

}  // namespace torchdefer::detail
