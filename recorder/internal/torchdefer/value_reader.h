// The interface through which the recorder reads values of the recording in progress (Note
// [Reading values while recording]). The recorder declares it; the entry layer, which may call
// the replay engine (the recorder may not), installs the implementation.
#pragma once

#include <ATen/core/Tensor.h>

namespace torchdefer::detail {

class ValueReader {
 public:
  virtual ~ValueReader() = default;
  // Returns a real tensor, private to the caller, holding the values `fake` (a fake of the
  // recording in progress on this thread) has so far, as eager construction computed them. Must
  // leave the recording and the default generator exactly as they were.
  virtual at::Tensor read(const at::Tensor& fake) const = 0;
};

// Installs `reader` for the life of the process (Note [Who reads values]). A second installation
// of a different reader is an error.
void install_value_reader(const ValueReader& reader);

}  // namespace torchdefer::detail
