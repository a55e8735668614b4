// Torch RNG mode on CUDA: where random ops recorded on fake CUDA tensors draw from CUDA's Philox
// generator, and keeping that generator where eager construction on the GPU leaves it.
#pragma once

#include <torchdefer/op_graph.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torchdefer {

// Note [Torch-mode draws on CUDA]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Eager construction on a GPU draws every random op on a CUDA tensor from that device's default
// generator: Philox, whose state is a seed and an offset. Each kernel takes the offset as its start
// and moves it by an increment of its own, which depends on the element count, the launch (the
// distribution kernels' grid is capped at the device's multiprocessors times the blocks each one
// holds) and nothing else; PyTorch's CPU generator is not touched. A recording made with
// `cuda_draws` on CUDA's generator (the default where a CUDA device is present) records the same:
//  - A random op whose tensor is on a CUDA device, drawing from the default generator, is placed on
//    that device's generator, not on the CPU chain (Note [Torch-mode draw offsets]), which only
//    the CPU's random ops move, as in eager. Its counter-mode key is its index among the
//    recording's random ops, as for every default-generator op, so counter mode gives the same
//    values whichever generator the recording followed.
//  - Its place is the generator's seed and offset when it is recorded. The distribution kernels'
//    increments (the op table's CudaDrawRule::kDistributionKernel: uniform_, normal_, their
//    factories, exponential_, ...) are computed from the element count and the device's launch
//    limits as ATen computes them (cuda_distribution_increment()), and the generator is moved by
//    them at once, so it is where eager leaves it when deferred_init returns. Reading and setting
//    the generator creates no CUDA context: it is host memory, and PyTorch asks for a capture
//    status only where a context exists.
//  - Any other random op (trunc_normal_'s rejection loop, dropout, randperm, bernoulli with a
//    tensor of probabilities) moves the offset by what only its run tells, so it becomes a
//    CudaSampler: the ops after it are placed relative to its end, and the generator is owed from
//    there, as the CPU generator is after a lazy anchor (Note [Lazy RNG anchors]). A sampler runs
//    once: when a torch-mode replay runs it at its place (the replay offers the offset it left),
//    or on a scratch tensor of its geometry on its device when an op after it is placed first or
//    the debt is paid. Recording itself runs nothing on the GPU; what asks for the generator's
//    state or a value pays the debt there, as eager construction has computed them by then:
//    exact_generator, torch.cuda.get_rng_state (and fork_rng) while recording
//    (bindings/torchdefer/_generator_state.py), an unrecorded random op on a real CUDA tensor, and
//    a value read of a CUDA fake (a torch-mode replay).
//  - A replay in torch mode runs each such op on its recorded CUDA device (materializing it
//    elsewhere copies it there, as `.to()` after eager construction would), with the device's
//    default generator lent at the op's place and restored after; a distribution kernel's
//    increment is checked against the one computed at record time, so that a launch that differs
//    from ATen's formula fails loudly instead of shifting every op after it. After a torch-mode
//    replay the debt is paid: the generator is set to where eager leaves it, unless someone moved
//    it since the recorder last left it (a reseed makes the debt moot, as in eager).
//  - deferred_init(..., exact_generator=True) pays the debt when the recording ends, running the
//    samplers there (on the GPU, at eager's cost for them), so that CUDA's generator is exact when
//    deferred_init returns, as it does for the CPU generator.
//  - Each time it places an op, the recorder compares the generator with where it left it: a
//    reseed, a restore or a draw in between (torch.manual_seed in a constructor, fork_rng, an
//    unrecorded CUDA random op) starts the places again from the generator's state then, or, back
//    at a mark of an owed generator, from the place that mark names (Note [Marks of an owed CUDA
//    generator] in recorder/src/cuda_draws.cpp).
// Eager's CUDA bits depend on the GPU model (the launch), so this reproduces eager construction on
// the recording's GPU; `cuda_draws` on the CPU generator gives eager's CPU bits on every device
// instead (Note [Torch-mode draws run on the CPU] in replay/src/replay.cpp). Without a CUDA device
// the generator cannot be read: such a recording materializes in counter mode, and torch mode
// refuses its CUDA ops.

