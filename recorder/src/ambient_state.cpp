// The autocast part of the ambient state (Note [Ambient state is part of the recording]): what
// autocast_mode.h declares, which only this file includes.
#include <torchdefer/ambient_state.h>

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>

#include <iterator>
#include <tuple>

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

void forget_autocast_casts() { at::autocast::clear_cache(); }

AutocastGuard::AutocastGuard(const std::array<AutocastOn, 2>& recorded) {
  static_assert(std::size(kAutocastDeviceTypes) == std::tuple_size_v<decltype(saved_)>);
  for (size_t i = 0; i < saved_.size(); ++i) {
    const c10::DeviceType type = kAutocastDeviceTypes[i];
    if (!at::autocast::is_autocast_available(type)) {
      continue;
    }
    saved_[i] = {at::autocast::is_autocast_enabled(type), at::autocast::get_autocast_dtype(type)};
    bool enabled = false;
    for (const AutocastOn& on : recorded) {
      if (on.dtype != c10::ScalarType::Undefined && on.device_type == type) {
        at::autocast::set_autocast_dtype(type, on.dtype);
        enabled = true;
      }
    }
    at::autocast::set_autocast_enabled(type, enabled);
  }
}

AutocastGuard::~AutocastGuard() {
  for (size_t i = 0; i < saved_.size(); ++i) {
    const c10::DeviceType type = kAutocastDeviceTypes[i];
    if (!at::autocast::is_autocast_available(type)) {
      continue;
    }
    at::autocast::set_autocast_dtype(type, saved_[i].dtype);
    at::autocast::set_autocast_enabled(type, saved_[i].enabled);
  }
}

}  // namespace torchdefer
