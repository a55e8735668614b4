#include <torchdefer/rng_anchors.h>

#include <torchdefer/boxed_arguments.h>
#include <torchdefer/fake_tensor.h>
#include <torchdefer/mt19937_jump.h>
#include <torchdefer/torch_compat.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

namespace torchdefer {
namespace {

// One lock for every resolution and for the owed generator: resolutions share the default
// generator, and a lazy anchor resolves the anchors it continues from first (hence recursive).
std::recursive_mutex& resolution_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

std::optional<detail::GeneratorDebt>& debt() {
  static std::optional<detail::GeneratorDebt> owed;
  return owed;
}

thread_local int loan_depth = 0;

template <typename F>
auto with_default_generator(F&& f) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(generator.mutex());
  return f(generator, at::check_generator<at::CPUGeneratorImpl>(generator));
}

// Puts the default generator at `state` and then `draws` further.
void place_default_generator(const at::Tensor& state, uint64_t draws) {
  with_default_generator([&](at::Generator& generator, at::CPUGeneratorImpl* impl) {
    generator.set_state(state);
    discard_draws(*impl, draws);
  });
}

at::Tensor default_generator_state() {
  return with_default_generator(
      [](at::Generator& generator, at::CPUGeneratorImpl*) { return generator.get_state(); });
}

}  // namespace

std::shared_ptr<RngAnchor> RngAnchor::known(at::Tensor state) {
  auto anchor = std::make_shared<RngAnchor>();
  anchor->state_ = std::move(state);
  return anchor;
}

std::shared_ptr<RngAnchor> RngAnchor::known_later(std::shared_future<at::Tensor> state) {
  auto anchor = std::make_shared<RngAnchor>();
  anchor->later_ = std::move(state);
  return anchor;
}

std::shared_ptr<RngAnchor> RngAnchor::after(std::shared_ptr<RngAnchor> base, uint64_t offset,
                                            std::optional<RecordedNode> sampler,
                                            const at::Tensor& sampler_target,
                                            int64_t generator_argument) {
  auto anchor = std::make_shared<RngAnchor>();
  anchor->base_ = std::move(base);
  anchor->offset_ = offset;
  anchor->generator_argument_ = generator_argument;
  if (sampler) {
    anchor->target_sizes_ = sampler_target.sizes().vec();
    anchor->target_strides_ = sampler_target.strides().vec();
    anchor->target_dtype_ = sampler_target.scalar_type();
    const std::string op = c10::toString(sampler->op.schema().operator_name());
    anchor->description_ = c10::str(op, " on ", describe(sampler_target));
    anchor->sampler_key_ = c10::str(op, " ", sampler_target.scalar_type(), sampler_target.sizes());
    anchor->sampler_arguments_ = sampler->arguments.vec();
    if (generator_argument >= 0) {
      // Resolution draws from a generator of its own; the user's would keep its own debt alive.
      anchor->sampler_arguments_.at(static_cast<size_t>(generator_argument)) = c10::IValue();
    }
    anchor->sampler_inputs_ = sampler->inputs.vec();
    sampler->arguments = anchor->sampler_arguments_;
    sampler->inputs = anchor->sampler_inputs_;
    sampler->outputs = {};
    anchor->sampler_ = std::move(sampler);
  }
  return anchor;
}

// Resolved oldest first: a chain can hold an anchor per sampler of a model (tens of thousands in
// a trainer's init), one stack frame each if resolved from the newest.
at::Tensor RngAnchor::state() {
  const std::lock_guard<std::recursive_mutex> lock(resolution_mutex());
  std::vector<RngAnchor*> pending;
  RngAnchor* known = this;
  for (; !known->state_.defined() && !known->later_.valid(); known = known->base_.get()) {
    pending.push_back(known);
  }
  if (!known->state_.defined()) {
    known->state_ = known->later_.get();
    known->later_ = {};
  }
  // One loan of the default generator around every resolution of its chain: the owed generator
  // is paid when the outermost loan ends, which may release this anchor (the debt can be all that
  // holds it), so that must come after the state is returned.
  std::optional<detail::GeneratorLoan> loan;
  if (!pending.empty() && generator_argument_ < 0) {
    loan.emplace();
  }
  for (auto it = pending.rbegin(); it != pending.rend(); ++it) {
    (*it)->resolve((*it)->base_->state_);
  }
  return state_;
}

