#include "torch_rng.h"

#include "background_jump.h"
#include "deregistrations.h"

#include <torchdefer/boxed_arguments.h>
#include <torchdefer/cuda_draws.h>
#include <torchdefer/fake_tensor.h>
#include <torchdefer/followed_generator.h>
#include <torchdefer/generator_sharing.h>
#include <torchdefer/mt19937_jump.h>
#include <torchdefer/node_stack.h>
#include <torchdefer/op_table.h>
#include <torchdefer/recording.h>
#include <torchdefer/rng_anchors.h>
#include <torchdefer/torch_compat.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/GradMode.h>
#include <c10/util/flat_hash_map.h>

#include <atomic>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string_view>
#include <type_traits>

namespace torchdefer::detail {
namespace {

// The current thread's place on the default CPU generator (Note [Torch-mode draw offsets]).
struct Chain {
  std::shared_ptr<OpGraph> graph;  // holds the anchor
  int64_t anchor = -1;
  uint64_t offset = 0;     // draws placed since the anchor
  uint64_t unapplied = 0;  // of those, not yet applied to the generator
  // The engine as the chain last left it, unless `after_jump` (Note [Noticing a moved generator]);
  // set with the anchor.
  at::mt19937 expected = at::mt19937(0);
  // The chain started while the worker held the generator for this jump, which leaves the
  // generator where `expected` is then (Note [A recording that starts during a jump]).
  std::shared_ptr<const JumpEnd> after_jump;
  // The anchor is lazy or continues from one (Note [Lazy RNG anchors]): the draws cannot be
  // applied until it is resolved, and the chain ends as the owed generator.
  bool lazy = false;
  // The default generator, a CPUGeneratorImpl by construction that lives as long as the process
  // (Note [Reaching the chain]).
  at::CPUGeneratorImpl* generator =
      at::detail::getDefaultCPUGenerator().get<at::CPUGeneratorImpl>();
};

// The default generator is a CPUGeneratorImpl by construction: no reference count taken, no
// device check.
template <typename F>
auto with_default_generator(F&& f) {
  const at::Generator& generator = at::detail::getDefaultCPUGenerator();
  at::CPUGeneratorImpl* impl = generator.get<at::CPUGeneratorImpl>();
  const std::lock_guard<std::mutex> lock(impl->mutex_);
  return f(generator, impl);
}

// Where apply_unapplied() jumps: on this thread, or, when the chain ends anyway, on the worker
// (Note [The jump in the background]).
enum class Apply { kNow, kInBackground };

// Shorter jumps run the recurrence word by word in a few microseconds, less than handing them
// over costs.
constexpr uint64_t kShortestBackgroundJump = uint64_t{1} << 16;

at::mt19937 engine_of(const at::mt19937_data_pod& data) {
  at::mt19937 engine;
  engine.set_data(data);
  return engine;
}

// The engine as the chain last left it; waits for the jump the chain started after, if it has not
// read where that leaves the generator yet.
const at::mt19937& expected_engine(Chain& chain) {
  if (chain.after_jump != nullptr) {
    chain.expected = engine_of(chain.after_jump->engine());
    chain.after_jump.reset();
  }
  return chain.expected;
}

// Applies the chain's unapplied draws, unless someone moved the generator in the meantime (a
// reseed makes them moot, as it would have in eager). In the background, the chain's `expected`
// is not known afterwards: only for a chain that ends.
void apply_unapplied(Chain& chain, Apply how = Apply::kNow) {
  if (chain.unapplied == 0) {
    return;
  }
  if (how == Apply::kInBackground && chain.after_jump != nullptr) {
    // Queued after the jump the chain started from, whatever its length: no wait for that jump.
    jump_default_generator_in_background(chain.after_jump, chain.unapplied);
    chain.unapplied = 0;
    return;
  }
  if (how == Apply::kInBackground && chain.unapplied >= kShortestBackgroundJump) {
    jump_default_generator_in_background(chain.expected.data(), chain.unapplied);
    chain.unapplied = 0;
    return;
  }
  const at::mt19937_data_pod expected = expected_engine(chain).data();
  with_default_generator([&](const at::Generator&, at::CPUGeneratorImpl* impl) {
    at::mt19937 engine = impl->engine();
    if (same_engine(engine.data(), expected)) {
      mt19937_discard(engine, chain.unapplied);
      impl->set_engine(engine);
    }
    chain.expected = impl->engine();
  });
  chain.unapplied = 0;
}

void settle_chain(Chain& chain, Apply how);

// Note [Noticing a moved generator]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Before every random op it places, the chain asks whether anyone moved the default generator since
// it last left it (Note [Torch-mode draw offsets]): C++ code between two random ops that reseeds it
// (torch::manual_seed), sets its state or engine, or draws from it directly; Python's reseeds and
// state reads settle the chain themselves (bindings/torchdefer/_generator_state.py), and an
// unrecorded random op settles it before it draws. The answer must be exact: a move the check
// misses places every later random op of the recording from the wrong state, silently.
//
// Only the whole engine answers exactly. Its seed, position (left_, next_) and a few state words
// would tell every reseed to another seed and every draw count that is not a multiple of 624; but
// 624·k draws regenerate every word and leave the position as it was, and set_state() can set any
// state at all, so only a comparison of all 624 words proves that nothing moved. And the few
// fields would cost no less: LibTorch hands out the engine only by value (CPUGeneratorImpl::
// engine(), one copy of its 2.5 KB) and its fields only through a second such copy
// (mt19937::data()), which costs what comparing the whole engine does. So the chain keeps the
// engine it expects as an at::mt19937 and compares the generator's copy with it bytes against
// bytes: at::mt19937 is trivially copyable, so equal bytes are an equal engine. Bytes can differ
// where the values do not (padding, written anew when someone sets an equal state): then the
// fields decide, and the chain keeps the generator's bytes, so an equal state is never taken for
// a move. Per random op of a Llama-70B construction (callgrind): the copy ~320 instructions, the
// comparison ~360; the field-wise comparison of two data() copies it replaced cost ~1,040.
//
// Nothing that reads less is exact. The generator keeps no count of its changes (c10::
// GeneratorImpl and CPUGeneratorImpl, LibTorch 2.11 and 2.13); what it shows besides the engine is
// its seed (current_seed(), a field of the engine) and its cached normal samples, which
// set_engine() and direct draws leave as they were; and set_engine() can set an engine that
// differs from the one the chain left in one word only. The copy is made holding the generator's
// mutex, as every reader of the engine must (a kernel on another thread may be drawing): ~57
// instructions more per op, which no lock-free read could save without racing that kernel.
static_assert(std::is_trivially_copyable_v<at::mt19937>);

bool same_bytes(const at::mt19937& a, const at::mt19937& b) {
  return std::memcmp(&a, &b, sizeof(at::mt19937)) == 0;
}

// Bytes differ: whether the fields do too; if not, the chain keeps the generator's bytes.
C10_NOINLINE bool moved_unless_same_fields(Chain& chain, const at::mt19937& now) {
  if (!same_engine(now.data(), chain.expected.data())) {
    return true;
  }
  chain.expected = now;
  return false;
}

C10_ALWAYS_INLINE bool generator_moved(Chain& chain) {
  if (C10_UNLIKELY(chain.after_jump != nullptr)) {
    if (chain.after_jump->held()) {
      return false;  // nobody can have moved it: the worker holds it
    }
    expected_engine(chain);
  }
  const std::lock_guard<std::mutex> lock(chain.generator->mutex_);
  const at::mt19937 now = chain.generator->engine();
  return !same_bytes(now, chain.expected) && moved_unless_same_fields(chain, now);
}

// The state where a jump leaves the generator, when first needed.
std::shared_future<at::Tensor> state_after(const std::shared_ptr<const JumpEnd>& jump) {
  return std::async(std::launch::deferred, [jump] { return jump->state(); }).share();
}

int64_t anchor_here(Chain& chain, OpGraph& graph) {
  if (std::shared_ptr<const JumpEnd> jump = held_jump()) {
    chain.after_jump = jump;
    const auto lock = graph.lock();
    return graph.add_rng_anchor(RngAnchor::known_later(state_after(jump)));
  }
  chain.after_jump.reset();
  at::Tensor state =
      with_default_generator([&](const at::Generator& generator, at::CPUGeneratorImpl* impl) {
        chain.expected = impl->engine();
        return generator.get_state();
      });
  const auto lock = graph.lock();
  return graph.add_rng_anchor(RngAnchor::known(std::move(state)));
}

uint64_t per_element(bool two_words) { return two_words ? 2 : 1; }

// Draws of normal_ on n ≥ 16 contiguous elements; none known for float16/bfloat16 under a
// LibTorch whose count was not measured (Note [Draw counts by LibTorch version], torch_compat.h).
std::optional<uint64_t> normal_fill_draws(uint64_t n, c10::ScalarType dtype) {
  const uint64_t tail = n % 16 == 0 ? 0 : 16;
  if (dtype == at::kHalf || dtype == at::kBFloat16) {
    switch (kReducedFloatNormalDraws) {
      case ReducedFloatNormalDraws::kAlignedPrefix:
        return n - n % 16 + tail;
      case ReducedFloatNormalDraws::kAsFloat32:
        return n + tail;
      case ReducedFloatNormalDraws::kUnmeasured:
        return std::nullopt;
    }
  }
  return (n + tail) * per_element(dtype == at::kDouble);
}

// Draws per element of random_/randint over [from, to); no `to` means the full 64-bit range.
uint64_t random_words(std::optional<int64_t> from, std::optional<int64_t> to,
                      c10::ScalarType dtype) {
  if (!from && !to) {
    return per_element(dtype == at::kLong || dtype == at::kDouble);
  }
  if (!to) {
    return 2;
  }
  const uint64_t range = static_cast<uint64_t>(*to) - static_cast<uint64_t>(from.value_or(0));
  // ATen draws 64 bits once the range needs more than 32.
  return per_element(range >= (uint64_t{1} << 32));
}

DrawPlan known(uint64_t draws) { return {DrawPlan::Kind::kKnown, draws}; }
DrawPlan on_scratch(bool with_values = false) {
  return {with_values ? DrawPlan::Kind::kRunOnScratchWithValues : DrawPlan::Kind::kRunOnScratch, 0};
}

// The dtype of the tensor argument named `name` of `node`, if it has a defined one.
std::optional<c10::ScalarType> tensor_argument_dtype(const OpGraph& graph, const RecordedNode& node,
                                                     std::string_view name) {
  std::optional<c10::ScalarType> dtype;
  for_each_input(node, [&](size_t argument, size_t, const RecordedInput& input) {
    if (node.op.schema().arguments()[argument].name() != name) {
      return;
    }
    if (input.kind == RecordedInput::Kind::kValue) {
      dtype = graph.values()[input.value].dtype;
    } else if (input.tensor.defined()) {
      dtype = input.tensor.scalar_type();
    }
  });
  return dtype;
}

// What plan_draws() reads of a random operator on every call (Note [Knowing a random operator]).
struct RandomOperator {
  DrawRule rule = DrawRule::kOnScratch;  // its op table DrawRule; kOnScratch if the table has none
  bool from_to = false;                  // kRandom: its bounds are `from`/`to`, not `low`/`high`
  int32_t generator = -1;                // the index of its Generator argument, or -1
};

// Note [Knowing a random operator]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A random operator's facts are found once per operator and thread, keyed by the address of its
// schema and forgotten when an operator was deregistered since (Note [Operators known by their
// schema's address], deregistrations.h): a call costs a comparison with the last operator asked
// about (a model's random ops are mostly one uniform_) and one atomic load, or else a hash lookup.
// The last operator sits in a trivially constructible thread_local (Note [Reaching the chain]);
// the table behind it only on the path that misses it.
RandomOperator describe_random_operator(const c10::FunctionSchema& schema) {
  RandomOperator op;
  const OpInfo* info = find_op_info(schema.operator_name());
  if (info != nullptr && info->draws) {
    op.rule = *info->draws;
  }
  op.from_to = schema.name() == "aten::random_";
  // By type, not by name: a custom op's may be called anything (Note [A generator recording
  // cannot follow], recording.cpp, refuses a call whose generators this one index misses).
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    if (generator_argument_kind(schema.arguments()[i]) == GeneratorArgument::kOne) {
      op.generator = static_cast<int32_t>(i);
      break;
    }
  }
  return op;
}

struct LastRandomOperator {
  const c10::FunctionSchema* schema = nullptr;
  uint64_t deregistrations = 0;
  RandomOperator facts;
};

// Note [Reaching the chain]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Every random op recorded reads the facts of the last random operator, the thread's chain and
// the default generator. A thread_local with a constructor or a destructor (the Chain, the table
// of operators) is reached through a call that checks its initialization on every access, and
// every thread_local of a shared library through a call to __tls_get_addr: so a random op reaches
// one thread_local that is initialized at compile time and never destroyed, which holds the last
// operator and a pointer to the Chain (made when the thread first asks), and the Chain keeps the
// default generator's implementation, whose address never changes (no reference count taken, no
// guard of a function-local static read).
struct ThreadRng {
  LastRandomOperator last_operator;
  Chain* chain = nullptr;
};
static_assert(std::is_trivially_destructible_v<ThreadRng>);

thread_local ThreadRng this_thread_rng;

C10_NOINLINE Chain& make_chain(ThreadRng& rng) {
  thread_local Chain chain;
  rng.chain = &chain;
  return chain;
}

Chain& chain_of(ThreadRng& rng) {
  return C10_LIKELY(rng.chain != nullptr) ? *rng.chain : make_chain(rng);
}

Chain& this_thread_chain() { return chain_of(this_thread_rng); }

C10_NOINLINE RandomOperator remember_random_operator(ThreadRng& rng,
                                                     const c10::FunctionSchema& schema,
                                                     uint64_t deregistrations) {
  thread_local ska::flat_hash_map<const c10::FunctionSchema*, RandomOperator> operators;
  thread_local uint64_t operators_deregistrations = 0;
  if (operators_deregistrations != deregistrations) {
    operators.clear();
    operators_deregistrations = deregistrations;
  }
  auto found = operators.find(&schema);
  if (found == operators.end()) {
    found = operators.emplace(&schema, describe_random_operator(schema)).first;
  }
  rng.last_operator = {&schema, deregistrations, found->second};
  return found->second;
}

// By value: the op may run on scratch, and record random ops of its own, while its caller uses it.
RandomOperator random_operator(ThreadRng& rng, const c10::FunctionSchema& schema) {
  const uint64_t deregistrations = deregistrations_so_far();
  const LastRandomOperator& last = rng.last_operator;
  if (C10_LIKELY(last.schema == &schema && last.deregistrations == deregistrations)) {
    return last.facts;
  }
  return remember_random_operator(rng, schema, deregistrations);
}

// The plans that read the op's arguments: `n` reals of `dtype` to fill.
C10_NOINLINE DrawPlan plan_from_arguments(const RandomOperator& op, const OpGraph& graph,
                                          const RecordedNode& node, uint64_t n,
                                          c10::ScalarType dtype) {
  if (op.rule == DrawRule::kRandom) {
    const c10::FunctionSchema& schema = node.op.schema();
    const auto high = int_argument(schema, node.arguments, op.from_to ? "to" : "high");
    if (!op.from_to && !high) {
      return on_scratch(/*with_values=*/true);  // its bounds are tensors
    }
    const auto low = int_argument(schema, node.arguments, op.from_to ? "from" : "low");
    return known(n * random_words(low, high, dtype));
  }
  TORCH_INTERNAL_ASSERT(op.rule == DrawRule::kBernoulliTensor);
  // The probabilities are `p`, or `self` for bernoulli(self).
  const std::optional<c10::ScalarType> p = tensor_argument_dtype(graph, node, "p");
  const c10::ScalarType probabilities =
      p.value_or(tensor_argument_dtype(graph, node, "self").value_or(dtype));
  return known(n * per_element(probabilities == at::kDouble));
}

// Inlined where a random op is placed (Note [Reaching the chain]).
C10_ALWAYS_INLINE DrawPlan plan_draws(const RandomOperator& op, const OpGraph& graph,
                                      const RecordedNode& node, const at::Tensor& target) {
  // ATen fills a complex tensor through its real view (view_as_real): two reals per element, drawn
  // as the real dtype draws. Counting elements instead left the generator short of eager's after a
  // complex randn of 16 or more elements, and every later draw differed (found by the fuzzer).
  const c10::ScalarType scalar_type = target.scalar_type();
  const bool complex = c10::isComplexType(scalar_type);
  const uint64_t n = static_cast<uint64_t>(target.numel()) * (complex ? 2 : 1);
  const c10::ScalarType dtype = complex ? c10::toRealValueType(scalar_type) : scalar_type;
  switch (op.rule) {
    case DrawRule::kOnScratch:
      return on_scratch();
    case DrawRule::kOnScratchWithValues:
      return on_scratch(/*with_values=*/true);
    case DrawRule::kValueDependent:
      return {DrawPlan::Kind::kValueDependent, 0};
    case DrawRule::kUniform:
      return known(n * per_element(dtype == at::kDouble));
    case DrawRule::kNormal:
      if (n >= 16 && target.is_contiguous()) {
        if (const std::optional<uint64_t> draws = normal_fill_draws(n, dtype)) {
          return known(*draws);
        }
      }
      return on_scratch();
    case DrawRule::kTwoPerElement:
      return known(2 * n);
    case DrawRule::kRandom:
    case DrawRule::kBernoulliTensor:
      return plan_from_arguments(op, graph, node, n, dtype);
  }
  return on_scratch();
}

}  // namespace

