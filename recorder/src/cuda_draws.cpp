#include <torchdefer/cuda_draws.h>

#include <torchdefer/boxed_arguments.h>
#include <torchdefer/fake_tensor.h>
#include <torchdefer/node_stack.h>
#include <torchdefer/op_table.h>
#include <torchdefer/torch_compat.h>

#ifdef TORCHDEFER_WITH_CUDA
#include "cuda_launch_limits.h"
#endif

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/core/stack.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/GradMode.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <utility>

namespace torchdefer {

// Note [Torch-mode draws on CUDA]: ATen's launch of a distribution kernel is blocks of 256
// threads, as many as the elements need up to the blocks every multiprocessor can hold; each
// thread takes `per_call` values from each curand call, which moves the offset by 4. A
// TensorIterator whose offsets do not fit 32 bits is cut in halves until each part's do, and
// every part is a launch of its own after the whole one's offset was taken.
std::optional<uint64_t> cuda_distribution_increment(uint64_t numel, uint64_t element_size,
                                                    uint64_t per_call, bool dense,
                                                    uint64_t max_offset,
                                                    const CudaLaunchLimits& limits) {
  if (numel == 0) {
    return 0;  // the kernel returns before taking an offset
  }
  constexpr uint32_t kBlock = 256;
  constexpr uint64_t kOffsetsPerCall = 4;
  constexpr uint64_t kMax32 = std::numeric_limits<int32_t>::max();
  const auto launch = [&](uint64_t n) {
    const auto blocks_per_multiprocessor =
        static_cast<uint32_t>(limits.max_threads_per_multiprocessor) / kBlock;
    const uint32_t grid =
        std::min(static_cast<uint32_t>(limits.multiprocessors) * blocks_per_multiprocessor,
                 static_cast<uint32_t>((n + kBlock - 1) / kBlock));
    return ((n - 1) / (uint64_t{kBlock} * grid * per_call) + 1) * kOffsetsPerCall;
  };
  uint64_t increment = launch(numel);
  if (numel <= kMax32 && max_offset <= kMax32) {
    return increment;
  }
  if (!dense) {
    return std::nullopt;
  }
  // Dense, TensorIterator sees one dimension, and halves it (the first half rounded down).
  std::vector<uint64_t> parts{numel};
  while (!parts.empty()) {
    const uint64_t n = parts.back();
    parts.pop_back();
    if (n <= kMax32 && 1 + (n - 1) * element_size <= kMax32) {
      increment += launch(n);
      continue;
    }
    parts.push_back(n - n / 2);
    parts.push_back(n / 2);
  }
  return increment;
}

namespace {

// One process-wide lock for placing, resolving and paying, on every device: resolving runs
// samplers that may resolve others first.
std::recursive_mutex& draws_mutex() {
  static auto* const mutex = new std::recursive_mutex();
  return *mutex;
}

}  // namespace

CudaSampler::CudaSampler(c10::DeviceIndex device, uint64_t seed, std::shared_ptr<CudaSampler> after,
                         uint64_t offset, const RecordedNode& node, const at::Tensor& target,
                         c10::ArrayRef<at::Tensor> tensors)
    : device_(device),
      seed_(seed),
      after_(std::move(after)),
      offset_(offset),
      arguments_(node.arguments.vec()),
      inputs_(node.inputs.vec()) {
  for (c10::IValue& argument : arguments_) {
    if (argument.isGenerator()) {
      argument = c10::IValue();  // the default generator, which the run lends at its place
    }
  }
  for (RecordedInput& input : inputs_) {
    input.tensor = at::Tensor();  // the sampler holds no fake, and so no recording
  }
  node_.emplace(node);
  node_->arguments = arguments_;
  node_->inputs = inputs_;
  node_->outputs = {};
  node_->draws = nullptr;
  const RealOnlyGuard real_only;
  geometry_.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    geometry_.push_back(t.defined() ? std::optional<at::Tensor>(at::empty_strided(
                                          t.sizes(), t.strides(), t.options().device(c10::kMeta)))
                                    : std::nullopt);
  }
  description_ = c10::str(node.op.schema().operator_name(), " on ", describe(target));
}

// Unlinked oldest-last in a loop: a chain of samplers per parameter of many models would take a
// stack frame each if freed by nested destructors.
CudaSampler::~CudaSampler() {
  std::shared_ptr<CudaSampler> next = std::move(after_);
  while (next && next.use_count() == 1) {
    next = std::move(next->after_);
  }
}

