// torchdefer: deferred model initialization for LibTorch. Build a model of any size without
// allocating it, then materialize exactly the part each rank needs. Include this one header.
#pragma once

#include <torchdefer/deferred_init.h>
#include <torchdefer/fake_tensor.h>
#include <torchdefer/materialize.h>
#include <torchdefer/shard.h>
#include <torchdefer/version.h>
