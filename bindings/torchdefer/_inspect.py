"""Looking at fakes without materializing them: whether a tensor or module is still fake, and what
a fake is and will be computed from."""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from torchdefer import _C, _dtensor, _module_tree


def check_tensor(function: str, tensor: Any) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"torchdefer.{function} expects a torch.Tensor, got {type(tensor).__name__}")


def is_fake(tensor: torch.Tensor) -> bool:
    """True if ``tensor`` is a fake: shape, dtype and device but no storage."""
    check_tensor("is_fake", tensor)
    return _C.is_fake(tensor)


def describe(tensor: torch.Tensor) -> str:
    """One line naming ``tensor``'s shape, dtype and device, and whether it is fake
    ("fake Float[4, 4] on cuda:0"), without reading values: works on fakes anywhere."""
    check_tensor("describe", tensor)
    return _C.describe(tensor)


def explain(tensor: torch.Tensor) -> str:
    """The recorded operations that will produce ``tensor``, in order, on one line."""
    check_tensor("explain", tensor)
    return _C.explain(tensor)


def shard_info(tensor: torch.Tensor) -> Optional[Dict[str, Any]]:
    """For a tensor materialized as a shard: a dict with its ``global_shape``, its ``box``
    (``(start, stop)`` per dimension) and whether it is ``padded``; None for any other tensor."""
    check_tensor("shard_info", tensor)
    return _C.shard_info(tensor)


def is_deferred(module: torch.nn.Module) -> bool:
    """True if any tensor of ``module`` is still fake: a parameter, a buffer, or a tensor held as a
    plain attribute (also in lists, tuples and dicts) of it or of a descendant."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"torchdefer.is_deferred expects an nn.Module, got {type(module).__name__}")
    return any(
        _C.is_fake(data) or _C._is_neither_real_nor_fake(data)
        for data in (_dtensor.local_of(t) for _, t, _ in _module_tree.tree_tensors(module))
    )