DrawPlan plan_draws(const OpGraph& graph, const RecordedNode& node, const at::Tensor& target) {
  return plan_draws(random_operator(this_thread_rng, node.op.schema()), graph, node, target);
}

namespace {

// A CPU tensor shaped like fake `t`: filled with ones (valid probabilities, rates and standard
// deviations), or with its values when the op's draws depend on them.
at::Tensor scratch_like(const at::Tensor& t, bool with_values) {
  if (with_values) {
    return read_values(t);
  }
  RealOnlyGuard real_only;
  return at::empty_strided(t.sizes(), t.strides(), at::TensorOptions().dtype(t.scalar_type()))
      .fill_(1);
}

// Runs `node` for real on CPU scratch tensors standing in for its fakes (`tensors` are the
// tensors it was called with, in input order), drawing from the default generator exactly as
// eager would have.
void run_on_scratch(const RecordedNode& node, c10::ArrayRef<at::Tensor> tensors, bool with_values) {
  std::vector<at::Tensor> scratch(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    scratch[i] = tensors[i].defined() && is_fake(tensors[i]) ? scratch_like(tensors[i], with_values)
                                                             : tensors[i];
  }
  RealOnlyGuard real_only;
  c10::AutoGradMode no_grad(false);
  torch::jit::Stack stack = node_stack(
      node, [&](size_t position, const RecordedInput&) { return scratch[position]; },
      c10::Device(c10::kCPU));
  node.op.callBoxed(&stack);
}

// Starts the chain on `graph`: from the owed generator if there is one (Note [The generator after
// deferred_init]), else from the generator's state now.
void start_chain(Chain& chain, const std::shared_ptr<OpGraph>& graph) {
  chain = Chain{};
  chain.graph = graph;
  std::optional<GeneratorDebt> owed = take_generator_debt();
  if (!owed) {
    chain.anchor = anchor_here(chain, *graph);
    return;
  }
  chain.lazy = true;
  chain.expected = engine_of(owed->expected);
  if (owed->graph.lock() == graph) {
    chain.anchor = owed->graph_anchor;
    chain.offset = owed->offset;
    return;
  }
  const auto lock = graph->lock();
  chain.anchor =
      graph->add_rng_anchor(RngAnchor::after(owed->anchor, owed->offset, std::nullopt, {}));
}

C10_NOINLINE void restart_chain(Chain& chain, const std::shared_ptr<OpGraph>& graph) {
  settle_chain(chain, Apply::kNow);
  start_chain(chain, graph);
}

C10_ALWAYS_INLINE void continue_chain(Chain& chain, const std::shared_ptr<OpGraph>& graph) {
  if (C10_LIKELY(chain.graph == graph && chain.anchor >= 0 && !generator_moved(chain))) {
    return;
  }
  restart_chain(chain, graph);
}

// Places an op of `count` draws at the chain's end.
RecordedDraws placed(Chain& chain, uint64_t count) {
  RecordedDraws draws;
  draws.kind = RecordedDraws::Kind::kPlaced;
  draws.anchor = chain.anchor;
  draws.offset = chain.offset;
  draws.draws = count;
  chain.offset += count;
  chain.unapplied += count;
  return draws;
}

// A value-dependent sampler: placed on the chain, which continues from the lazy anchor after it.
RecordedDraws place_sampler(Chain& chain, const std::shared_ptr<OpGraph>& graph,
                            const RecordedNode& node, const at::Tensor& target) {
  RecordedDraws draws;
  draws.kind = RecordedDraws::Kind::kAnchorOnly;
  draws.anchor = chain.anchor;
  draws.offset = chain.offset;
  {
    const auto lock = graph->lock();
    draws.end_anchor = graph->add_rng_anchor(
        RngAnchor::after(graph->rng_anchor(chain.anchor), chain.offset, node, target));
  }
  chain.anchor = draws.end_anchor;
  chain.offset = 0;
  chain.unapplied = 0;  // part of the lazy anchor's start now
  chain.lazy = true;
  return draws;
}

// A kernel whose draws only its run can count, or a value-dependent sampler that reads fakes other
// than the tensor it fills: runs it on scratch now (from its inputs' values when `with_values`),
// with the generator where eager has it, so that the chain after it is known. A chain that
// continues from a lazy anchor is resolved and paid first (Note [Lazy RNG anchors]).
RecordedDraws run_on_scratch_now(Chain& chain, const std::shared_ptr<OpGraph>& graph,
                                 const RecordedNode& node, c10::ArrayRef<at::Tensor> tensors,
                                 bool with_values) {
  if (chain.lazy) {
    settle_generator_exactly();
  } else {
    settle_chain(chain, Apply::kNow);
  }
  RecordedDraws draws;
  draws.kind = RecordedDraws::Kind::kAnchorOnly;
  draws.anchor = anchor_here(chain, *graph);
  chain = Chain{};
  try {
    run_on_scratch(node, tensors, with_values);
  } catch (c10::Error& e) {
    e.add_context(c10::str(
        "torchdefer: ", node.op.schema().operator_name(), " in deferred_init of ", graph->context(),
        " was run at record time to keep the default generator where eager "
        "construction leaves it",
        with_values ? ", which needs the values of its fake arguments: compute it while "
                      "deferred_init runs, from fakes of that recording or real "
                      "tensors, or after materializing its inputs"
                    : ""));
    throw;
  }
  return draws;
}

// Whether `node` (of operator `op`) was given a `generator=` argument, the default one included.
bool given_generator(const RandomOperator& op, const RecordedNode& node) {
  return op.generator >= 0 && static_cast<size_t>(op.generator) < node.arguments.size() &&
         node.arguments[op.generator].isGenerator();
}

// The position of `node`'s `generator=` argument (of operator `op`) when it is given one other
// than the default CPU generator: `generator=torch.default_generator` draws as no argument does,
// so the op joins the chain (its own anchor would miss the chain's draws not yet applied).
std::optional<size_t> explicit_generator_argument(const RandomOperator& op,
                                                  const RecordedNode& node) {
  if (!given_generator(op, node)) {
    return std::nullopt;
  }
  const at::Generator generator = node.arguments[op.generator].toGenerator();
  if (generator.unsafeGetGeneratorImpl() ==
      at::detail::getDefaultCPUGenerator().unsafeGetGeneratorImpl()) {
    return std::nullopt;
  }
  return static_cast<size_t>(op.generator);
}

void run_on_scratch_for_own_generator(const std::shared_ptr<OpGraph>& graph,
                                      const RecordedNode& node, const DrawPlan& plan,
                                      c10::ArrayRef<at::Tensor> tensors) {
  // A sampler that overwrites the tensor it fills (trunc_normal_) needs only its geometry.
  const bool with_values =
      plan.kind == DrawPlan::Kind::kRunOnScratchWithValues ||
      (plan.kind == DrawPlan::Kind::kValueDependent && unresolvable_sampler(node).has_value());
  try {
    run_on_scratch(node, tensors, with_values);
  } catch (c10::Error& e) {
    e.add_context(c10::str(
        "torchdefer: ", node.op.schema().operator_name(), " in deferred_init of ", graph->context(),
        " was run at record time to move its explicit generator as eager construction does",
        with_values ? ", which needs the values of its fake arguments: compute it while "
                      "deferred_init runs, from fakes of that recording or real tensors, or "
                      "after materializing its inputs"
                    : ""));
    throw;
  }
}

// Note [Followed generators]: the op is placed at the generator's followed position, or at its
// state now; counted draws move the position, a sampler that can be resolved from its recorded
// arguments leaves the generator owing it, and anything else runs on scratch now, from the
// generator paid first.
RecordedDraws place_on_followed_generator(const std::shared_ptr<OpGraph>& graph,
                                          const RecordedNode& node, const at::Tensor& target,
                                          size_t argument, const DrawPlan& plan,
                                          c10::ArrayRef<at::Tensor> tensors,
                                          at::Generator& generator, FollowedGenerator& followed) {
  RecordedDraws draws;
  draws.generator_argument = static_cast<int64_t>(argument);
  std::unique_lock<std::mutex> lock(generator.mutex());
  FollowedGenerator::Position start;
  const std::optional<FollowedGenerator::Position> position = followed.followed();
  if (position) {
    start = *position;
  } else {
    start.anchor = RngAnchor::known(at::Tensor::wrap_tensor_impl(
        followed.at::CPUGeneratorImpl::get_state()));  // not followed: nothing owed to pay
  }
  {
    const auto graph_lock = graph->lock();
    draws.anchor = graph->add_rng_anchor(start.anchor);
  }
  draws.offset = start.offset;
  if (plan.kind == DrawPlan::Kind::kKnown) {
    draws.kind = RecordedDraws::Kind::kPlaced;
    draws.draws = plan.draws;
    followed.advance(plan.draws);
    return draws;
  }
  draws.kind = RecordedDraws::Kind::kAnchorOnly;
  // A shape-only scratch kernel on a followed position follows it too, so that whether something
  // read the generator before it (paying it) does not decide where the chain goes on from.
  const bool lazy = (plan.kind == DrawPlan::Kind::kValueDependent ||
                     (plan.kind == DrawPlan::Kind::kRunOnScratch && position)) &&
                    !unresolvable_sampler(node);
  if (lazy) {
    std::shared_ptr<RngAnchor> end =
        RngAnchor::after(start.anchor, start.offset, node, target, draws.generator_argument);
    {
      const auto graph_lock = graph->lock();
      draws.end_anchor = graph->add_rng_anchor(end);
    }
    const bool exact = graph->exact_generator();
    if (exact) {
      end->state();  // resolved before the generator owes it: a sampler that fails owes nothing
    }
    followed.owe(std::move(end));
    if (exact) {
      followed.pay();
    }
    return draws;
  }
  followed.pay();
  lock.unlock();  // the kernel locks the generator itself
  run_on_scratch_for_own_generator(graph, node, plan, tensors);
  return draws;
}

// Note [Explicit generators]: the op is placed at offset 0 from its generator's state now, and
// the generator is moved as the eager kernel moves it.
RecordedDraws place_on_own_generator(const std::shared_ptr<OpGraph>& graph,
                                     const RecordedNode& node, const at::Tensor& target,
                                     size_t argument, const DrawPlan& plan,
                                     c10::ArrayRef<at::Tensor> tensors) {
  at::Generator generator = node.arguments[argument].toGenerator();
  TORCH_CHECK(generator.device().is_cpu(), "torchdefer: ", node.op.schema().operator_name(),
              " in deferred_init of ", graph->context(), " draws from an explicit ",
              generator.device(),
              " generator, whose state recording cannot leave where eager construction leaves it "
              "(only explicit CPU generators are followed). Draw from a CPU torch.Generator or "
              "from the default generator, or run this op after materializing.");
  TORCH_CHECK(target.device().is_cpu(), "torchdefer: ", node.op.schema().operator_name(),
              " in deferred_init of ", graph->context(), " fills ", describe(target),
              " from a CPU generator, which eager refuses (\"Expected a '", target.device().type(),
              "' device type for generator\"). Draw CPU tensors from a CPU torch.Generator, or "
              "move the tensor to its device after drawing.");
  if (FollowedGenerator* followed = followed_generator(generator); followed != nullptr) {
    return place_on_followed_generator(graph, node, target, argument, plan, tensors, generator,
                                       *followed);
  }
  RecordedDraws draws;
  draws.generator_argument = static_cast<int64_t>(argument);
  {
    const std::lock_guard<std::mutex> lock(generator.mutex());
    at::Tensor state = generator.get_state();
    const auto graph_lock = graph->lock();
    draws.anchor = graph->add_rng_anchor(RngAnchor::known(std::move(state)));
  }
  if (plan.kind == DrawPlan::Kind::kKnown) {
    draws.kind = RecordedDraws::Kind::kPlaced;
    draws.draws = plan.draws;
    const std::lock_guard<std::mutex> lock(generator.mutex());
    discard_draws(*at::check_generator<at::CPUGeneratorImpl>(generator), plan.draws);
    return draws;
  }
  draws.kind = RecordedDraws::Kind::kAnchorOnly;
  run_on_scratch_for_own_generator(graph, node, plan, tensors);
  return draws;
}

// A value-dependent sampler recorded after the deferred_init of an exact_generator recording
// returned: it is resolved at once, as exact_generator resolves those recorded inside the call
// (Note [The generator after deferred_init]); if that fails, the generator stays owed, as there.
void settle_exactly_after_return(const OpGraph& graph) {
  try {
    settle_generator_exactly();
  } catch (const c10::Error& e) {
    TORCH_WARN("torchdefer: exact_generator: could not resolve a random op recorded on a fake of ",
               graph.context(), " after its deferred_init returned: ", e.what_without_backtrace());
  }
}

// A random op recorded after its recording's deferred_init returned leaves the generator where
// eager does, or owed (Note [The generator after deferred_init]).
C10_NOINLINE void settle_after_return(Chain& chain, const OpGraph& graph) {
  if (chain.lazy && graph.exact_generator()) {
    settle_exactly_after_return(graph);
  } else if (chain.lazy) {
    settle_generator();  // the owed generator is what a materialization pays
  } else {
    apply_unapplied(chain);
  }
}

// Every random op but the common one (Note [Placing the common random op]).
C10_NOINLINE RecordedDraws place_random_node_otherwise(
    const RandomOperator& op, const DrawPlan& plan, const std::shared_ptr<OpGraph>& graph,
    const RecordedNode& node, const at::Tensor& target, c10::ArrayRef<at::Tensor> tensors,
    bool in_recording_scope) {
  // Note [Replays that lend themselves the default generator]: a random op recorded on a returned
  // model's fakes is placed from the generator as a recording's are.
  std::optional<RandomOpAfterReturnMark> after_return;
  if (!in_recording_scope) {
    after_return.emplace(node.op.schema().name());
  }
  if (const std::optional<size_t> argument = explicit_generator_argument(op, node)) {
    return place_on_own_generator(graph, node, target, *argument, plan, tensors);
  }
  Chain& chain = this_thread_chain();
  continue_chain(chain, graph);
  RecordedDraws draws;
  if (plan.kind == DrawPlan::Kind::kKnown) {
    draws = placed(chain, plan.draws);
  } else {
    // A value-dependent sampler is placed lazily when it reads no fake but the tensor it fills; so
    // is a shape-only scratch kernel after a lazy anchor, where the generator is not where eager
    // has it anyway. The rest run on scratch now.
    const bool lazy = (plan.kind == DrawPlan::Kind::kValueDependent ||
                       (plan.kind == DrawPlan::Kind::kRunOnScratch && chain.lazy)) &&
                      !unresolvable_sampler(node);
    if (!lazy) {
      return run_on_scratch_now(chain, graph, node, tensors,
                                /*with_values=*/plan.kind != DrawPlan::Kind::kRunOnScratch);
    }
    draws = place_sampler(chain, graph, node, target);
  }
  if (!in_recording_scope) {
    settle_after_return(chain, *graph);
  }
  return draws;
}

}  // namespace

