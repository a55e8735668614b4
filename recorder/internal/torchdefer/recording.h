// What the entry layer needs to open a recording and to ask about one: the recording, the reader
// it reads values with (Note [Who reads values]), and the functions behind the public API.
#pragma once

#include <torchdefer/fake_tensor.h>

#include <ATen/core/Tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cstdint>
#include <memory>
#include <string>

namespace torchdefer {

class OpGraph;

namespace detail {

// Note [Who reads values]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Reading a value replays it, and the recorder must not depend on the replay engine. The recorder
// declares what a reader is, and each recording is given its reader by whoever opens it: the
// entry layer, which sits above replay, opens every recording (DeferredInitGuard in
// api/src/deferred_init.cpp, which the extension's RecordingScope holds too) and passes its
// replay-based reader there. The graph keeps the reader, so a read of a fake after deferred_init
// returned, when no recording is open, goes through the reader of the recording that made it.
//
// A process-wide reader that the entry layer installs from a static initializer would work too,
// but it hides a dependency of the recorder on the layer above in load order: a recorder linked
// without the entry layer fails only at the first item(). A reader passed when a recording opens
// is a dependency the code states, and the recorder stays testable alone, with any reader.
//
// A reader returns a real tensor, private to the caller, holding the values `fake` (a fake of
// the recording in progress on this thread, or of an ended one) has so far, as eager
// construction computed them. It must leave the recording and the default generator exactly as
// they were.
using ValueReader = at::Tensor (*)(const at::Tensor& fake);

// What deferred_init opens around construction (DeferredInitGuard holds one): while it lives on a
// thread, factories return fakes (as under FakeMode) and every operator on fakes is recorded into
// a new OpGraph (Note [The op graph]) that reads values with `reader`. Recordings nest, each with
// its own graph; one that unwinds because construction threw leaves no key in TLS, and its graph
// goes away with the fakes that referred to it. `exact_generator`: DeferredInitOptions';
// `cuda_generator`: whether random ops on CUDA tensors draw from CUDA's generator (Note [Torch-mode
// draws on CUDA] in cuda_draws.h).
class Recording {
 public:
  Recording(std::string context, bool exact_generator, bool cuda_generator, ValueReader reader);
  ~Recording();
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;

 private:
  FakeMode fake_;
  c10::impl::IncludeDispatchKeyGuard include_deferred_init_;
  std::shared_ptr<OpGraph> saved_graph_;
  bool exact_generator_;
};

// What the entry layer's public functions of the same names do (their declarations say what:
// api/include/torchdefer/deferred_init.h, api/internal/torchdefer/extension.h).
at::Tensor read_values(const at::Tensor& t);
bool made_in_inference_mode(const at::Tensor& t);
uint64_t inference_tensors_made();
[[noreturn]] void refuse_inference_tensor(const std::string& what);
void settle_default_generator(bool about_to_read);
std::string explain(const at::Tensor& t);

}  // namespace detail
}  // namespace torchdefer