// Runs what the anchor waits for from its base's state `start`. Resolution is torchdefer's own
// computation: no Python dispatch mode the caller has active sees it or computes it instead (a
// FakeTensorMode would have left a state the sampler never draws).
void RngAnchor::resolve(const at::Tensor& start) {
  const NoPythonModesGuard no_python_modes;
  if (generator_argument_ >= 0) {
    state_ = resolve_on_own_generator(start);
    forget_what_resolution_needed();
    return;
  }
  detail::GeneratorLoan loan;
  place_default_generator(start, offset_);
  if (sampler_) {
    detail::run_sampler_on_scratch(*sampler_, target_sizes_, target_strides_, target_dtype_);
  }
  state_ = default_generator_state();
  forget_what_resolution_needed();
}

// The sampler's real inputs need not live on. A followed generator holds its position for as long
// as it lives (Note [Followed generators]): a resolved anchor of one keeps its key, not the chain
// before it.
void RngAnchor::forget_what_resolution_needed() {
  forget_sampler();
  if (generator_argument_ >= 0) {
    digest();
    base_.reset();
  }
}

// An anchor of a generator of its own: its base state, `offset_` draws on, then the sampler, all
// on a private generator.
at::Tensor RngAnchor::resolve_on_own_generator(const at::Tensor& start) {
  at::Generator own = cpu_generator_at(start, offset_);
  if (sampler_) {
    detail::run_sampler_on_scratch(*sampler_, target_sizes_, target_strides_, target_dtype_,
                                   generator_argument_, own);
  }
  return own.get_state();
}

namespace {

constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ull;

uint64_t fnv(uint64_t hash, const void* data, size_t size) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) {
    hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  }
  return hash;
}

}  // namespace

// Note [Counter keys of explicit generators] (replay/src/recorded_ops.h): a lazy anchor is named by
// where it starts and what it waits for, never by its state, which only running its samplers
// gives. Computed oldest first: a trainer's chain can hold an anchor per parameter.
uint64_t RngAnchor::digest() {
  const std::lock_guard<std::recursive_mutex> lock(resolution_mutex());
  std::vector<RngAnchor*> pending;
  for (RngAnchor* a = this; !a->digest_; a = a->base_.get()) {
    pending.push_back(a);
    if (a->base_ == nullptr) {
      break;
    }
  }
  for (auto it = pending.rbegin(); it != pending.rend(); ++it) {
    RngAnchor& a = **it;
    if (a.base_ == nullptr) {
      a.digest_ = digest_generator_state(a.state());
      continue;
    }
    uint64_t hash = digest_position(*a.base_->digest_, a.offset_);
    hash = fnv(hash, a.sampler_key_.data(), a.sampler_key_.size());
    a.digest_ = hash;
  }
  return *digest_;
}

uint64_t digest_generator_state(const at::Tensor& state) {
  return fnv(kFnvBasis, state.data_ptr<uint8_t>(), static_cast<size_t>(state.numel()));
}

uint64_t digest_position(uint64_t anchor, uint64_t offset) {
  return offset == 0 ? anchor : fnv(anchor, &offset, sizeof(offset));
}

bool RngAnchor::resolved() const {
  const std::lock_guard<std::recursive_mutex> lock(resolution_mutex());
  return state_.defined() || later_.valid();  // a state known later needs nothing computed
}

void RngAnchor::offer(const at::Tensor& state) {
  const std::lock_guard<std::recursive_mutex> lock(resolution_mutex());
  if (!state_.defined()) {
    state_ = state;
    forget_what_resolution_needed();
  }
}

std::string RngAnchor::pending_samplers() const {
  const std::lock_guard<std::recursive_mutex> lock(resolution_mutex());
  // Collected newest first and joined oldest first: a chain can run through every recording of
  // the process that still owes the generator, so prepending would copy it quadratically.
  std::vector<const std::string*> newest_first;
  for (const RngAnchor* a = this; a != nullptr && !a->state_.defined(); a = a->base_.get()) {
    if (!a->description_.empty()) {
      newest_first.push_back(&a->description_);
    }
  }
  std::string pending;
  for (auto it = newest_first.rbegin(); it != newest_first.rend(); ++it) {
    pending += (pending.empty() ? "" : ", ") + **it;
  }
  return pending;
}

