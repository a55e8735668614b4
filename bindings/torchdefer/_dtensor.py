"""DTensor parameters of a deferred model: each rank computes exactly its local tensor.

The one module that touches private attributes of DTensor (``_local_tensor``, ``_StridedShard``)
and FSDP2 (``FSDPParam``'s sharded buffer); ``_check_torch`` guards them with a version check.

Note [DTensor parameters of a deferred model]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``parallelize_module``, ``distribute_tensor`` and ``fully_shard`` replace a deferred parameter by
a DTensor whose local tensor is a fake made inside DTensor's ``__torch_dispatch__``, below the key
that records: an unrecorded fake, which nothing can materialize. What can be materialized is the
parameter the model recorded, the *global* tensor. So ``deferred_init`` remembers, for every
module of its result, the fakes it holds as parameters and buffers (``remember_own``), and
materializing a DTensor named ``name`` of a module computes that module's remembered ``name`` by
region replay over the box this rank holds (``local_box``): the DTensor's placements applied to
its global shape at this rank's mesh coordinate. The result becomes the DTensor's local tensor
(for FSDP2, is copied into FSDP2's padded buffer, which the local tensor views). A replicated
DTensor computes the whole tensor; a sharded one never does.

Only what the modules held when deferred_init returned is remembered: a parameter or buffer set
after it returned (``m.c = nn.Parameter(m.b.weight.t() + 1)``, ``register_buffer`` of a computed
fake) is recorded, but the DTensor that replaces it leaves no path back to it, since nothing of
torchdefer runs between the assignment and ``fully_shard`` (learning it would take a hook on
every module's ``__setattr__``, in every thread). Materializing such a DTensor is refused with a
message that names it, says it was set after deferred_init returned, and says to set it inside
the function deferred_init runs, where it is remembered like the rest.

Note [Counter mode for a module with DTensors]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
In counter mode an element's value depends only on the recording and the element's global index,
so every rank's box of a tensor holds the same values as that box of the single-process model.
Torch mode draws in sequence from one generator, which a box cannot reproduce without computing
the whole tensor. So a module holding DTensors materializes in counter mode by default, and every
tensor of it, plain replicated ones (norms, embeddings left whole, buffers) included, in the same
call: every rank and every layout then agrees with ``materialize_module(model, rng="counter")``
in one process.

Note [A DTensor's box]
~~~~~~~~~~~~~~~~~~~~~~
Placements apply left to right over the mesh dimensions. ``Shard(d)`` keeps this rank's
``torch.chunk`` piece of what is left of dim ``d`` (chunks of ceil(n / size); trailing ranks may
get fewer or none). ``_StridedShard(d, split_factor=f)``, which FSDP2 over tensor parallelism
produces, splits what is left into ``f`` pieces, each piece into ``size`` chunks, and keeps this
rank's chunk of every piece. We follow each dimension's global indices as a list of ranges through
these steps; the engine computes boxes, so the indices a rank ends with must be one range
(chunking a chunk, as FSDP2 over tensor parallelism does, always is). The box's shape must equal
the DTensor's local shape, which catches a placement we would read differently from PyTorch.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from torchdefer import _C, _module_tree

# (start, stop) ranges of global indices along one dimension, in the local tensor's order.
Ranges = List[Tuple[int, int]]

_MIN_TORCH = (2, 6)  # the DTensor and FSDP2 attributes read here exist from 2.6 on

# For every module of a deferred_init result: {parameter or buffer name: the fake it held}.
_remembered: "_module_tree.WeakModuleMap[Dict[str, torch.Tensor]]" = _module_tree.WeakModuleMap()


def remember_own(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """Remembers the fakes ``module`` itself holds as parameters and buffers; returns them."""
    fakes = _own_fakes(module)
    if fakes:
        _remembered[module] = fakes
    return fakes


def forget_settled(module: torch.nn.Module) -> None:
    """Forgets the remembered tensors of ``module``'s tree that are real now, so that a tensor the
    module later lets go of (``load_state_dict(assign=True)``) is not kept alive here, and the
    fakes a module no longer holds, nor a DTensor in their place (``to_empty`` after deferred_init
    returned replaced them): kept here, they would keep their recording alive, which a
    materialization that leaves none of its fakes pays the generator for (Note [Samplers nothing
    keeps])."""
    for submodule in _module_tree.modules(module):
        fakes = _remembered.get(submodule)
        if fakes is None:
            continue
        settled = [name for name, t in fakes.items()
                   if not _C.is_fake(t) or _replaced(submodule, name, t)]
        for name in settled:
            del fakes[name]
        if not fakes:
            del _remembered[submodule]


def _replaced(module: torch.nn.Module, name: str, fake: torch.Tensor) -> bool:
    held = module._parameters.get(name, module._buffers.get(name))
    return held is not fake and not _is_deferred_dtensor(held)


def _own_fakes(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    fakes = {}
    for own in (module._parameters, module._buffers):
        for name, t in own.items():
            if t is not None and _C.is_fake(t):
                fakes[name] = t
    return fakes


def _dtensor_class() -> Optional[type]:
    """DTensor, or None while nothing has imported it (then no DTensor exists, and importing it
    here would only cost time)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def _is_deferred_dtensor(t: Any) -> bool:
    dtensor = _dtensor_class()
    return dtensor is not None and isinstance(t, dtensor) and _C.is_fake(t._local_tensor)