// Resolved oldest first: a model's chain can hold a sampler per parameter.
uint64_t CudaSampler::end() {
  const std::lock_guard<std::recursive_mutex> lock(draws_mutex());
  std::vector<CudaSampler*> pending;
  for (CudaSampler* s = this; s != nullptr && !s->end_; s = s->after_.get()) {
    pending.push_back(s);
  }
  for (auto it = pending.rbegin(); it != pending.rend(); ++it) {
    CudaSampler& s = **it;
    const uint64_t start = s.offset_ + (s.after_ ? *s.after_->end_ : 0);
    s.run_on_scratch(start);
  }
  return *end_;
}

void CudaSampler::offer(uint64_t end) {
  const std::lock_guard<std::recursive_mutex> lock(draws_mutex());
  if (end_) {
    // Run again (a replay after a scratch run): its increment must not have changed, or every op
    // placed after it would be placed wrong.
    TORCH_CHECK(*end_ == end, "torchdefer: ", description_, " moved CUDA's generator to offset ",
                end, " where an earlier run of it at the same place ended at ", *end_,
                ": its increment depends on more than its place (its inputs' values?), so the "
                "random ops recorded after it cannot be placed. Record with cuda_draws=\"cpu\" "
                "(C++: CudaDraws::kCpuGenerator), or materialize in counter RNG mode.");
    return;
  }
  end_ = end;
  after_.reset();  // its start is no longer needed: the chain before it can go
  node_.reset();
  arguments_.clear();
  inputs_.clear();
  geometry_.clear();
}

void CudaSampler::run_on_scratch(uint64_t start) {
  const NoPythonModesGuard no_python_modes;
  const RealOnlyGuard real_only;
  const c10::AutoGradMode no_grad(false);
  const c10::Device device(c10::kCUDA, device_);
  torch::jit::Stack stack = node_stack(
      *node_,
      [&](size_t position, const RecordedInput&) {
        const std::optional<at::Tensor>& meta = geometry_.at(position);
        // Ones: valid probabilities, rates and counts alike; no CUDA kernel's increment reads them.
        return meta ? at::empty_strided(meta->sizes(), meta->strides(),
                                        meta->options().device(device))
                          .fill_(1)
                    : at::Tensor();
      },
      device);
  try {
    const uint64_t end = detail::with_cuda_generator_at(device_, {seed_, start},
                                                        [&] { node_->op.callBoxed(&stack); });
    offer(end);
  } catch (c10::Error& e) {
    e.add_context(c10::str("torchdefer: ", description_,
                           " was run on a scratch tensor to learn how far it moves CUDA's "
                           "generator (Note [Torch-mode draws on CUDA])"));
    throw;
  }
}

namespace detail {
namespace {

bool has_cuda() { return at::globalContext().hasCUDA(); }

at::Generator cuda_generator(c10::DeviceIndex device) {
  return at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, device));
}

CudaPlace read_generator(at::Generator& generator) {
  const std::lock_guard<std::mutex> lock(generator.mutex());
  return {generator.current_seed(), generator.get_offset()};
}

void set_generator(at::Generator& generator, const CudaPlace& place) {
  const std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_current_seed(place.seed);
  generator.set_offset(place.offset);
}

// Moves the generator along its seed's stream, where eager has it or to a mark.
void set_offset(at::Generator& generator, uint64_t offset) {
  const std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_offset(offset);
}

bool same_place(const CudaPlace& a, const CudaPlace& b) {
  return a.seed == b.seed && a.offset == b.offset;
}

// Note [Marks of an owed CUDA generator]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// While a sampler is owed, where eager has the generator is not a number yet, and a generator
// left where it was would not show a move back to it: torch.random.fork_rng() saving and restoring
// it around draws inside a constructor, or torch.manual_seed() with the seed the recording
// started from when its first CUDA op was a sampler. So after each op placed while owed, the
// generator is parked at a *mark*: an offset no kernel reaches (2^62 and up, 2^32 apart, beyond
// what any draw between two ops adds), each naming a place of the chain. Finding the generator
// at an earlier mark is a restore to that place; anywhere else that is not the current mark, a
// reseed (another seed, or a smaller offset) or a draw. Paying sets the generator to the place the
// mark it holds names, resolved. Marks are never numbered again, nor forgotten, for as long as the
// process lives (an entry per op placed while owed): a state saved while owed, without the
// wrapper of Note [The generator's state read while recording], may be restored after the debt
// was paid or after a reseed, and still names its place.
constexpr uint64_t kFirstMark = uint64_t{1} << 62;
constexpr int kMarkShift = 32;

// Where the next random op on one device's generator goes, and the generator as the recorder last
// left it (Note [Torch-mode draws on CUDA]).
struct DeviceChain {
  bool started = false;
  CudaPlace left;
  uint64_t seed = 0;
  std::shared_ptr<CudaSampler> after;  // the chain continues `offset` past its end
  uint64_t offset = 0;
  // The places the marks name, in mark order (Note [Marks of an owed CUDA generator]).
  struct Marked {
    uint64_t seed;
    std::shared_ptr<CudaSampler> after;
    uint64_t offset;
  };
  std::vector<Marked> marks;
  std::optional<CudaLaunchLimits> limits;
  bool limits_read = false;
};