// Note [Placing the common random op]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A model's random ops are almost all one kind: counted draws (DrawPlan::Kind::kKnown) on the
// default generator, recorded inside deferred_init (Llama-70B's 1,124 are uniform_ fills). Those
// take one inlined path: the operator's facts, the plan, the chain's check and the placement,
// with no shared_ptr copied and no thread_local initialization checked (Note [Reaching the
// chain]). Every other random op (a `generator=` argument, the default one included, a plan that
// runs on scratch or anchors lazily, a recording whose deferred_init returned) takes
// place_random_node_otherwise(), out of line.
RecordedDraws place_random_node(const std::shared_ptr<OpGraph>& graph, const RecordedNode& node,
                                const at::Tensor& target, const c10::ArrayRef<at::Tensor>& tensors,
                                bool in_recording_scope) {
  ThreadRng& rng = this_thread_rng;
  const RandomOperator op = random_operator(rng, node.op.schema());
  if (C10_UNLIKELY(graph->cuda_generator() && target.defined() && target.device().is_cuda()) &&
      !explicit_generator_argument(op, node)) {
    // Note [Torch-mode draws on CUDA]
    return place_on_cuda_generator(*graph, node, target, tensors, in_recording_scope);
  }
  const DrawPlan plan = plan_draws(op, *graph, node, target);
  if (C10_UNLIKELY(plan.kind != DrawPlan::Kind::kKnown || !in_recording_scope ||
                   given_generator(op, node))) {
    return place_random_node_otherwise(op, plan, graph, node, target, tensors, in_recording_scope);
  }
  Chain& chain = chain_of(rng);
  continue_chain(chain, graph);
  return placed(chain, plan.draws);
}

