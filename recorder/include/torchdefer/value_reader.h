// The hook through which the recorder reads values of the recording in progress (Note [Reading
// values while recording]). The recorder declares it; the replay engine, which the recorder must
// not depend on, provides it.
#pragma once

#include <ATen/core/Tensor.h>

namespace torchdefer::detail {

// Returns a real tensor, private to the caller, holding the values `fake` (a fake of the
// recording in progress on this thread) has so far, as eager construction computed them. Must
// leave the recording and the default generator exactly as they were.
using ValueReader = at::Tensor (*)(const at::Tensor& fake);

// Installs the reader; called once, at static initialization, by the replay engine.
void set_value_reader(ValueReader reader);

}  // namespace torchdefer::detail