namespace detail {

bool same_engine(const at::mt19937_data_pod& a, const at::mt19937_data_pod& b) {
  return a.seed_ == b.seed_ && a.left_ == b.left_ && a.seeded_ == b.seeded_ && a.next_ == b.next_ &&
         a.state_ == b.state_;
}

bool reseeded(const at::mt19937_data_pod& now, const at::mt19937_data_pod& expected) {
  return now.seed_ != expected.seed_ || same_engine(now, at::mt19937(now.seed_).data());
}

namespace {

at::mt19937_data_pod current_engine() {
  return with_default_generator(
      [](at::Generator&, at::CPUGeneratorImpl* impl) { return impl->engine().data(); });
}

void warn_unpaid(const GeneratorDebt& owed) {
  TORCH_WARN("torchdefer: the default CPU generator was used after deferred_init of ", owed.context,
             " before its value-dependent random ops (", owed.samplers,
             ") were resolved, so it could not be left where eager construction leaves it: "
             "numbers drawn from it since then differ from eager's, and so do the values of "
             "random ops recorded after that draw (a later deferred_init, init code run on a "
             "returned model); values recorded before it are eager's. "
             "Materialize in torch RNG mode before drawing, or pass exact_generator=True to "
             "deferred_init (Note [The generator after deferred_init]).");
}

// Note [The owed generator's mark]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// "Nobody moved the generator since" is judged by comparing its state with the one the recorder
// left. A recording that starts right after torch.manual_seed(s) leaves it at seed s's state, and
// so does the next torch.manual_seed(s): a later deferred_init (or materialization) would take
// the reseed for an untouched generator and continue the old recording's chain, which eager's
// reseed discarded. So the owed generator is left in a marked state that seeding and drawing
// never produce: the engine with left_ = 1 and next_ = 1 (MT19937 reaches left_ = 1 only with
// next_ = 0 after seeding, or next_ = N after drawing; left_ = 1 makes the next draw refill the
// state, which resets next_). When the recorder left the generator at left_ = 1 the mark draws
// what it would; otherwise the draws of an owed generator are not eager's either way (and
// torchdefer warns about them).
constexpr uint32_t kOwedMark = 1;

at::mt19937_data_pod mark_owed_generator(const at::mt19937_data_pod& expected) {
  return with_default_generator([&](at::Generator&, at::CPUGeneratorImpl* impl) {
    if (!same_engine(impl->engine().data(), expected)) {
      return expected;  // moved since: the debt is dropped (or warned about) when next seen
    }
    at::mt19937_data_pod marked = expected;
    marked.left_ = 1;
    marked.next_ = kOwedMark;
    at::mt19937 engine;
    engine.set_data(marked);
    impl->set_engine(engine);
    return marked;
  });
}

// Pays `owed` if its anchor is resolved; returns false if it is still pending.
bool pay_if_resolved(const GeneratorDebt& owed) {
  if (!owed.anchor->resolved()) {
    return false;
  }
  const at::mt19937_data_pod now = current_engine();
  if (same_engine(now, owed.expected)) {
    place_default_generator(owed.anchor->state(), owed.offset);
  } else if (!reseeded(now, owed.expected)) {
    warn_unpaid(owed);
  }
  return true;
}

}  // namespace

GeneratorLoan::GeneratorLoan() : saved_(default_generator_state()) { ++loan_depth; }

GeneratorLoan::~GeneratorLoan() {
  with_default_generator(
      [&](at::Generator& generator, at::CPUGeneratorImpl*) { generator.set_state(saved_); });
  if (--loan_depth > 0) {
    return;
  }
  const std::lock_guard<std::recursive_mutex> lock(resolution_mutex());
  if (debt() && pay_if_resolved(*debt())) {
    debt().reset();
  }
}

void set_generator_debt(std::optional<GeneratorDebt> owed) {
  const std::lock_guard<std::recursive_mutex> lock(resolution_mutex());
  if (owed) {
    owed->expected = mark_owed_generator(owed->expected);
  }
  debt() = std::move(owed);
}

std::optional<GeneratorDebt> take_generator_debt() {
  const std::lock_guard<std::recursive_mutex> lock(resolution_mutex());
  std::optional<GeneratorDebt> owed = std::move(debt());
  debt().reset();
  if (!owed) {
    return std::nullopt;
  }
  const at::mt19937_data_pod now = current_engine();
  if (same_engine(now, owed->expected)) {
    return owed;
  }
  if (!reseeded(now, owed->expected)) {
    warn_unpaid(*owed);
  }
  return std::nullopt;
}

void pay_generator_debt_now() {
  const std::lock_guard<std::recursive_mutex> lock(resolution_mutex());
  if (!debt()) {
    return;
  }
  debt()->anchor->state();  // the outermost loan it takes pays the debt as it ends
  if (debt() && pay_if_resolved(*debt())) {
    debt().reset();
  }
}

// Note [Samplers nothing keeps]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An owed generator is paid once its anchors are resolved, and a torch-mode replay resolves those
// of the samplers it runs. A sampler whose result nothing keeps (trunc_normal_ of a temporary,
// after a value read made the chain lazy) is never replayed, so its anchor would never be
// resolved and the generator never left where eager leaves it, whatever was materialized. Eager
// ran it; so it runs, on scratch, at eager's cost for that op, and the debt is paid, once nothing
// of its recording can be materialized any more: after a torch-mode materialization that leaves
// no fake of it, or when the recording ends with none (a constructor whose tensors are all real,
// or dead). A recording whose fakes were dropped unmaterialized stays owed, as before: paying it
// at some later, unrelated call would cost that call every sampler of a model nobody kept.
void pay_generator_debt_of_finished(c10::ArrayRef<std::weak_ptr<OpGraph>> recordings) {
  const std::lock_guard<std::recursive_mutex> lock(resolution_mutex());
  if (!debt() || !debt()->graph.expired()) {
    return;
  }
  const std::weak_ptr<OpGraph>& owner = debt()->graph;
  const auto same = [&](const std::weak_ptr<OpGraph>& recording) {
    return !owner.owner_before(recording) && !recording.owner_before(owner);
  };
  if (std::any_of(recordings.begin(), recordings.end(), same)) {
    pay_generator_debt_now();
  }
}

void run_sampler_on_scratch(const RecordedNode& node, c10::IntArrayRef sizes,
                            c10::IntArrayRef strides, c10::ScalarType dtype,
                            int64_t generator_argument, const at::Generator& generator) {
  const c10::FunctionSchema& schema = node.op.schema();
  RealOnlyGuard real_only;
  c10::AutoGradMode no_grad(false);
  torch::jit::Stack stack;
  size_t next_input = 0;
  for (size_t i = 0; i < node.arguments.size(); ++i) {
    if (schema.arguments()[i].name() == "device" && node.arguments[i].isDevice()) {
      stack.emplace_back(c10::Device(c10::kCPU));
      continue;
    }
    if (static_cast<int64_t>(i) == generator_argument) {
      stack.emplace_back(generator);
      continue;
    }
    stack.push_back(map_tensors(node.arguments[i], [&](const at::Tensor&) {
      const RecordedInput& input = node.inputs[next_input++];
      if (input.kind == RecordedInput::Kind::kValue) {
        return at::empty_strided(sizes, strides, at::TensorOptions().dtype(dtype));
      }
      return input.tensor;  // undefined, real or constant (detail::unresolvable_sampler)
    }));
  }
  node.op.callBoxed(&stack);
}

std::optional<std::string> unresolvable_sampler(const RecordedNode& node) {
  const c10::FunctionSchema& schema = node.op.schema();
  const bool writes_self = writes_first_argument(schema);
  size_t next_input = 0;
  std::optional<std::string> problem;
  for (size_t i = 0; i < node.arguments.size() && !problem; ++i) {
    map_tensors(node.arguments[i], [&](const at::Tensor& t) {
      const RecordedInput& input = node.inputs[next_input++];
      const bool written_self = writes_self && i == 0;
      const bool fake = input.kind == RecordedInput::Kind::kValue ||
                        input.kind == RecordedInput::Kind::kForeignFake;
      if (fake && !(written_self && input.kind == RecordedInput::Kind::kValue)) {
        problem = "how many numbers it draws depends on the values of its fake argument '" +
                  schema.arguments()[i].name() + "'";
      }
      return t;
    });
  }
  return problem;
}

}  // namespace detail
}  // namespace torchdefer
