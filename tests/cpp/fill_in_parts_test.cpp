// Note [Torch-mode fills in parts]: a random fill cut into parts, each drawn from a generator
// copy jumped to its first draw, has the whole fill's bits and leaves the generator where the
// whole fill does; fills whose draw order is not a per-position sequence run whole.
#include <torchdefer/torchdefer.h>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "bench/models/llama.h"
#include "replay/src/fill_in_parts.h"
#include "tests/cpp/test_util.h"

#include <string>
#include <vector>

namespace torchdefer {
namespace {

using testing::bitwise_equal;

const c10::OperatorHandle& uniform_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::uniform_", "");
  return op;
}

const c10::OperatorHandle& normal_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::normal_", "");
  return op;
}

at::Tensor generator_state() { return at::detail::getDefaultCPUGenerator().get_state(); }

// The draws ATen's kernels take (Note [Torch-mode draw offsets]), per op and dtype.
uint64_t draws_of(const c10::OperatorHandle& op, int64_t n, c10::ScalarType dtype) {
  const uint64_t words = dtype == at::kDouble ? 2 : 1;
  const int64_t tail = &op == &normal_op() && n % 16 != 0 ? 16 : 0;
  return static_cast<uint64_t>(n + tail) * words;
}

struct Outcome {
  at::Tensor storage;  // the whole buffer, so that writes outside the view would show
  at::Tensor generator;
  bool in_parts = false;
};

// Fills `n` elements at `offset` in a buffer of `n + offset + 3`, from seed 29, whole or through
// run_fill_in_parts with at most `parts` parts of at least 16 elements.
Outcome fill(const c10::OperatorHandle& op, c10::ScalarType dtype, int64_t n, int64_t offset,
             int64_t parts, std::optional<uint64_t> draws = std::nullopt) {
  torch::manual_seed(29);
  torch::rand({5});  // start inside a block of the generator's state
  const at::Tensor buffer = torch::full({n + offset + 3}, 7.0, torch::dtype(dtype));
  torch::jit::Stack stack = {buffer.narrow(0, offset, n), 0.25, 2.5, c10::IValue()};
  Outcome outcome{buffer};
  if (parts > 0) {
    outcome.in_parts = detail::run_fill_in_parts(op, stack, draws.value_or(draws_of(op, n, dtype)),
                                                 parts, /*min_part=*/16);
  } else {
    op.callBoxed(&stack);
  }
  outcome.generator = generator_state();
  return outcome;
}

void expect_parts_are_whole(const c10::OperatorHandle& op, c10::ScalarType dtype,
                            const std::vector<int64_t>& sizes) {
  for (const int64_t n : sizes) {
    for (const int64_t parts : {2, 3, 4, 7}) {
      for (const int64_t offset : {0, 5}) {
        const std::string where = op.schema().name() + " " + c10::toString(dtype) +
                                  " n=" + std::to_string(n) + " parts=" + std::to_string(parts) +
                                  " offset=" + std::to_string(offset);
        const Outcome whole = fill(op, dtype, n, offset, 0);
        const Outcome split = fill(op, dtype, n, offset, parts);
        EXPECT_TRUE(split.in_parts) << where;
        EXPECT_TRUE(bitwise_equal(split.storage, whole.storage)) << where;
        EXPECT_TRUE(bitwise_equal(split.generator, whole.generator)) << where << ": generator";
      }
    }
  }
}

TEST(FillInParts, UniformInPartsIsTheWholeFillBitwiseInEveryFloatingDtype) {
  for (const c10::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    expect_parts_are_whole(uniform_op(), dtype, {112, 113, 127, 128, 129, 1000, 4099});
  }
}

TEST(FillInParts, NormalInPartsIsTheWholeFillBitwiseAcrossItsBlocksAndTail) {
  for (const c10::ScalarType dtype : {at::kFloat, at::kDouble}) {
    expect_parts_are_whole(normal_op(), dtype, {112, 113, 127, 128, 129, 143, 1000, 4099});
  }
}

TEST(FillInParts, SplitsAtMostIntoPartsOfTheMinimumSize) {
  // 40 elements hold two parts of 16 (the second takes the rest), 31 only one.
  EXPECT_TRUE(fill(normal_op(), at::kFloat, 40, 0, 4).in_parts);
  EXPECT_FALSE(fill(normal_op(), at::kFloat, 31, 0, 4).in_parts);
  const Outcome whole = fill(normal_op(), at::kFloat, 40, 0, 0);
  EXPECT_TRUE(bitwise_equal(fill(normal_op(), at::kFloat, 40, 0, 4).storage, whole.storage));
}

