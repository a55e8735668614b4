#include "torch_rng.h"

#include <torchdefer/boxed_arguments.h>
#include <torchdefer/fake_tensor.h>
#include <torchdefer/mt19937_jump.h>
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
};

thread_local Chain chain;

bool same_engine(const at::mt19937_data_pod& a, const at::mt19937_data_pod& b) {
  return a.seed_ == b.seed_ && a.left_ == b.left_ && a.seeded_ == b.seeded_ && a.next_ == b.next_ &&
         a.state_ == b.state_;
}

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
    return graph.add_rng_anchor(generator.get_state());
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

// Runs `node` for real on CPU tensors shaped like its fakes, drawing from the default generator
// exactly as eager would have. Returns why it cannot, if it cannot.
std::optional<std::string> run_on_scratch(const RecordedNode& node, const at::Tensor& target) {
  const c10::FunctionSchema& schema = node.op.schema();
  const bool writes_self = writes_first_argument(schema);
  RealOnlyGuard real_only;
  c10::AutoGradMode no_grad(false);
  torch::jit::Stack stack;
  size_t next_input = 0;
  std::optional<std::string> problem;
  for (size_t i = 0; i < node.arguments.size(); ++i) {
    const c10::Argument& argument = schema.arguments()[i];
    if (argument.name() == "device" && node.arguments[i].isDevice()) {
      stack.emplace_back(c10::Device(c10::kCPU));
      continue;
    }
    stack.push_back(map_tensors(node.arguments[i], [&](const at::Tensor&) {
      const RecordedInput& input = node.inputs[next_input++];
      switch (input.kind) {
        case RecordedInput::Kind::kUndefined:
          return at::Tensor();
        case RecordedInput::Kind::kReal:
        case RecordedInput::Kind::kConstant:
          return input.tensor;
        case RecordedInput::Kind::kValue:
          if (writes_self && i == 0) {
            return at::empty_strided(target.sizes(), target.strides(),
                                     at::TensorOptions().dtype(target.scalar_type()));
          }
          [[fallthrough]];
        case RecordedInput::Kind::kForeignFake:
          problem = "how many numbers it draws depends on the values of its fake argument '" +
                    argument.name() + "'";
          return at::Tensor();
      }
      return at::Tensor();
    }));
  }
  if (problem) {
    return problem;
  }
  node.op.callBoxed(&stack);
  return std::nullopt;
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
  if (plan.kind == DrawPlan::Kind::kRunOnScratch) {
    settle_generator();
    draws.kind = RecordedDraws::Kind::kAnchorOnly;
    draws.anchor = anchor_here(*graph);
    if (std::optional<std::string> problem = run_on_scratch(node, target)) {
      draws = RecordedDraws{RecordedDraws::Kind::kUnplaceable, -1, 0, 0, *problem};
    }
    chain = Chain{};
    return draws;
  }
  if (chain.graph != graph || chain.anchor < 0 || generator_moved()) {
    if (chain.anchor >= 0 && !generator_moved()) {
      apply_unapplied();
    }
    chain = Chain{};
    chain.graph = graph;
    chain.anchor = anchor_here(*graph);
  }
  draws.kind = RecordedDraws::Kind::kPlaced;
  draws.anchor = chain.anchor;
  draws.offset = chain.offset;
  draws.draws = plan.draws;
  chain.offset += plan.draws;
  chain.unapplied += plan.draws;
  if (!in_recording_scope) {
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
  if (chain.anchor >= 0) {
    apply_unapplied();
  }
  chain = Chain{};
}

}  // namespace torchdefer::detail
