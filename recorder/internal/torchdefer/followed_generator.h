// Followed generators: a user's CPU torch.Generator that the recorder follows, so that a random op
// whose draws depend on its values can be recorded without running it, and the generator still
// answers every read as eager construction leaves it.
#pragma once

#include <torchdefer/rng_anchors.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

namespace torchdefer {

// Note [Followed generators]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Trainers pass their own seeded generator to every init (`trunc_normal_(w, generator=g)`). How
// many numbers such a sampler takes depends on the numbers (Note [trunc_normal_ as one
// operator]), so `g` is where eager leaves it only once the sampler has run: at eager's cost, the
// cost deferred_init exists to avoid. The generator's state can be read at any moment, though,
// and must then be eager's. Those reads all pass one of two doors: a virtual method of
// c10::GeneratorImpl (get_state, set_state, manual_seed, seed, clone: every method of
// torch.Generator and of at::Generator), or an operator given the generator, whose kernel draws
// from it after the dispatcher computed the call's keys, the generator's own key set among them.
//
// So the first time a trunc_normal_ given a CPU torch.Generator (other than the default one) is
// recorded, the generator's Python object is given a FollowedGenerator instead of its
// CPUGeneratorImpl, with the same state (the extension does the swap: Note [Swapping a Python
// generator] in bindings/src/module.cpp). A FollowedGenerator is a CPUGeneratorImpl, so every
// kernel draws from it as from any CPU generator; it overrides the virtual methods, and carries
// kFollowedGeneratorKey (Note [Dispatch keys]), whose fallback runs before any kernel of an op
// given it. A value-dependent sampler recorded on it is placed at the generator's position, and
// the generator then *owes* it: its position is a lazy anchor after the sampler (Note [Lazy RNG
// anchors]), its engine stays where it was, and the ops recorded on it next are placed from that
// anchor, so a recording of any number of them runs none. The debt is paid, running the samplers
// on scratch from private generators (eager's cost for them, once), the first time a read comes
// through either door: get_state() and clone() pay, set_state(), manual_seed() and seed() make
// the debt moot, and the fallback pays before any op on real tensors (a fake's meta shadow draws
// nothing, and a recorded op continues the debt). A torch-mode materialization resolves the
// anchors of the samplers it replays, so that paying after it costs nothing more.
//
// Composite ops given the generator (torch.randn, rand, randint, ...) reach the fallback through
// the op they call that draws. What passes neither door is C++ code that draws through
// CPUGeneratorImpl's non-virtual methods itself (random(), engine()), as an extension kernel
// called directly rather than through the dispatcher may: it draws from the state before the
// debt. Such code should pass the generator through an operator, or read its state first.
//
// A generator paid and not moved since is still followed: the next op recorded on it continues
// from the same lazy anchor, not from a state read anew. So its counter key (Note [Counter keys of
// explicit generators]) is the same whether or not anything read the generator in between.
//
// Only a Python generator can be swapped: an at::Generator of a C++ program is the pointer its
// owner holds. Such a generator, and any generator under deferred_init(..., exact_generator=True),
// is exact as soon as the op is recorded: the sampler runs at record time (Note [Explicit
// generators], recorder/src/torch_rng.h).
class FollowedGenerator final : public at::CPUGeneratorImpl {
 public:
  // A generator with `state` (a CPU generator's get_state()).
  explicit FollowedGenerator(const at::Tensor& state);

  // Where the next op recorded on this generator starts: `offset` counted draws after `anchor`.
  struct Position {
    std::shared_ptr<RngAnchor> anchor;
    uint64_t offset = 0;
  };

  // The caller holds mutex_ for each of the following.
  // The followed position: the generator owes it, or was paid and not moved since; nullopt when
  // its own state is where the next op starts.
  std::optional<Position> followed();
  // An op of `draws` counted draws placed at followed(): it adds to the debt, or moves the engine.
  void advance(uint64_t draws);
  // The generator now owes everything up to lazy anchor `anchor`.
  void owe(std::shared_ptr<RngAnchor> anchor);
  // Leaves the generator where eager would have it, resolving the anchors it owes.
  void pay();
  bool owed() const { return owed_.load(std::memory_order_acquire); }

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

 private:
  at::CPUGeneratorImpl* clone_impl() const override;
  void forget();
  bool as_paid();
  void remember_paid();

  std::optional<Position> position_;  // set by owe(), kept while paid and unmoved
  std::atomic<bool> owed_{false};     // written under mutex_; read without it by the fallback
  struct {
    at::mt19937 engine;
    std::optional<float> float_normal;
    std::optional<double> double_normal;
  } paid_;
};

// `generator`'s implementation if it is a FollowedGenerator, else nullptr.
FollowedGenerator* followed_generator(const at::Generator& generator);

namespace detail {

// A FollowedGenerator with `original`'s state, or `original` when it is one already: for the
// extension to give the Python object (Note [Swapping a Python generator] in
// bindings/src/module.cpp).
at::Generator followed_generator_of(const at::Generator& original);

}  // namespace detail
}  // namespace torchdefer
