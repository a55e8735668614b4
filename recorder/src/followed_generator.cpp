#include <torchdefer/followed_generator.h>

#include <torchdefer/mt19937_jump.h>
#include <torchdefer/torch_compat.h>

#include <c10/core/Backend.h>

#include <memory>
#include <mutex>
#include <utility>

#include "recorder_kernels.h"

namespace torchdefer {

FollowedGenerator::FollowedGenerator(const at::Tensor& state) {
  key_set_ = key_set_ | c10::DispatchKeySet(kFollowedGeneratorKey);
  at::CPUGeneratorImpl::set_state(*state.unsafeGetTensorImpl());
}

// Whether the generator is as paying (or the last counted op) left it: the engine and the cached
// normal samples, which a draw of normal_ on fewer than 16 elements consumes without moving the
// engine every other call.
bool FollowedGenerator::as_paid() {
  return detail::same_engine(engine().data(), paid_.engine.data()) &&
         next_float_normal_sample() == paid_.float_normal &&
         next_double_normal_sample() == paid_.double_normal;
}

void FollowedGenerator::remember_paid() {
  paid_ = {engine(), next_float_normal_sample(), next_double_normal_sample()};
}

std::optional<FollowedGenerator::Position> FollowedGenerator::followed() {
  if (!owed() && position_ && !as_paid()) {
    position_.reset();  // moved since it was paid: its own state is where the next op starts
  }
  return position_;
}

void FollowedGenerator::advance(uint64_t draws) {
  if (!owed()) {
    discard_draws(*this, draws);
    remember_paid();
  }
  if (position_) {
    position_->offset += draws;
  }
}

void FollowedGenerator::owe(std::shared_ptr<RngAnchor> anchor) {
  position_ = Position{std::move(anchor), 0};
  owed_.store(true, std::memory_order_release);
}

void FollowedGenerator::pay() {
  if (!owed()) {
    return;
  }
  const at::Tensor state = position_->anchor->state();
  at::CPUGeneratorImpl::set_state(*state.unsafeGetTensorImpl());
  discard_draws(*this, position_->offset);
  remember_paid();
  owed_.store(false, std::memory_order_release);
}

void FollowedGenerator::forget() {
  position_.reset();
  owed_.store(false, std::memory_order_release);
}

// A reseed or a new state makes the debt moot, as it makes the draws moot in eager; one the base
// class refuses leaves it owed.
void FollowedGenerator::set_current_seed(uint64_t seed) {
  at::CPUGeneratorImpl::set_current_seed(seed);
  forget();
}

void FollowedGenerator::set_offset(uint64_t offset) {
  at::CPUGeneratorImpl::set_offset(offset);
  forget();
}

uint64_t FollowedGenerator::seed() {
  const uint64_t seed = at::CPUGeneratorImpl::seed();
  forget();
  return seed;
}

void FollowedGenerator::set_state(const c10::TensorImpl& new_state) {
  at::CPUGeneratorImpl::set_state(new_state);
  forget();
}

// Reading the state is a read of the generator: the debt is paid first. The caller holds mutex_,
// as every reader of a generator's state does.
c10::intrusive_ptr<c10::TensorImpl> FollowedGenerator::get_state() const {
  const_cast<FollowedGenerator*>(this)->pay();
  return at::CPUGeneratorImpl::get_state();
}

// A clone is an ordinary CPU generator at the state eager would have.
at::CPUGeneratorImpl* FollowedGenerator::clone_impl() const {
  auto clone = std::make_unique<at::CPUGeneratorImpl>();
  clone->set_state(*get_state());
  return clone.release();
}

FollowedGenerator* followed_generator(const at::Generator& generator) {
  if (!generator.defined() || !generator.key_set().has(kFollowedGeneratorKey)) {
    return nullptr;
  }
  return dynamic_cast<FollowedGenerator*>(generator.unsafeGetGeneratorImpl());
}

namespace detail {

at::Generator followed_generator_of(const at::Generator& original) {
  if (followed_generator(original) != nullptr) {
    return original;
  }
  at::Generator generator = original;
  at::Tensor state;
  {
    const std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state();
  }
  return at::make_generator<FollowedGenerator>(state);
}

void followed_generator_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                                 torch::jit::Stack* stack) {
  if (!keys.has_backend(c10::BackendComponent::MetaBit)) {  // a meta shadow draws nothing
    const size_t arguments = op.schema().arguments().size();
    for (size_t i = stack->size() - arguments; i < stack->size(); ++i) {
      const c10::IValue& argument = (*stack)[i];
      if (!argument.isGenerator()) {
        continue;
      }
      at::Generator generator = argument.toGenerator();
      FollowedGenerator* followed = followed_generator(generator);
      if (followed != nullptr && followed->owed()) {
        const std::lock_guard<std::mutex> lock(generator.mutex());
        followed->pay();
      }
    }
  }
  op.redispatchBoxed(
      keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kFollowedGeneratorKey), stack);
}

}  // namespace detail
}  // namespace torchdefer
