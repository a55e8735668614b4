// The control for upward_include.cpp: a layer's own internal header compiles with that layer's
// include folders, so a failure of the upward probe is the missing header and nothing else.
#include TORCHDEFER_OWN_HEADER
