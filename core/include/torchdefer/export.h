// TORCHDEFER_API: what libtorchdefer exports. The library is compiled with hidden visibility
// (Note [Layers as targets] in the top CMakeLists.txt), so only declarations marked with it are
// visible to programs and to the Python extension; everything else, torchdefer::detail included,
// stays inside the library.
#pragma once

#define TORCHDEFER_API __attribute__((visibility("default")))
