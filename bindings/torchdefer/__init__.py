"""torchdefer: deferred model initialization for PyTorch.

Build a model of any size without allocating it, then materialize it in place, whole or as this
rank's shard, with the weights its own initialization would have given::

    import torch, torchdefer
    torch.manual_seed(0)
    model = torchdefer.deferred_init(MyModel, cfg)     # no storage, every op recorded
    torchdefer.materialize_module(model)               # bitwise what MyModel(cfg) would give

The C++ library does the work (torchdefer._C); this package adapts it to Python modules.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import torch

from torchdefer import _C
from torchdefer._C import Shard
from torchdefer._trunc_normal import recordable_trunc_normal

__all__ = [
    "Shard",
    "deferred_init",
    "explain",
    "fake_mode",
    "is_deferred",
    "is_fake",
    "materialize_module",
    "materialize_tensor",
    "shard_info",
]

DeviceLike = Union[str, torch.device, None]


def _device(device: DeviceLike) -> Optional[torch.device]:
    return None if device is None else torch.device(device)


def is_fake(tensor: torch.Tensor) -> bool:
    """True if ``tensor`` is a fake: shape, dtype and device but no storage."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"torchdefer.is_fake expects a torch.Tensor, got {type(tensor).__name__}")
    return _C.is_fake(tensor)


def explain(tensor: torch.Tensor) -> str:
    """The recorded operations that will produce ``tensor``, in order, on one line."""
    return _C.explain(tensor)


def shard_info(tensor: torch.Tensor) -> Optional[Dict[str, Any]]:
    """For a tensor materialized as a shard: its global shape, its box and whether it is padded."""
    return _C.shard_info(tensor)


@contextlib.contextmanager
def _no_cuda_lazy_init() -> Iterator[None]:
    """torch's Python factories call torch.cuda._lazy_init() for a CUDA device before the
    dispatcher sees the call (only torch's own Python FakeTensorMode skips it). Where CUDA is not
    available at all, fakes on CUDA would fail there; while recording or faking, the call does
    nothing instead. Where CUDA is available it initializes as usual."""
    if torch.cuda.is_available():
        yield
        return
    original = torch.cuda._lazy_init
    torch.cuda._lazy_init = lambda: None
    try:
        yield
    finally:
        torch.cuda._lazy_init = original


@contextlib.contextmanager
def fake_mode(device: DeviceLike = None) -> Iterator[None]:
    """While active, every factory returns a fake tensor (on ``device`` if a factory names none).

    Nothing is recorded: fakes from ``fake_mode`` can be inspected and run forward, not
    materialized. Use :func:`deferred_init` for that. A CUDA ``device`` works without a GPU;
    where CUDA is available, torch's Python factories still initialize it.
    """
    # Python factories always pass a device (torch's default device), so the default that
    # FakeMode sets for C++ callers is set here through torch's own device context too.
    with _no_cuda_lazy_init(), _C._FakeMode(_device(device)):
        with torch.device(device or torch.get_default_device()):
            yield


