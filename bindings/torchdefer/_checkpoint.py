"""Checkpoints for ``materialize_module(module, checkpoint=...)``: what each kind of source is
opened as (docs/checkpoints.md).

Note [Checkpoint sources]
~~~~~~~~~~~~~~~~~~~~~~~~~
Every source becomes one C++ CheckpointReader (api/include/torchdefer/materialize.h): the names
and global shapes and dtypes of the tensors it holds, and a read of any box of any of them into a
destination tensor that the C++ orchestrator allocates (this rank's shard, the recorded dtype,
the target device) and commits with everything else, all or nothing. A region layout (a
DTensor's placements, given to materialize_module as a box per name) reads that box and nothing
else, the same way as a Shard's box.

- safetensors (a file, an index, a save_pretrained directory) is read by the C++ reader with
  pread, only the bytes of the box (Note [Reading a box of a safetensors tensor]).
- a torch.distributed.checkpoint directory is read in one ``dcp.load`` for all the boxes of a
  call, with a load planner asking for exactly those boxes and a storage reader that reads only
  their bytes of each stored chunk (Note [Reading boxes of a DCP checkpoint] in _dcp.py).
- a mapping of names to tensors is sliced and copied.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Tuple

import torch

from torchdefer import _C, _dcp, _module_tree

_DCP_METADATA = ".metadata"


def open_checkpoint(checkpoint: Any) -> Any:
    """The C++ reader for ``checkpoint`` (Note [Checkpoint sources])."""
    if isinstance(checkpoint, Mapping):
        return _mapping_reader(checkpoint)
    if not isinstance(checkpoint, (str, os.PathLike)):
        raise TypeError(
            "torchdefer: checkpoint must be a path (a .safetensors file, a directory save_pretrained "
            "or torch.distributed.checkpoint wrote) or a mapping of names to tensors, got "
            f"{type(checkpoint).__name__}"
        )
    path = os.fspath(checkpoint)
    if not os.path.exists(path):
        raise FileNotFoundError(f"torchdefer: the checkpoint {path!r} does not exist")
    if os.path.isdir(path) and os.path.exists(os.path.join(path, _DCP_METADATA)):
        return _dcp.dcp_reader(path, _C._python_checkpoint)
    return _C._open_safetensors(path)


def _box(tensor: torch.Tensor, start: List[int], stop: List[int]) -> torch.Tensor:
    return tensor[tuple(slice(a, b) for a, b in zip(start, stop))]


def _mapping_reader(mapping: Mapping[str, Any]) -> Any:
    tensors: Dict[str, Tuple[List[int], torch.dtype]] = {}
    for name, value in mapping.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise TypeError(
                f"torchdefer: a checkpoint mapping maps names (str) to tensors; {name!r} maps to "
                f"{type(value).__name__}"
            )
        if _C.is_fake(value) or value.is_meta:
            raise ValueError(f"torchdefer: the checkpoint's {name!r} is {_C.describe(value)}: it has no values")
        tensors[name] = (list(value.shape), value.dtype)

    def read(name: str, start: List[int], stop: List[int], out: torch.Tensor) -> None:
        with torch.no_grad():
            out.copy_(_box(mapping[name], start, stop))

    return _C._python_checkpoint(tensors, read)


def module_entries(module: torch.nn.Module) -> List[Tuple[str, torch.Tensor, bool]]:
    """Every tensor of ``module`` under every name it has (tied ones, real ones and those a
    check_fn skips included), for the checks (Note [Checking a checkpoint first] in
    api/src/checkpoint_plan.cpp): its parameters, its buffers, then what Note [Walking a module]
    finds that is not a parameter."""
    entries = _module_tree.parameters_and_buffers(module, remove_duplicate=False)
    entries += [e for e in _module_tree.tree_tensors(module) if not e[2]]
    return entries