std::map<c10::DeviceIndex, DeviceChain>& device_chains() {
  static auto* const chains = new std::map<c10::DeviceIndex, DeviceChain>();
  return *chains;
}

// The index of the mark `place` holds, if it holds one of `chain`'s.
std::optional<size_t> mark_of(const DeviceChain& chain, const CudaPlace& place) {
  if (place.offset < kFirstMark) {
    return std::nullopt;
  }
  const uint64_t past = place.offset - kFirstMark;
  const uint64_t index = past >> kMarkShift;
  if ((past & ((uint64_t{1} << kMarkShift) - 1)) != 0 || index >= chain.marks.size() ||
      chain.marks[index].seed != place.seed) {
    return std::nullopt;
  }
  return static_cast<size_t>(index);
}

// Parks the generator at a new mark naming the chain's place.
void park(DeviceChain& chain, at::Generator& generator) {
  chain.left = {chain.seed, kFirstMark + (uint64_t{chain.marks.size()} << kMarkShift)};
  chain.marks.push_back({chain.seed, chain.after, chain.offset});
  set_offset(generator, chain.left.offset);
}

// Starts the chain again at `now`, a state the recorder did not leave: what was owed is moot after
// a reseed (another seed, or an offset back), as in eager; after a draw, that draw did not come
// after the recording's, as in eager, and the warning says so.
void start_at(DeviceChain& chain, c10::DeviceIndex device, const CudaPlace& now) {
  if (chain.started && chain.after && now.seed == chain.left.seed &&
      now.offset > chain.left.offset) {
    TORCH_WARN("torchdefer: CUDA's generator on cuda:", static_cast<int>(device),
               " was drawn from while it still owed the draws of ", chain.after->description(),
               " (and the random ops recorded after it): those numbers differ from eager "
               "construction's, which drew them after the recording's. Materialize in torch mode "
               "before drawing on the GPU.");
  }
  chain.started = true;
  chain.left = now;
  chain.seed = now.seed;
  chain.after.reset();
  chain.offset = now.offset;
}

// Brings the chain to where the generator is now: unchanged, back at an earlier mark, or moved.
void follow(DeviceChain& chain, c10::DeviceIndex device, const CudaPlace& now) {
  if (chain.started && same_place(now, chain.left)) {
    return;
  }
  if (const std::optional<size_t> mark = mark_of(chain, now); chain.started && mark) {
    const DeviceChain::Marked& marked = chain.marks[*mark];
    chain.seed = marked.seed;
    chain.after = marked.after;
    chain.offset = marked.offset;
    chain.left = now;
    return;
  }
  start_at(chain, device, now);
}

const std::optional<CudaLaunchLimits>& launch_limits(DeviceChain& chain, c10::DeviceIndex device) {
  if (!chain.limits_read) {
    chain.limits_read = true;
#ifdef TORCHDEFER_WITH_CUDA
    chain.limits = cuda_launch_limits(device);
#else
    (void)device;
#endif
  }
  return chain.limits;
}

// How far `node`, filling `target`, moves the offset, when the op table says a distribution kernel
// fills it and the device's limits are known.
std::optional<uint64_t> computed_increment(const RecordedNode& node, const at::Tensor& target,
                                           const std::optional<CudaLaunchLimits>& limits) {
  const OpInfo* info = find_op_info(node.op.schema().operator_name());
  if (!limits || info == nullptr || info->cuda_draws != CudaDrawRule::kDistributionKernel) {
    return std::nullopt;
  }
  // A complex tensor is filled as its real view: twice the elements, of the real type.
  const bool complex = c10::isComplexType(target.scalar_type());
  const c10::ScalarType real = c10::toRealValueType(target.scalar_type());
  const auto element_size = static_cast<uint64_t>(c10::elementSize(real));
  const auto itemsize = static_cast<uint64_t>(target.element_size());
  uint64_t max_offset = 1 + (complex ? element_size : 0);
  for (int64_t d = 0; d < target.dim(); ++d) {
    if (target.size(d) == 0) {
      return 0;
    }
    max_offset += static_cast<uint64_t>(target.size(d) - 1) *
                  static_cast<uint64_t>(target.stride(d)) * itemsize;
  }
  const auto numel = static_cast<uint64_t>(target.numel()) * (complex ? 2 : 1);
  return cuda_distribution_increment(numel, element_size, real == at::kDouble ? 2 : 4,
                                     target.is_non_overlapping_and_dense(), max_offset, *limits);
}

}  // namespace