std::shared_future<uint64_t> default_generator_digest() {
  if (std::shared_ptr<const JumpEnd> jump = held_jump()) {
    return std::async(std::launch::deferred,
                      [jump] { return digest_generator_state(jump->state()); })
        .share();
  }
  // The state now, digested when a counter-mode replay first asks: a torch-mode recording never
  // does, and the digest (a multiply per byte of 5 KB, ~71,000 instructions) cost as much as the
  // rest of what deferred_init adds around a Llama-70B's constructor (callgrind).
  at::Tensor state = with_default_generator(
      [](const at::Generator& generator, at::CPUGeneratorImpl*) { return generator.get_state(); });
  return std::async(std::launch::deferred,
                    [state = std::move(state)] { return digest_generator_state(state); })
      .share();
}

namespace {

// Applies the chain's draws (`how`), or leaves the generator owed when they follow a lazy anchor,
// and forgets the chain.
void settle_chain(Chain& chain, Apply how) {
  if (chain.anchor < 0) {
    chain = Chain{};
    return;
  }
  if (chain.lazy) {
    std::shared_ptr<RngAnchor> anchor;
    {
      const auto lock = chain.graph->lock();
      anchor = chain.graph->rng_anchor(chain.anchor);
    }
    set_generator_debt(GeneratorDebt{anchor, chain.offset, expected_engine(chain).data(),
                                     chain.graph->context(), anchor->pending_samplers(),
                                     chain.graph, chain.anchor});
  } else {
    apply_unapplied(chain, how);
  }
  chain = Chain{};
}

}  // namespace

void settle_generator() { settle_chain(this_thread_chain(), Apply::kInBackground); }

void settle_generator_exactly() {
  settle_chain(this_thread_chain(), Apply::kNow);
  pay_generator_debt_now();
}

}  // namespace torchdefer::detail