// A place on a CUDA generator: its whole state.
struct CudaPlace {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// What ATen's distribution kernels read of a device to size their launch.
struct CudaLaunchLimits {
  int64_t multiprocessors = 0;
  int64_t max_threads_per_multiprocessor = 0;
};

// How far a distribution kernel (ATen's distribution_nullary_kernel) moves the Philox offset
// filling `numel` elements of `element_size` bytes each, taking `per_call` values from each
// curand call (4 for float results, 2 for double), on a device of `limits`. `dense` says the
// elements are non-overlapping and dense (TensorIterator then sees one dimension), `max_offset`
// is TensorIterator's largest byte offset of the operand plus one. nullopt when the kernel would
// split a layout that is not dense into 32-bit-indexable parts (its split is not computed here).
std::optional<uint64_t> cuda_distribution_increment(uint64_t numel, uint64_t element_size,
                                                    uint64_t per_call, bool dense,
                                                    uint64_t max_offset,
                                                    const CudaLaunchLimits& limits);

// A random op on CUDA whose increment only its run tells: what running it on scratch on its device
// needs, where it starts (after the sampler before it, or at a known offset), and, once run, where
// it ends.
class CudaSampler {
 public:
  // `node` fills `target`; `tensors` are the tensors it was called with, in input order.
  CudaSampler(c10::DeviceIndex device, uint64_t seed, std::shared_ptr<CudaSampler> after,
              uint64_t offset, const RecordedNode& node, const at::Tensor& target,
              c10::ArrayRef<at::Tensor> tensors);
  ~CudaSampler();
  CudaSampler(const CudaSampler&) = delete;
  CudaSampler& operator=(const CudaSampler&) = delete;

  // Where its draws end, running it and every unresolved sampler before it on scratch first
  // (oldest first, under one process-wide lock).
  uint64_t end();
  // A replay that ran it at its start offers the offset it left; a second offer must agree.
  void offer(uint64_t end);
  // For messages ("torchdefer::trunc_normal_ on cuda:0 float[4, 4]").
  const std::string& description() const { return description_; }

 private:
  void run_on_scratch(uint64_t start);

  c10::DeviceIndex device_;
  uint64_t seed_;
  std::shared_ptr<CudaSampler> after_;
  uint64_t offset_;  // past after_'s end, or the absolute offset when there is none
  std::optional<uint64_t> end_;
  // What running it needs, dropped once it has run.
  std::optional<RecordedNode> node_;  // viewing the two lists after it
  std::vector<c10::IValue> arguments_;
  std::vector<RecordedInput> inputs_;                // without the tensors they held
  std::vector<std::optional<at::Tensor>> geometry_;  // meta stand-ins, per tensor input
  std::string description_;
};

namespace detail {

// Places `node`, a random op on the default generator whose tensor `target` is on a CUDA device,
// on that device's generator (a recording with cuda_draws on CUDA's generator); `tensors` are the
// tensors it was called with, in input order. After its deferred_init returned (not
// `in_recording_scope`), an exact_generator recording pays what the op leaves owed at once.
RecordedDraws place_on_cuda_generator(OpGraph& graph, const RecordedNode& node,
                                      const at::Tensor& target, c10::ArrayRef<at::Tensor> tensors,
                                      bool in_recording_scope);

// The place of a node placed by place_on_cuda_generator(), resolving the samplers before it.
// Refuses, naming the node, when the generator could not be read at record time.
CudaPlace cuda_place(const OpGraph& graph, const RecordedNode& node);

// Runs `call` with the default generator of CUDA device `device` lent at `place`, restoring it
// after; returns the offset the call left.
uint64_t with_cuda_generator_at(c10::DeviceIndex device, const CudaPlace& place,
                                const std::function<void()>& call);

// Sets the default generator of `device` where eager construction leaves it, if recordings owe it
// draws and nobody moved it since (a restore to an earlier mark pays up to that place: Note [Marks
// of an owed CUDA generator] in cuda_draws.cpp); runs the samplers that no replay ran.
void pay_cuda_generator_debt(c10::DeviceIndex device);
// The same for every device: what exact_generator does when its recording ends.
void pay_cuda_generator_debts();

}  // namespace detail
}  // namespace torchdefer
