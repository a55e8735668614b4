"""Deferred models under PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``).

Apply ``fully_shard`` to the deferred model as you would to a meta-device model, then, where a
meta-device model would need ``to_empty()`` and a re-initialization, materialize::

    torch.manual_seed(0)                                   # the same on every rank
    model = torchdefer.deferred_init(Transformer, cfg)     # fakes, nothing allocated
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    torchdefer.distributed.materialize_fully_sharded(model)  # each rank computes its shards only

The values are the counter-mode values (``rng="counter"``): every rank's local shard holds
exactly its chunk of the tensor ``torchdefer.materialize_module(..., rng="counter")`` would give,
for any world size, so an all-gather reproduces the full model. Nothing is broadcast.

Note [FSDP2 on fakes]
~~~~~~~~~~~~~~~~~~~~~
``fully_shard`` shards each parameter itself: it takes ``torch.chunk`` of the parameter along
dim 0, allocates a zero buffer of the padded chunk size with ``new_zeros``, copies this rank's
chunk in, keeps the buffer flat (``FSDPParam._sharded_param_data``) and wraps a narrow of it in a
DTensor. On a deferred parameter these are operations on a recorded fake, so they are recorded
too, and the flat buffer is a recorded fake whose history reaches only this rank's chunk of the
parameter. Materializing that buffer whole with region replay computes just that chunk (the
rest of the buffer is the padding's zeros), the same as ``Shard(rank, world, padded=True)`` on the
parameter. The DTensor's local tensor is then pointed at the real buffer as ``fully_shard``
itself lays it out. (That local tensor cannot be materialized on its own: ``nn.Parameter`` of a
DTensor detaches it inside DTensor's ``__torch_dispatch__``, below the pre-autograd key that
records, so it is an unrecorded fake.)
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional

import torch

import torchdefer
from torchdefer import _C

__all__ = ["materialize_fully_sharded"]


def _fsdp_params(module: torch.nn.Module) -> Iterator[Any]:
    from torch.distributed.fsdp import FSDPModule

    for submodule in module.modules():
        if not isinstance(submodule, FSDPModule):
            continue
        for group in submodule._get_fsdp_state()._fsdp_param_groups:
            yield from group.fsdp_params


def _point_local_tensor_at_buffer(fsdp_param: Any) -> None:
    dim = fsdp_param.fsdp_placement.dim
    padded = fsdp_param._sharded_param_data.view(fsdp_param.padded_sharded_param_size)
    with torch.no_grad():
        local = padded.narrow(dim, 0, fsdp_param.sharded_size[dim])
    fsdp_param.sharded_param._local_tensor = local
    # Lets FSDP2 check the new local tensor against its buffer, as after to_empty().
    fsdp_param.reset_sharded_param()


def materialize_fully_sharded(
    module: torch.nn.Module,
    *,
    device: torchdefer.DeviceLike = None,
    rng: str = "counter",
    counter_seed: Optional[int] = None,
) -> List[Dict[str, Any]]:
    """Materializes a deferred module that ``fully_shard`` (FSDP2) has sharded: each parameter's
    local shard on this rank, computed alone (Note [FSDP2 on fakes]); then whatever is still
    fake (buffers, parameters FSDP2 does not manage) whole.

    ``rng="counter"`` (default) gives the full counter-mode tensor's chunk, for any world size.
    ``rng="torch"`` gives eager construction's values, at the cost of computing each parameter
    whole (one at a time) before keeping its chunk. Returns per-tensor stats as
    :func:`torchdefer.materialize_module` does; ``box`` is the local buffer's flat element
    range, padding included, and ``global_shape`` the flat buffer's. Call it once ``fully_shard``
    has been applied to every unit and before the first forward.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            "torchdefer.distributed.materialize_fully_sharded expects an nn.Module, got "
            f"{type(module).__name__}"
        )
    names = {id(p): name for name, p in module.named_parameters(remove_duplicate=False)}
    pending = [p for p in _fsdp_params(module) if _C.is_fake(p._sharded_param_data)]
    entries, regions = [], {}
    for fsdp_param in pending:
        name = names.get(id(fsdp_param.sharded_param), fsdp_param._module_info.param_name)
        entries.append((name, fsdp_param._sharded_param_data, True))
        regions[name] = ([0], [fsdp_param._sharded_param_data.numel()])
    torchdefer._check_options(None, rng, None, counter_seed)
    # One call for the local shards and everything else still fake (buffers, parameters FSDP2 does
    # not manage; no region: whole), so that a failure leaves all of it as it was.
    entries += torchdefer._named_tensors(module, None, False)
    stats = _C.materialize_named(entries, torchdefer._target_device(device), rng, counter_seed, None, regions)
    for fsdp_param in pending:
        _point_local_tensor_at_buffer(fsdp_param)
    return stats