def local_of(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding ``t``'s values: a DTensor's local tensor, else ``t``."""
    dtensor = _dtensor_class()
    return t._local_tensor if dtensor is not None and isinstance(t, dtensor) else t


def holds_deferred_dtensors(module: torch.nn.Module) -> bool:
    """True if a parameter or buffer of ``module``'s tree is a DTensor with a fake local tensor."""
    return _dtensor_class() is not None and any(_is_deferred_dtensor(t) for _, _, t in _owned(module))


def _owned(module: torch.nn.Module) -> Iterator[Tuple[str, torch.nn.Module, torch.Tensor]]:
    for prefix, submodule in _module_tree.named_modules(module, remove_duplicate=False):
        for tensors in (submodule._parameters, submodule._buffers):
            for name, t in tensors.items():
                if t is not None:
                    yield (f"{prefix}.{name}" if prefix else name), submodule, t


def _check_torch() -> None:
    version = tuple(int(part) for part in torch.__version__.split(".")[:2])
    if version < _MIN_TORCH:
        raise RuntimeError(
            f"torchdefer: DTensor and FSDP2 parameters need torch >= {_MIN_TORCH[0]}.{_MIN_TORCH[1]}, "
            f"and torch {torch.__version__} is installed; upgrade torch"
        )


def _private(what: str, read):
    """``read()``, or an error saying which private PyTorch attribute this torch lacks."""
    try:
        return read()
    except AttributeError as error:
        raise RuntimeError(
            f"torchdefer: torch {torch.__version__} has no {what} ({error}), which torchdefer reads "
            "to materialize DTensor and FSDP2 parameters (bindings/torchdefer/_dtensor.py); this "
            "torch version is not supported for them"
        ) from error


# --- The box a rank holds (Note [A DTensor's box]) ----------------------------------------------


def _take(ranges: Ranges, lo: int, hi: int) -> Ranges:
    """Positions [lo, hi) of the indices ``ranges`` list, in order."""
    out: Ranges = []
    seen = 0
    for start, stop in ranges:
        a, b = max(lo, seen), min(hi, seen + stop - start)
        if a < b:
            out.append((start + a - seen, start + b - seen))
        seen += stop - start
    return out


def _chunk(ranges: Ranges, pieces: int, index: int) -> Ranges:
    """Piece ``index`` of ``pieces`` of the indices, with torch.chunk's sizes."""
    length = sum(stop - start for start, stop in ranges)
    size = -(-length // pieces)
    return _take(ranges, index * size, (index + 1) * size)


def _strided_chunk(ranges: Ranges, split_factor: int, pieces: int, index: int) -> Ranges:
    out: Ranges = []
    for piece in range(split_factor):
        out.extend(_chunk(_chunk(ranges, split_factor, piece), pieces, index))
    return out


def local_box(
    name: str,
    global_shape: Sequence[int],
    mesh_shape: Sequence[int],
    coordinate: Sequence[int],
    placements: Sequence[Any],
) -> Optional[Tuple[List[int], List[int]]]:
    """This rank's ``(start, stop)`` box of a DTensor named ``name``, or None if it is replicated
    (Note [A DTensor's box])."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    strided = _private("torch.distributed.tensor.placement_types._StridedShard", _strided_shard_class)
    indices: List[Ranges] = [[(0, size)] for size in global_shape]
    sharded = False
    for mesh_dim, placement in enumerate(placements):
        pieces, index = mesh_shape[mesh_dim], coordinate[mesh_dim]
        if isinstance(placement, Replicate):
            continue
        if isinstance(placement, Partial):
            raise ValueError(
                f"torchdefer: {name} is a DTensor with a Partial placement, which holds no part of "
                "a recorded tensor; parameters and buffers are Shard or Replicate"
            )
        if isinstance(placement, strided):
            dim = placement.dim
            indices[dim] = _strided_chunk(indices[dim], int(placement.split_factor), pieces, index)
        elif isinstance(placement, Shard):
            dim = placement.dim
            indices[dim] = _chunk(indices[dim], pieces, index)
        else:
            raise ValueError(f"torchdefer: {name} has a placement torchdefer does not know: {placement!r}")
        sharded = True
    if not sharded:
        return None
    start, stop = [], []
    for dim, ranges in enumerate(indices):
        merged = _merge(ranges)
        if len(merged) > 1:
            raise ValueError(
                f"torchdefer: {name}'s placements {tuple(placements)} give this rank the indices "
                f"{merged} of dim {dim}, not one range; torchdefer computes one box per tensor"
            )
        first, last = merged[0] if merged else (global_shape[dim], global_shape[dim])
        start.append(first)
        stop.append(last)
    return start, stop


def _strided_shard_class():
    from torch.distributed.tensor import placement_types

    return placement_types._StridedShard


def _merge(ranges: Ranges) -> Ranges:
    merged: Ranges = []
    for start, stop in ranges:
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    return merged


# --- FSDP2 -------------------------------------------------------------------------------------


def _param_groups(state: Any) -> List[Any]:
    """The FSDPParamGroups of one fully_shard call: a list in torch 2.13, at most one group
    (``_fsdp_param_group``, None when it manages no parameter) in 2.11."""
    if hasattr(state, "_fsdp_param_groups"):
        return list(state._fsdp_param_groups)
    group = state._fsdp_param_group
    return [] if group is None else [group]


def _fsdp_params(module: torch.nn.Module) -> Dict[int, Any]:
    """FSDP2's FSDPParam of every parameter ``fully_shard`` manages in ``module``'s tree, by the
    id of its DTensor."""
    from torch.distributed.fsdp import FSDPModule

    found = {}
    for submodule in _module_tree.modules(module):
        if not isinstance(submodule, FSDPModule):
            continue
        groups = _private("FSDPModule._get_fsdp_state()._fsdp_param_groups",
                          lambda: _param_groups(submodule._get_fsdp_state()))
        for group in groups:
            for fsdp_param in group.fsdp_params:
                found[id(fsdp_param.sharded_param)] = fsdp_param
    return found


def _into_fsdp_buffer(fsdp_param: Any, local: torch.Tensor) -> None:
    """Makes ``local`` the buffer fully_shard keeps for its sharded parameter (copied into a
    padded one when the shard is uneven) and points the DTensor's local tensor at it."""

    def write() -> None:
        dim = fsdp_param.fsdp_placement.dim
        if local.shape == fsdp_param.padded_sharded_param_size and local.is_contiguous():
            padded = local  # an even shard: no padding, so no copy
        else:
            padded = local.new_zeros(fsdp_param.padded_sharded_param_size)
            with torch.no_grad():
                padded.narrow(dim, 0, local.size(dim)).copy_(local)
        narrowed = padded.narrow(dim, 0, fsdp_param.sharded_size[dim])
        fsdp_param._sharded_param_data = padded.view(-1)
        fsdp_param.sharded_param._local_tensor = narrowed
        # Lets FSDP2 check the new local tensor against its buffer, as after to_empty().
        fsdp_param.reset_sharded_param()

    _private("an FSDPParam attribute", write)


# --- Materialization ---------------------------------------------------------------------------


class _Target:
    """A DTensor to materialize: the remembered global fake and this rank's box of it."""

    def __init__(self, name: str, dtensor: Any, global_fake: torch.Tensor, box) -> None:
        self.name, self.dtensor, self.global_fake, self.box = name, dtensor, global_fake, box


def _targets(module: torch.nn.Module) -> List[_Target]:
    by_dtensor: Dict[int, _Target] = {}
    by_global: Dict[int, _Target] = {}
    for name, owner, t in _owned(module):
        if not _is_deferred_dtensor(t):
            continue
        attribute = name.rsplit(".", 1)[-1]
        global_fake = _remembered.get(owner, {}).get(attribute)
        if global_fake is None or not _C.is_fake(global_fake):
            raise RuntimeError(
                f"torchdefer: {name} is a DTensor whose local tensor is fake, but no fake recorded "
                f"as {name} is known. torchdefer knows the parameters and buffers each module held "
                f"when deferred_init returned, by name, and {name} was not one of them: it was set "
                "after deferred_init returned (a parameter or buffer computed from the deferred "
                "model), renamed, or taken from another module. Set it inside the function "
                "deferred_init runs (torchdefer.deferred_init(lambda: setup(Model()))), then "
                "distribute it (parallelize_module, fully_shard, distribute_tensor) under that name"
            )
        known = by_dtensor.get(id(t))
        if known is not None:
            if known.global_fake is not global_fake:
                raise RuntimeError(
                    f"torchdefer: {known.name} and {name} are one DTensor but were different "
                    "tensors when recorded; tie them inside deferred_init"
                )
            continue
        _check_global(name, t, global_fake)
        coordinate = t.device_mesh.get_coordinate()
        if coordinate is None:
            raise RuntimeError(f"torchdefer: this rank is not in the device mesh of {name}")
        box = local_box(name, t.shape, t.device_mesh.shape, coordinate, t.placements)
        local_shape = list(t._local_tensor.shape)
        if box is not None and [b - a for a, b in zip(*box)] != local_shape:
            raise RuntimeError(
                f"torchdefer: {name}'s box {box} of {list(t.shape)} under {tuple(t.placements)} "
                f"does not have its local shape {local_shape}: a placement torchdefer reads "
                f"differently from torch {torch.__version__}"
            )
        shared = by_global.get(id(global_fake))
        if shared is not None and shared.box != box:
            raise RuntimeError(
                f"torchdefer: {shared.name} and {name} were one tensor when recorded and are now "
                "DTensors holding different parts of it on this rank; keep them tied"
            )
        target = _Target(name, t, global_fake, box)
        by_dtensor[id(t)] = target
        by_global.setdefault(id(global_fake), target)
    return list(by_dtensor.values())


def _check_global(name: str, dtensor: Any, global_fake: torch.Tensor) -> None:
    if tuple(global_fake.shape) != tuple(dtensor.shape) or global_fake.dtype != dtensor.dtype:
        raise RuntimeError(
            f"torchdefer: {name} was recorded as {_C.describe(global_fake)} but is now a DTensor of "
            f"{list(dtensor.shape)} {dtensor.dtype}; distribute the recorded tensor itself"
        )


Boxes = Dict[str, Tuple[List[int], List[int]]]
# run(entries, regions, module_entries) -> stats: ``_materialize.py``'s one call of the C++
# orchestrator, all or nothing; ``module_entries`` are what a checkpoint's checks see.
Run = Callable[[List[_module_tree.Entry], Boxes, List[_module_tree.Entry]], List[Dict[str, Any]]]


def materialize(module: torch.nn.Module, run: Run) -> List[Dict[str, Any]]:
    """Materializes ``module``, whose tree holds DTensors with fake local tensors, with ``run``:
    each DTensor's local tensor on this rank alone (Note [DTensor parameters of a deferred
    model]), and every other fake whole, in one all-or-nothing call."""
    _check_torch()
    targets = _targets(module)
    fsdp = _fsdp_params(module)
    entries: List[_module_tree.Entry] = []
    regions: Boxes = {}
    listed = set()
    for target in targets:
        if id(target.global_fake) in listed:
            continue
        listed.add(id(target.global_fake))
        entries.append((target.name, target.global_fake, isinstance(target.dtensor, torch.nn.Parameter)))
        if target.box is not None:
            regions[target.name] = target.box
    entries += _module_tree.to_materialize(_module_tree.tree_tensors(module))
    # A checkpoint's checks see each DTensor as the global tensor it was recorded as, under every name.
    names = {t.name for t in targets}
    module_entries = [
        (t.name, t.global_fake, isinstance(t.dtensor, torch.nn.Parameter)) for t in targets
    ] + [e for e in entries if e[0] not in names]
    stats = run(entries, regions, module_entries)
    # Each computed global is this rank's part alone and becomes the local tensor (for FSDP2, its
    # buffer; an uneven shard is copied into a padded one). Every other reference to it (the
    # entries, the remembered fakes, the target) is dropped first.
    del entries, module_entries
    for submodule in _module_tree.modules(module):
        _remembered.pop(submodule, None)
    while targets:
        target = targets.pop()
        local = target.global_fake.detach().to(target.dtensor._local_tensor.device)
        target.global_fake = None
        fsdp_param = fsdp.get(id(target.dtensor))
        if fsdp_param is not None:
            _into_fsdp_buffer(fsdp_param, local)
        else:
            target.dtensor._local_tensor = local
    return stats
