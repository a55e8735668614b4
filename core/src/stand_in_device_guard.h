// A device guard for device types this LibTorch has no backend for, so that autograd can attach
// to fake tensors on them (fake CUDA tensors in a CPU-only LibTorch).
#pragma once

#include <c10/core/DeviceType.h>

namespace torchdefer::detail {

// Note [Stand-in device guards]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Autograd asks the device guard of a tensor's device type for the current stream whenever it
// builds a grad node or a grad accumulator for it (torch::autograd::InputMetadata). A fake CUDA
// parameter with requires_grad=true in a CPU-only LibTorch therefore needs a CUDA device guard,
// and that LibTorch has none ("PyTorch is not linked with support for cuda devices").
// install_stand_in_device_guard() registers one for a device type that has no guard at all: it
// tracks a per-thread current index, hands out the default stream, and treats events as already
// complete. It counts no device: autograd's engine starts a worker thread for every device the
// registered guards count, at the first backward in the process, and from then on marks forked
// children unable to run a backward; with a count of 127, a CPU-only process that had made one
// fake CUDA tensor started 127 idle threads at its first CPU backward, and its forked workers
// (DataLoader, forked ranks) failed at theirs, which they do not without torchdefer.
// Fakes need nothing more, since they never run a kernel. A device type that has a
// real guard (a CUDA build) keeps it; the stand-in never replaces a real backend, and real tensors
// on a device type with no backend still fail at their first kernel, as before.
void install_stand_in_device_guard(c10::DeviceType type);

// True if the guard registered for `type` is torchdefer's stand-in.
bool has_stand_in_device_guard(c10::DeviceType type);

}  // namespace torchdefer::detail
