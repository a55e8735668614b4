#include "torch_rng.h"

#include <torchdefer/boxed_arguments.h>
#include <torchdefer/fake_tensor.h>
#include <torchdefer/mt19937_jump.h>
#include <torchdefer/rng_anchors.h>
#include <torchdefer/torch_compat.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/enum_tag.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/GradMode.h>

#include <cstring>
#include <mutex>
#include <string_view>

namespace torchdefer::detail {
namespace {

// The current thread's place on the default CPU generator (Note [Torch-mode draw offsets]).
struct Chain {
  std::shared_ptr<OpGraph> graph;  // holds the anchor
  int64_t anchor = -1;
  uint64_t offset = 0;              // draws placed since the anchor
  uint64_t unapplied = 0;           // of those, not yet applied to the generator
  at::mt19937_data_pod expected{};  // the engine as the chain last left it
  // The anchor is lazy or continues from one (Note [Lazy RNG anchors]): the draws cannot be
  // applied until it is resolved, and the chain ends as the owed generator.
  bool lazy = false;
};

thread_local Chain chain;

template <typename F>
auto with_default_generator(F&& f) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(generator.mutex());
  return f(generator, at::check_generator<at::CPUGeneratorImpl>(generator));
}

// Applies the chain's unapplied draws, unless someone moved the generator in the meantime (a
// reseed makes them moot, as it would have in eager).
void apply_unapplied() {
  if (chain.unapplied == 0) {
    return;
  }
  with_default_generator([](at::Generator&, at::CPUGeneratorImpl* impl) {
    at::mt19937 engine = impl->engine();
    if (same_engine(engine.data(), chain.expected)) {
      mt19937_discard(engine, chain.unapplied);
      impl->set_engine(engine);
    }
    chain.expected = impl->engine().data();
  });
  chain.unapplied = 0;
}

bool generator_moved() {
  return with_default_generator([](at::Generator&, at::CPUGeneratorImpl* impl) {
    return !same_engine(impl->engine().data(), chain.expected);
  });
}

int64_t anchor_here(OpGraph& graph) {
  return with_default_generator([&](at::Generator& generator, at::CPUGeneratorImpl* impl) {
    chain.expected = impl->engine().data();
    return graph.add_rng_anchor(RngAnchor::known(generator.get_state()));
  });
}

uint64_t per_element(bool two_words) { return two_words ? 2 : 1; }

uint64_t normal_fill_draws(uint64_t n, c10::ScalarType dtype) {
  const uint64_t tail = n % 16 == 0 ? 0 : 16;
  if (dtype == at::kHalf || dtype == at::kBFloat16) {
    return n - n % 16 + tail;
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

DrawPlan known(uint64_t draws) { return {DrawPlan::Kind::kKnown, draws, {}}; }
DrawPlan on_scratch() { return {DrawPlan::Kind::kRunOnScratch, 0, {}}; }

bool is_rejection_sampler(std::string_view name) {
  return name == "torchdefer::trunc_normal_" || name == "aten::poisson" ||
         name == "aten::_standard_gamma" || name == "aten::binomial" ||
         name == "aten::_sample_dirichlet";
}

}  // namespace

bool is_random(const c10::OperatorHandle& op) {
  return op.hasTag(at::Tag::nondeterministic_seeded);
}

DrawPlan plan_draws(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& arguments,
                    const at::Tensor& target) {
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    if (schema.arguments()[i].name() == "generator" && !arguments[i].isNone()) {
      return {DrawPlan::Kind::kUnplaceable, 0,
              "it draws from an explicit generator; torch RNG mode replays the default one"};
    }
  }
  const std::string& name = schema.name();
  if (is_rejection_sampler(name)) {
    return {DrawPlan::Kind::kValueDependent, 0, {}};
  }
  const uint64_t n = static_cast<uint64_t>(target.numel());
  const c10::ScalarType dtype = target.scalar_type();
  if (name == "aten::uniform_" || name == "aten::rand" || name == "aten::rand_like") {
    return known(n * per_element(dtype == at::kDouble));
  }
  if (name == "aten::normal_" || name == "aten::normal" || name == "aten::randn" ||
      name == "aten::randn_like") {
    if (n >= 16 && target.is_contiguous()) {
      return known(normal_fill_draws(n, dtype));
    }
    return on_scratch();
  }
  if (name == "aten::random_") {
    const auto from = int_argument(schema, arguments, "from");
    const auto to = int_argument(schema, arguments, "to");
    return known(n * random_words(from, to, dtype));
  }
  if (name == "aten::randint" || name == "aten::randint_like") {
    const auto high = int_argument(schema, arguments, "high");
    if (!high) {
      return {DrawPlan::Kind::kUnplaceable, 0, "its bounds are tensors"};
    }
    return known(n * random_words(int_argument(schema, arguments, "low"), high, dtype));
  }
  if (name == "aten::cauchy_" || name == "aten::geometric_") {
    return known(2 * n);
  }
  return on_scratch();
}

namespace {

// Starts the chain on `graph`: from the owed generator if there is one (Note [The generator after
// deferred_init]), else from the generator's state now.
void start_chain(const std::shared_ptr<OpGraph>& graph) {
  chain = Chain{};
  chain.graph = graph;
  std::optional<GeneratorDebt> owed = take_generator_debt();
  if (!owed) {
    chain.anchor = anchor_here(*graph);
    return;
  }
  chain.lazy = true;
  chain.expected = owed->expected;
  if (owed->graph.lock() == graph) {
    chain.anchor = owed->graph_anchor;
    chain.offset = owed->offset;
    return;
  }
  chain.anchor =
      graph->add_rng_anchor(RngAnchor::after(owed->anchor, owed->offset, std::nullopt, {}));
}

void continue_chain(const std::shared_ptr<OpGraph>& graph) {
  if (chain.graph == graph && chain.anchor >= 0 && !generator_moved()) {
    return;
  }
  settle_generator();
  start_chain(graph);
}

// Places an op of `count` draws at the chain's end.
void place_counted(uint64_t count, RecordedDraws& draws) {
  draws.kind = RecordedDraws::Kind::kPlaced;
  draws.anchor = chain.anchor;
  draws.offset = chain.offset;
  draws.draws = count;
  chain.offset += count;
  chain.unapplied += count;
}

// A value-dependent sampler: placed on the chain, which continues from the lazy anchor after it.
RecordedDraws place_sampler(const std::shared_ptr<OpGraph>& graph, const RecordedNode& node,
                            const at::Tensor& target) {
  RecordedDraws draws;
  draws.kind = RecordedDraws::Kind::kAnchorOnly;
  draws.anchor = chain.anchor;
  draws.offset = chain.offset;
  draws.end_anchor = graph->add_rng_anchor(
      RngAnchor::after(graph->rng_anchor(chain.anchor), chain.offset, node, target));
  chain.anchor = draws.end_anchor;
  chain.offset = 0;
  chain.unapplied = 0;  // part of the lazy anchor's start now
  chain.lazy = true;
  return draws;
}

// A kernel whose draws only its run can count, while the generator is where eager has it: runs
// it on scratch now, so that the chain after it is known.
RecordedDraws run_on_scratch_now(const std::shared_ptr<OpGraph>& graph, const RecordedNode& node,
                                 const at::Tensor& target) {
  settle_generator();
  RecordedDraws draws;
  draws.kind = RecordedDraws::Kind::kAnchorOnly;
  draws.anchor = anchor_here(*graph);
  run_sampler_on_scratch(node, target.sizes(), target.strides(), target.scalar_type());
  chain = Chain{};
  return draws;
}

}  // namespace

RecordedDraws place_random_node(const std::shared_ptr<OpGraph>& graph, const RecordedNode& node,
                                const at::Tensor& target, bool in_recording_scope) {
  const DrawPlan plan = plan_draws(node.op.schema(), node.arguments, target);
  RecordedDraws draws;
  if (plan.kind == DrawPlan::Kind::kUnplaceable) {
    draws.kind = RecordedDraws::Kind::kUnplaceable;
    draws.reason = plan.reason;
    return draws;
  }
  if (plan.kind == DrawPlan::Kind::kKnown) {
    continue_chain(graph);
    place_counted(plan.draws, draws);
  } else if (std::optional<std::string> problem = unresolvable_sampler(node)) {
    draws.kind = RecordedDraws::Kind::kUnplaceable;
    draws.reason = *problem;
    return draws;
  } else {
    continue_chain(graph);
    if (plan.kind == DrawPlan::Kind::kRunOnScratch && !chain.lazy) {
      return run_on_scratch_now(graph, node, target);
    }
    draws = place_sampler(graph, node, target);
  }
  if (!in_recording_scope && chain.lazy) {
    settle_generator();  // the owed generator is what a materialization pays
  } else if (!in_recording_scope) {
    apply_unapplied();
  }
  return draws;
}

uint64_t default_generator_digest() {
  const at::Tensor state = with_default_generator(
      [](at::Generator& generator, at::CPUGeneratorImpl*) { return generator.get_state(); });
  const auto* bytes = state.data_ptr<uint8_t>();
  uint64_t hash = 0xcbf29ce484222325ull;
  for (int64_t i = 0; i < state.numel(); ++i) {
    hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  }
  return hash;
}

void settle_generator() {
  if (chain.anchor < 0) {
    chain = Chain{};
    return;
  }
  if (chain.lazy) {
    const std::shared_ptr<RngAnchor>& anchor = chain.graph->rng_anchor(chain.anchor);
    set_generator_debt(GeneratorDebt{anchor, chain.offset, chain.expected, chain.graph->context(),
                                     anchor->pending_samplers(), chain.graph, chain.anchor});
  } else {
    apply_unapplied();
  }
  chain = Chain{};
}

void settle_generator_exactly() {
  settle_generator();
  pay_generator_debt_now();
}

}  // namespace torchdefer::detail
