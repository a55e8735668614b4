"""torchdefer: deferred model initialization for PyTorch.

Build a model of any size without allocating it, then materialize it in place, whole or as this
rank's shard, with the weights its own initialization would have given.

Quick start::

    import torch, torchdefer

    torch.manual_seed(0)
    model = torchdefer.deferred_init(torch.nn.TransformerEncoderLayer, 1024, 16)
    torchdefer.is_fake(model.linear1.weight)     # True: shape, dtype, device, no storage
    print(torchdefer.explain(model.linear1.weight))  # the recorded ops that will produce it
    torchdefer.materialize_module(model, progress=True)
    # model now holds bit for bit what torch.nn.TransformerEncoderLayer(1024, 16) gives
    # after torch.manual_seed(0), in the same nn.Parameter objects.

One rank's shard (every rank records the same program from the same seed)::

    stats = torchdefer.materialize_module(model, shard=torchdefer.Shard(rank, world_size))

Functions: deferred_init (and the block form ``with deferred():``), materialize_module,
materialize_tensor, is_fake, is_deferred, describe, explain, shard_info, fake_mode; the shard spec
Shard. Importing the package changes nothing in torch (Note [What recording changes, and where] in
torchdefer/_recording.py). The C++ library does the work (torchdefer._C); this package adapts it
to Python modules, one private module per concept (docs/design.md, "Python package layout").
Guide: docs/python.md.
"""

from __future__ import annotations

import torch

from torchdefer._build_info import TORCH_VERSION as _BUILT_FOR_TORCH
from torchdefer._build_info import VERSION as __version__  # noqa: F401 (the package's version)

if torch.__version__.split("+")[0] != _BUILT_FOR_TORCH:
    raise ImportError(
        f"torchdefer was compiled against torch {_BUILT_FOR_TORCH}, but torch {torch.__version__} "
        "is installed; their C++ ABIs differ. Rebuild torchdefer against this torch: "
        "`pip install .` in its checkout (docs/python.md)."
    )

# After the check: a mismatched _C may not even load.
from torchdefer._C import Shard  # noqa: E402
from torchdefer._deferred_init import deferred, deferred_init, fake_mode  # noqa: E402
from torchdefer._inspect import describe, explain, is_deferred, is_fake, shard_info  # noqa: E402
from torchdefer._materialize import materialize_module, materialize_tensor  # noqa: E402
from torchdefer._options import DeviceLike as DeviceLike  # noqa: E402
from torchdefer._options import ProgressFn as ProgressFn  # noqa: E402

__all__ = [
    "Shard",
    "deferred",
    "deferred_init",
    "describe",
    "explain",
    "fake_mode",
    "is_deferred",
    "is_fake",
    "materialize_module",
    "materialize_tensor",
    "shard_info",
]
