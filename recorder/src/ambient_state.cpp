// The autocast part of the ambient state (Note [Ambient state is part of the recording]): what
// autocast_mode.h declares, which only this file includes.
#include <torchdefer/ambient_state.h>

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>

namespace torchdefer {
namespace {

// The device types autocast can be on for in this build, in the order their state is read.
constexpr c10::DeviceType kAutocastDeviceTypes[] = {
    c10::DeviceType::CPU, c10::DeviceType::CUDA, c10::DeviceType::XPU,
    c10::DeviceType::MPS, c10::DeviceType::HPU,  c10::DeviceType::XLA,
    c10::DeviceType::IPU, c10::DeviceType::MTIA, c10::DeviceType::PrivateUse1,
};

}  // namespace

std::array<AutocastOn, 2> AmbientState::current_autocast() {
  std::array<AutocastOn, 2> on{};
  size_t used = 0;
  for (const c10::DeviceType type : kAutocastDeviceTypes) {
    if (!at::autocast::is_autocast_available(type) || !at::autocast::is_autocast_enabled(type)) {
      continue;
    }
    TORCH_CHECK(used < on.size(), "torchdefer: autocast is on for more than two device types (",
                on[0].device_type, ", ", on[1].device_type, ", ", type,
                ") while recording; deferred_init keeps the autocast state of at most two. Turn "
                "autocast off for the device types the model is not built on.");
    on[used++] = AutocastOn{type, at::autocast::get_autocast_dtype(type)};
  }
  return on;
}

void set_autocast(const std::array<AutocastOn, 2>& autocast) {
  for (const c10::DeviceType type : kAutocastDeviceTypes) {
    if (!at::autocast::is_autocast_available(type)) {
      continue;
    }
    bool enabled = false;
    for (const AutocastOn& on : autocast) {
      if (on.dtype != c10::ScalarType::Undefined && on.device_type == type) {
        at::autocast::set_autocast_dtype(type, on.dtype);
        enabled = true;
      }
    }
    at::autocast::set_autocast_enabled(type, enabled);
  }
}

}  // namespace torchdefer