// What cannot be split runs whole: nothing written, the generator untouched.
void expect_left_whole(const std::string& what, const c10::OperatorHandle& op,
                       torch::jit::Stack stack, uint64_t draws) {
  torch::manual_seed(3);
  const at::Tensor before = generator_state();
  const at::Tensor self = stack[0].toTensor();
  const at::Tensor contents = self.clone();
  EXPECT_FALSE(detail::run_fill_in_parts(op, stack, draws, 4, 16)) << what;
  EXPECT_TRUE(bitwise_equal(self, contents)) << what;
  EXPECT_TRUE(bitwise_equal(generator_state(), before)) << what;
}

TEST(FillInParts, RunsWholeWhatItsDrawOrderDoesNotAllowToSplit) {
  const at::Tensor square = torch::zeros({64, 64});
  expect_left_whole("a transposed tensor", uniform_op(), {square.t(), 0.0, 1.0, c10::IValue()},
                    64 * 64);
  expect_left_whole("every other element", normal_op(),
                    {square.view({-1}).slice(0, 0, 4096, 2), 0.0, 1.0, c10::IValue()},
                    draws_of(normal_op(), 2048, at::kFloat));
  for (const c10::ScalarType reduced : {at::kHalf, at::kBFloat16}) {
    expect_left_whole("normal_ in " + std::string(c10::toString(reduced)), normal_op(),
                      {torch::zeros({1000}, reduced), 0.0, 1.0, c10::IValue()},
                      draws_of(normal_op(), 1000, reduced));
  }
  expect_left_whole("an explicit generator", uniform_op(),
                    {torch::zeros({1000}), 0.0, 1.0, at::detail::createCPUGenerator(5)}, 1000);
  expect_left_whole("a draw count other than the kernel's", normal_op(),
                    {torch::zeros({1000}), 0.0, 1.0, c10::IValue()}, 1000);
  const auto random = c10::Dispatcher::singleton().findSchemaOrThrow("aten::random_", "from");
  expect_left_whole("random_", random, {torch::zeros({1000}), 0, 9, c10::IValue()}, 1000);
}

// End to end: modules with weights large enough to be filled in parts, initialized twice (the
// first fill is a dead write, Note [Dead writes]) and through chains of in-place ops after the
// fill (Note [Pointwise ops after a fill run in its parts]), some of which may not run in parts
// (sigmoid_ is not region-exact; add_ with alpha in bfloat16 neither), materialize to eager
// construction's bits and leave the generator where eager does.
struct TwiceInitializedImpl : torch::nn::Module {
  TwiceInitializedImpl() {
    torch::NoGradGuard no_grad;
    wide = register_module("wide", torch::nn::Linear(1024, 601));  // kaiming_uniform_, bias
    table = register_module("table", torch::nn::Embedding(4097, 129));
    doubles = register_buffer("doubles", torch::empty({600001}, torch::kDouble).uniform_(-1, 1));
    doubles.mul_(3).add_(1);
    halves = register_buffer("halves", torch::empty({700001}, torch::kBFloat16).uniform_());
    halves.add_(halves.new_full({}, 1), /*alpha=*/3).neg_();
    models::trunc_normal_(wide->weight, 0.02, -0.04, 0.04);
    table->weight.uniform_(-0.5, 0.5).sigmoid_().mul_(3);
  }
  torch::nn::Linear wide{nullptr};
  torch::nn::Embedding table{nullptr};
  at::Tensor doubles, halves;
};
TORCH_MODULE(TwiceInitialized);

TEST(FillInParts, LargeFillsMaterializeToEagerBitsOnTwoThreads) {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  torch::manual_seed(41);
  TwiceInitialized eager;
  const at::Tensor eager_next = torch::rand({4});
  torch::manual_seed(41);
  auto deferred = deferred_init([] { return TwiceInitialized(); });
  materialize_module(*deferred);
  at::set_num_threads(threads);
  EXPECT_TRUE(bitwise_equal(torch::rand({4}), eager_next)) << "generator";
  const auto eager_tensors = eager->named_parameters();
  for (const auto& item : deferred->named_parameters()) {
    EXPECT_TRUE(bitwise_equal(item.value(), eager_tensors[item.key()])) << item.key();
  }
  EXPECT_TRUE(bitwise_equal(deferred->doubles, eager->doubles));
  EXPECT_TRUE(bitwise_equal(deferred->halves, eager->halves));
}

}  // namespace
}  // namespace torchdefer
