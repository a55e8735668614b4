#include "fill_in_parts.h"

#include <torchdefer/boxed_arguments.h>
#include <torchdefer/mt19937_jump.h>
#include <torchdefer/op_table.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <vector>

namespace torchdefer::detail {
namespace {

constexpr int64_t kBlock = 16;  // normal_'s block (Note [Torch-mode fills in parts])

enum class Fill { kUniform, kNormal };

std::optional<Fill> fill_of(const c10::OperatorHandle& op) {
  const OpInfo* info = find_op_info(op.operator_name());
  if (info == nullptr || !info->draws || !writes_first_argument(op.schema())) {
    return std::nullopt;
  }
  switch (*info->draws) {
    case DrawRule::kUniform:
      return Fill::kUniform;
    case DrawRule::kNormal:
      return Fill::kNormal;
    default:
      return std::nullopt;
  }
}

// 32-bit draws per element, or nullopt for a dtype whose draw order the Note does not describe.
std::optional<uint64_t> words_per_element(Fill fill, c10::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return 1;
    case at::kDouble:
      return 2;
    case at::kHalf:
    case at::kBFloat16:
      return fill == Fill::kUniform ? std::optional<uint64_t>(1) : std::nullopt;
    default:
      return std::nullopt;
  }
}

// The index of `op`'s generator argument, if it has one and it was not given.
std::optional<size_t> default_generator_argument(const c10::FunctionSchema& schema,
                                                 const torch::jit::Stack& stack) {
  for (size_t i = 0; i < schema.arguments().size() && i < stack.size(); ++i) {
    if (schema.arguments()[i].name() == "generator") {
      return stack[i].isNone() ? std::optional<size_t>(i) : std::nullopt;
    }
  }
  return std::nullopt;
}

// One part: elements [begin, begin + length) of the flattened tensor, its draws starting `first`
// draws after the op's.
struct Part {
  int64_t begin = 0;
  int64_t length = 0;
  uint64_t first = 0;
};

// The parts of a fill of `n` elements: up to `parts` of at least `min_part` elements each,
// starting at multiples of 16, the last one taking the rest; none when fewer than two fit. Their
// draws add up to `total`.
std::vector<Part> cut(Fill fill, int64_t n, uint64_t words, int64_t parts, int64_t min_part,
                      uint64_t& total) {
  parts = std::min(parts, n / std::max(min_part, kBlock));
  if (parts < 2) {
    return {};
  }
  const int64_t chunk = n / parts / kBlock * kBlock;
  std::vector<Part> cuts;
  total = 0;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t begin = p * chunk;
    const int64_t length = p + 1 < parts ? chunk : n - begin;
    cuts.push_back({begin, length, total});
    total += static_cast<uint64_t>(length) * words;
  }
  if (fill == Fill::kNormal && n % kBlock != 0) {
    total += kBlock * words;  // the last part's final block
  }
  return cuts;
}

at::CPUGeneratorImpl* cpu_impl(const at::Generator& generator) {
  return at::check_generator<at::CPUGeneratorImpl>(generator);
}

}  // namespace

bool run_fill_in_parts(const c10::OperatorHandle& op, torch::jit::Stack& stack, uint64_t draws,
                       int64_t parts, int64_t min_part, const std::vector<PartwiseStep>& then) {
  const std::optional<Fill> fill = fill_of(op);
  if (!fill || stack.empty() || !stack[0].isTensor()) {
    return false;
  }
  const std::optional<size_t> generator_argument = default_generator_argument(op.schema(), stack);
  const at::Tensor self = stack[0].toTensor();
  if (!generator_argument || !self.device().is_cpu() || !self.is_contiguous()) {
    return false;
  }
  const std::optional<uint64_t> words = words_per_element(*fill, self.scalar_type());
  if (!words) {
    return false;
  }
  uint64_t total = 0;
  const std::vector<Part> cuts =
      cut(*fill, self.numel(), *words, parts > 0 ? parts : at::get_num_threads(), min_part, total);
  if (cuts.empty() || total != draws) {
    return false;
  }
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  at::mt19937 start;
  {
    const std::lock_guard<std::mutex> lock(generator.mutex());
    start = cpu_impl(generator)->engine();
  }
  const at::Tensor flat = self.view({-1});
  std::vector<at::mt19937> ends(cuts.size());
  const at::ThreadLocalState caller;
  at::parallel_for(0, static_cast<int64_t>(cuts.size()), 1, [&](int64_t begin, int64_t end) {
    const at::ThreadLocalStateGuard as_caller(caller);
    for (int64_t p = begin; p < end; ++p) {
      at::mt19937 engine = start;
      mt19937_discard(engine, cuts[p].first);
      at::Generator own = at::make_generator<at::CPUGeneratorImpl>();
      cpu_impl(own)->set_engine(engine);
      torch::jit::Stack part = stack;
      part[0] = flat.narrow(0, cuts[p].begin, cuts[p].length);
      part[*generator_argument] = own;
      op.callBoxed(&part);
      ends[p] = cpu_impl(own)->engine();
      for (const PartwiseStep& step : then) {
        torch::jit::Stack step_part = step.stack;
        step_part[0] = flat.narrow(0, cuts[p].begin, cuts[p].length);
        step.op.callBoxed(&step_part);
      }
    }
  });
  {
    const std::lock_guard<std::mutex> lock(generator.mutex());
    cpu_impl(generator)->set_engine(ends.back());
  }
  stack.clear();
  stack.emplace_back(self);
  return true;
}

}  // namespace torchdefer::detail