def deferred_init(module_cls_or_callable: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Calls ``module_cls_or_callable(*args, **kwargs)`` with every tensor fake and every operation
    on them recorded, and returns its result (typically an ``nn.Module`` with fake parameters).
    """
    if not callable(module_cls_or_callable):
        raise TypeError(
            "torchdefer.deferred_init expects an nn.Module class or a callable, got "
            f"{type(module_cls_or_callable).__name__}"
        )
    name = getattr(module_cls_or_callable, "__qualname__", repr(module_cls_or_callable))
    with _no_cuda_lazy_init(), recordable_trunc_normal(), _C._RecordingScope(name):
        return module_cls_or_callable(*args, **kwargs)


def _named_tensors(
    module: torch.nn.Module, check_fn: Optional[Callable[[torch.nn.Module], bool]], buffers_only: bool
) -> List[Tuple[str, torch.Tensor, bool]]:
    entries: List[Tuple[str, torch.Tensor, bool]] = []
    seen = set()

    def visit(m: torch.nn.Module, prefix: str, is_root: bool) -> None:
        if not is_root and check_fn is not None and not check_fn(m):
            return
        for child_name, child in m.named_children():
            visit(child, f"{prefix}{child_name}.", False)
        tensors = [] if buffers_only else [(n, p, True) for n, p in m.named_parameters(recurse=False)]
        tensors += [(n, b, False) for n, b in m.named_buffers(recurse=False)]
        for local_name, tensor, is_parameter in tensors:
            if tensor is None or id(tensor) in seen or not _C.is_fake(tensor):
                continue
            seen.add(id(tensor))
            entries.append((prefix + local_name, tensor, is_parameter))

    visit(module, "", True)
    return entries


def materialize_module(
    module: torch.nn.Module,
    *,
    device: DeviceLike = None,
    shard: Optional[Shard] = None,
    rng: Optional[str] = None,
    check_fn: Optional[Callable[[torch.nn.Module], bool]] = None,
    buffers_only: bool = False,
    counter_seed: Optional[int] = None,
) -> List[Dict[str, Any]]:
    """Turns the fake parameters and buffers of ``module`` real, in place.

    Every ``nn.Parameter`` stays the same Python object (attributes and hooks survive), tied
    parameters stay tied, and tensors that are already real are never touched. ``check_fn(child)``
    returning False skips a child's subtree (as FSDP does). ``shard=Shard(rank, world_size)``
    makes each parameter this rank's slice. ``rng`` is ``"torch"`` (default without a shard: the
    values eager construction gives) or ``"counter"`` (default with a shard: the same values for
    every world size). Returns per-tensor stats. On failure nothing is half-materialized.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"torchdefer.materialize_module expects an nn.Module, got {type(module).__name__}"
        )
    entries = _named_tensors(module, check_fn, buffers_only)
    return _C.materialize_named(entries, _device(device), rng, counter_seed, shard)


def materialize_tensor(
    tensor: torch.Tensor, *, device: DeviceLike = None, rng: Optional[str] = None
) -> torch.Tensor:
    """Turns ``tensor`` real in place (the same object) and returns it."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"torchdefer.materialize_tensor expects a torch.Tensor, got {type(tensor).__name__}"
        )
    _C.materialize_named([("tensor", tensor, True)], _device(device), rng, None, None)
    return tensor


def is_deferred(module: torch.nn.Module) -> bool:
    """True if any parameter or buffer of ``module`` is still fake."""
    return any(_C.is_fake(t) for t in module.parameters()) or any(
        _C.is_fake(t) for t in module.buffers()
    )


# Two Tensor methods that cannot handle a fake as torch implements them:
#  * __repr__ reads values; a fake describes itself instead;
#  * new_tensor derives its options from the key set with c10::legacyExtractDispatchKey, which
#    does not know the Fake and DeferredInit keys; for a fake it returns a fake of the same dtype
#    and device holding a copy of `data` (under deferred_init, a recorded copy of a constant).
_original_repr = torch.Tensor.__repr__
_original_new_tensor = torch.Tensor.new_tensor


def _repr(self: torch.Tensor, *args: Any, **kwargs: Any) -> str:
    if _C.is_fake(self):
        return f"FakeTensor({_C.describe(self)}, requires_grad={self.requires_grad})"
    return _original_repr(self, *args, **kwargs)


def _new_tensor(self: torch.Tensor, data: Any, dtype=None, device=None, requires_grad=False, **kwargs):
    if not _C.is_fake(self):
        return _original_new_tensor(self, data, dtype=dtype, device=device, requires_grad=requires_grad, **kwargs)
    values = torch.tensor(data, dtype=self.dtype if dtype is None else dtype)
    with _C._FakeMode(None):
        made = torch.empty(values.shape, dtype=values.dtype, device=self.device if device is None else device)
        made.copy_(values)
    return made.requires_grad_(requires_grad)


torch.Tensor.__repr__ = _repr  # type: ignore[method-assign]
torch.Tensor.new_tensor = _new_tensor  # type: ignore[method-assign]
