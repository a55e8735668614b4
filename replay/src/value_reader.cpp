// The replay engine as the recorder's value reader (Note [Reading values while recording]).
#include "replay.h"

#include <torchdefer/fake_tensor.h>
#include <torchdefer/materialize.h>
#include <torchdefer/op_graph.h>
#include <torchdefer/torch_compat.h>
#include <torchdefer/value_reader.h>

#include <c10/util/Exception.h>

#include <mutex>

namespace torchdefer::detail {
namespace {

// Replays `fake`'s value without committing anything: on CPU, which every process has, and in
// torch RNG mode, whose values are eager's. GraphReplay restores the default generator.
at::Tensor replay_value(const at::Tensor& fake) {
  const RecordedFake* rec = recorded(fake);
  const MaterializeOptions options = MaterializeOptions().device(c10::kCPU).rng(RngMode::kTorch);
  GraphReplay replay(rec->graph, options);
  replay.add_value(rec->value);
  {
    const std::lock_guard<std::mutex> lock(rec->graph->mutex());
    replay.plan();
    replay.validate();
  }
  const at::Tensor foreign = replay.unmaterialized_foreign_fake();
  TORCH_CHECK(!foreign.defined(), "torchdefer: cannot read the values of ", describe(fake),
              ": they are computed from ", describe(foreign),
              ", a fake of another deferred_init, and reading values must not materialize it. "
              "Materialize that tensor first.");
  replay.execute();
  // The result may view a storage that was already real (materialized during construction).
  RealOnlyGuard real_only;
  return replay.result(0).clone();
}

[[maybe_unused]] const bool kRegistered = (set_value_reader(&replay_value), true);

}  // namespace
}  // namespace torchdefer::detail