RecordedDraws place_on_cuda_generator(OpGraph& graph, const RecordedNode& node,
                                      const at::Tensor& target, c10::ArrayRef<at::Tensor> tensors,
                                      bool in_recording_scope) {
  RecordedDraws draws;
  draws.kind = RecordedDraws::Kind::kCudaGenerator;
  const c10::DeviceIndex device = target.device().index();
  if (!has_cuda() || device >= at::detail::getCUDAHooks().getNumGPUs()) {
    return draws;  // no generator to read: counter mode only (cuda_place() says so)
  }
  // The samplers the op is placed after and, if it is one, its own; added to the graph after the
  // process-wide lock is released: a torch-mode replay holds the graph's lock while it takes that
  // one (Materialization's shards), so the graph's comes first or alone.
  std::shared_ptr<CudaSampler> after;
  std::shared_ptr<CudaSampler> own;
  bool owed = false;
  {
    const std::lock_guard<std::recursive_mutex> lock(draws_mutex());
    DeviceChain& chain = device_chains()[device];
    at::Generator generator = cuda_generator(device);
    follow(chain, device, read_generator(generator));
    draws.cuda_device = static_cast<int8_t>(device);
    draws.cuda_seed = chain.seed;
    draws.offset = chain.offset;
    after = chain.after;
    if (const std::optional<uint64_t> increment =
            computed_increment(node, target, launch_limits(chain, device))) {
      draws.draws = *increment;
      chain.offset += *increment;
    } else {
      own = std::make_shared<CudaSampler>(device, chain.seed, chain.after, chain.offset, node,
                                          target, tensors);
      chain.after = own;
      chain.offset = 0;
    }
    owed = chain.after != nullptr;
    if (owed) {
      park(chain, generator);
    } else {
      chain.left = {chain.seed, chain.offset};
      set_offset(generator, chain.offset);  // where eager leaves it
    }
  }
  if (after || own) {
    const auto graph_lock = graph.lock();
    draws.anchor = after ? graph.add_cuda_sampler(std::move(after)) : -1;
    draws.end_anchor = own ? graph.add_cuda_sampler(std::move(own)) : -1;
  }
  if (!in_recording_scope && graph.exact_generator() && owed) {
    pay_cuda_generator_debt(device);  // as exact_generator does for the CPU generator
  }
  return draws;
}

CudaPlace cuda_place(const OpGraph& graph, const RecordedNode& node) {
  const RecordedDraws& draws = *node.draws;
  TORCH_CHECK(draws.cuda_device >= 0, "torchdefer: ", node.op.schema().operator_name(),
              " in deferred_init of ", graph.context(),
              " was recorded on a fake CUDA tensor to draw from CUDA's generator (cuda_draws), "
              "but no CUDA device was present to read that generator, so torch RNG mode cannot "
              "place it. Materialize in counter RNG mode, or record with cuda_draws=\"cpu\" "
              "(C++: CudaDraws::kCpuGenerator) for eager's CPU values on every device.");
  uint64_t offset = draws.offset;
  if (draws.anchor >= 0) {
    offset += graph.cuda_sampler(draws.anchor)->end();
  }
  return {draws.cuda_seed, offset};
}

uint64_t with_cuda_generator_at(c10::DeviceIndex device, const CudaPlace& place,
                                const std::function<void()>& call) {
  // Held across the loan: a recording on another thread must not read the lent place as a move.
  const std::lock_guard<std::recursive_mutex> lock(draws_mutex());
  at::Generator generator = cuda_generator(device);
  const CudaPlace saved = read_generator(generator);
  struct Restore {
    at::Generator& generator;
    const CudaPlace& saved;
    ~Restore() { set_generator(generator, saved); }
  } restore{generator, saved};
  set_generator(generator, place);
  call();
  return read_generator(generator).offset;
}

void pay_cuda_generator_debt(c10::DeviceIndex device) {
  const std::lock_guard<std::recursive_mutex> lock(draws_mutex());
  const auto found = device_chains().find(device);
  if (found == device_chains().end() || !found->second.after) {
    return;
  }
  DeviceChain& chain = found->second;
  at::Generator generator = cuda_generator(device);
  follow(chain, device, read_generator(generator));  // first: a moved generator owes nothing
  if (!chain.after) {
    return;
  }
  const uint64_t end = chain.after->end() + chain.offset;
  chain.after.reset();
  chain.offset = end;
  chain.left = {chain.seed, end};
  set_offset(generator, end);
}

void pay_cuda_generator_debts() {
  const std::lock_guard<std::recursive_mutex> lock(draws_mutex());
  for (const auto& [device, chain] : device_chains()) {
    if (chain.after) {
      pay_cuda_generator_debt(device);
    }
  }
}

}  // namespace detail
}  // namespace torchdefer
