"""Deferred models under torch.distributed's DTensor layouts: FSDP2 (``fully_shard``), tensor
parallelism (``parallelize_module``), ``distribute_tensor``, and their combinations on 1-D to
3-D device meshes.

Apply the layout to the deferred model as you would to a meta-device model, then, where a
meta-device model would need ``to_empty()`` and a re-initialization, materialize::

    torch.manual_seed(0)                                   # the same on every rank
    model = torchdefer.deferred_init(Transformer, cfg)     # fakes, nothing allocated
    parallelize_module(model, mesh["tp"], plan)            # optional
    for block in model.layers:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    torchdefer.materialize_module(model)                   # each rank computes its local tensors

``torchdefer.materialize_module`` sees the DTensors and does this; ``materialize_fully_sharded``
is the same call under the name it had when only FSDP2 was supported. The values are the
counter-mode values: every rank's local tensor holds exactly its part of the tensor
``torchdefer.materialize_module(..., rng="counter")`` gives in one process, for any mesh and
placements, so an all-gather reproduces the full model. Nothing is broadcast. How: Note [DTensor
parameters of a deferred model] in ``torchdefer/_dtensor.py``; the one materialization
they share, in ``torchdefer/_materialize.py``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from torchdefer import _materialize
from torchdefer._options import DeviceLike, Options

__all__ = ["materialize_fully_sharded"]


def materialize_fully_sharded(
    module: torch.nn.Module,
    *,
    device: DeviceLike = None,
    rng: str = "counter",
    counter_seed: Optional[int] = None,
) -> List[Dict[str, Any]]:
    """Materializes a deferred module whose parameters are DTensors (``fully_shard``,
    ``parallelize_module``, ``distribute_tensor``): each DTensor's local tensor on this rank,
    computed alone by region replay; then whatever is still fake (buffers, parameters left plain)
    whole, in the same all-or-nothing call.

    ``rng="counter"`` (default) gives each local tensor's part of the full counter-mode tensor,
    for any layout. ``rng="torch"`` gives eager construction's values, at the cost of computing
    each randomly initialized tensor whole (one at a time) before keeping its part. Returns
    per-tensor stats as :func:`torchdefer.materialize_module` does; ``box`` is the part of the
    global tensor this rank holds. Call it once every layout has been applied and before the
    first forward.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            "torchdefer.distributed.materialize_fully_sharded expects an nn.Module, got "
            f"{type(module).__name__}"
        )
    options = Options(device=device, rng=rng, counter_seed=counter_seed)
    return _materialize.materialize(module, options, dtensors=True)
