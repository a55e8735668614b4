// Compiled once per layer by tests/layering/CMakeLists.txt with that layer's own include folders
// and TORCHDEFER_UPWARD_HEADER set to a header of the layer above it: the build must fail to
// find it (Note [Layers as targets]).
#include TORCHDEFER_UPWARD_HEADER
