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

Functions: deferred_init, materialize_module, materialize_tensor, is_fake, is_deferred,
explain, shard_info, fake_mode; the shard spec Shard. The C++ library does the work
(torchdefer._C); this package adapts it to Python modules. Guide: docs/python.md.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import torch

from torchdefer._build_info import TORCH_VERSION as _BUILT_FOR_TORCH

if torch.__version__.split("+")[0] != _BUILT_FOR_TORCH:
    raise ImportError(
        f"torchdefer was compiled against torch {_BUILT_FOR_TORCH}, but torch {torch.__version__} "
        "is installed; their C++ ABIs differ. Rebuild torchdefer against this torch: "
        "`pip install --no-build-isolation .` in its checkout (docs/python.md)."
    )

from torchdefer import _C  # noqa: E402  (after the check: a mismatched _C may not even load)
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
# Called after each step of a materialization as progress(done, total, name) (Note [Progress] in
# replay/include/torchdefer/materialize.h): `name` is the replayed op, or the tensor when sharding.
ProgressFn = Callable[[int, int, str], None]


def _device(device: DeviceLike) -> Optional[torch.device]:
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"torchdefer: device must be a str or torch.device such as \"cpu\" or \"cuda:0\", "
            f"got {type(device).__name__}"
        )
    return torch.device(device)


def _check_tensor(function: str, tensor: Any) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"torchdefer.{function} expects a torch.Tensor, got {type(tensor).__name__}")


def is_fake(tensor: torch.Tensor) -> bool:
    """True if ``tensor`` is a fake: shape, dtype and device but no storage."""
    _check_tensor("is_fake", tensor)
    return _C.is_fake(tensor)


def explain(tensor: torch.Tensor) -> str:
    """The recorded operations that will produce ``tensor``, in order, on one line."""
    _check_tensor("explain", tensor)
    return _C.explain(tensor)


def shard_info(tensor: torch.Tensor) -> Optional[Dict[str, Any]]:
    """For a tensor materialized as a shard: a dict with its ``global_shape``, its ``box``
    (``(start, stop)`` per dimension) and whether it is ``padded``; None for any other tensor."""
    _check_tensor("shard_info", tensor)
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


def deferred_init(
    module_cls_or_callable: Callable[..., Any],
    *args: Any,
    exact_generator: bool = False,
    **kwargs: Any,
) -> Any:
    """Calls ``module_cls_or_callable(*args, **kwargs)`` with every tensor fake and every operation
    on them recorded, and returns its result (typically an ``nn.Module`` with fake parameters).

    Random ops whose number of draws depends on their values (``nn.init.trunc_normal_``) are not
    computed while recording, so the default generator is left owed until the first torch-mode
    materialization settles it where eager leaves it (a warning names them if it was drawn from
    before that). ``exact_generator=True`` computes them when recording ends, at eager's cost for
    those ops, and leaves the generator exact at once.
    """
    if not callable(module_cls_or_callable):
        raise TypeError(
            "torchdefer.deferred_init expects an nn.Module class or a callable, got "
            f"{type(module_cls_or_callable).__name__}"
        )
    name = getattr(module_cls_or_callable, "__qualname__", repr(module_cls_or_callable))
    with _no_cuda_lazy_init(), recordable_trunc_normal(), _C._RecordingScope(name, exact_generator):
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
            if id(tensor) in seen or not _C.is_fake(tensor):
                continue
            seen.add(id(tensor))
            entries.append((prefix + local_name, tensor, is_parameter))

    visit(module, "", True)
    return entries


@contextlib.contextmanager
def _progress_callback(progress: Union[bool, ProgressFn, None], unit: str) -> Iterator[Optional[ProgressFn]]:
    """The callback for ``progress``: None for None/False, the callable itself, or for True a
    tqdm bar (a line on stderr at most once a second where tqdm is not installed)."""
    if progress is None or progress is False:
        yield None
        return
    if progress is not True:
        yield progress
        return
    try:
        from tqdm.auto import tqdm
    except ImportError:
        yield _stderr_progress(unit)
        return
    bar = tqdm(desc="materializing", unit=unit)

    def update(done: int, total: int, name: str) -> None:
        if bar.total != total:
            bar.reset(total=total)
        bar.set_postfix_str(name, refresh=False)
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        bar.close()


def _stderr_progress(unit: str) -> ProgressFn:
    last = [0.0]

    def report(done: int, total: int, name: str) -> None:
        now = time.monotonic()
        if done != total and now - last[0] < 1.0:
            return
        last[0] = now
        print(f"torchdefer: materialized {done}/{total} {unit}s ({name})", file=sys.stderr, flush=True)

    return report


def _check_options(
    shard: Optional[Shard],
    rng: Optional[str],
    check_fn: Any,
    counter_seed: Optional[int],
    progress: Union[bool, ProgressFn, None] = None,
) -> None:
    if not isinstance(progress, bool) and progress is not None and not callable(progress):
        raise TypeError(
            "torchdefer: progress must be True, False, None or a callable(done, total, name), "
            f"got {type(progress).__name__}"
        )
    if shard is not None and not isinstance(shard, Shard):
        raise TypeError(
            f"torchdefer: shard must be a torchdefer.Shard(rank, world_size), got {type(shard).__name__}"
        )
    if rng is not None and rng not in ("torch", "counter"):
        raise ValueError(f'torchdefer: rng must be "torch" or "counter", got {rng!r}')
    if check_fn is not None and not callable(check_fn):
        raise TypeError(
            f"torchdefer: check_fn must be a callable(module) -> bool, got {type(check_fn).__name__}"
        )
    if counter_seed is None:
        return
    if isinstance(counter_seed, bool) or not isinstance(counter_seed, int):
        raise TypeError(f"torchdefer: counter_seed must be an int in [0, 2**64), got {counter_seed!r}")
    if not 0 <= counter_seed < 2**64:
        raise ValueError(f"torchdefer: counter_seed must be an int in [0, 2**64), got {counter_seed!r}")
    if rng == "torch" or (rng is None and shard is None):
        raise ValueError(
            "torchdefer: counter_seed only applies to the counter RNG mode, and this call uses torch "
            'mode; pass rng="counter" (or a shard, which defaults to it), or drop counter_seed'
        )


def materialize_module(
    module: torch.nn.Module,
    *,
    device: DeviceLike = None,
    shard: Optional[Shard] = None,
    rng: Optional[str] = None,
    check_fn: Optional[Callable[[torch.nn.Module], bool]] = None,
    buffers_only: bool = False,
    counter_seed: Optional[int] = None,
    progress: Union[bool, ProgressFn, None] = None,
) -> List[Dict[str, Any]]:
    """Turns the fake parameters and buffers of ``module`` real, in place.

    Every ``nn.Parameter`` stays the same Python object (attributes and hooks survive), tied
    parameters stay tied, and tensors that are already real are never touched (so calling it
    again does nothing). ``device`` overrides the device each fake reports. ``check_fn(child)``
    returning False skips a child's subtree (as FSDP does). ``shard=Shard(rank, world_size)``
    makes each parameter this rank's slice. ``rng`` is ``"torch"`` (default without a shard: the
    values eager construction gives) or ``"counter"`` (default with a shard: the same values for
    every world size), ``counter_seed`` the counter mode's seed (by default derived from the
    seed at recording). ``buffers_only`` leaves parameters fake. ``progress=True`` shows a tqdm
    bar (or a line on stderr without tqdm); a callable gets ``(done, total, name)`` after each
    replayed op (each tensor when sharding).

    Returns one dict per materialized tensor: ``name``, ``global_shape``, ``box`` (the shard's
    ``(start, stop)``, or None), ``sliced``, ``fallback``, ``bytes_computed``, ``bytes_kept``.
    Raises TypeError/ValueError for bad arguments, RuntimeError naming the tensor or op when
    materializing fails; then (or if ``check_fn`` or ``progress`` raises) every tensor is as it
    was: nothing is half-materialized.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"torchdefer.materialize_module expects an nn.Module, got {type(module).__name__}"
        )
    _check_options(shard, rng, check_fn, counter_seed, progress)
    target = _device(device)
    entries = _named_tensors(module, check_fn, buffers_only)
    if not entries:
        return []
    with _progress_callback(progress, "tensor" if shard is not None else "op") as callback:
        return _C.materialize_named(entries, target, rng, counter_seed, shard, progress=callback)


def materialize_tensor(
    tensor: torch.Tensor, *, device: DeviceLike = None, rng: Optional[str] = None
) -> torch.Tensor:
    """Turns ``tensor`` real in place (the same object) and returns it; a real tensor is
    returned untouched. ``device`` and ``rng`` are as for :func:`materialize_module`."""
    _check_tensor("materialize_tensor", tensor)
    _check_options(None, rng, None, None)
    _C.materialize_named([("tensor", tensor, True)], _device(device), rng, None, None)
    return tensor


def is_deferred(module: torch.nn.Module) -> bool:
    """True if any parameter or buffer of ``module`` is still fake."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"torchdefer.is_deferred expects an nn.Module, got {type(module).__name__}")
    return any(_C.is_fake(_data_of(t)) for t in module.parameters()) or any(
        _C.is_fake(_data_of(t)) for t in module.buffers()
    )


def _data_of(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding ``t``'s values: a DTensor's local shard (FSDP2, tensor parallel), else ``t``."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


# Tensor methods that cannot handle a fake as torch implements them:
#  * __repr__ reads values; a fake describes itself instead;
#  * tolist and numpy (and so numpy.asarray, through __array__) read memory without the dispatcher;
#    inside deferred_init they read the values of the recording's fakes the way item() does, by
#    replaying them into a private copy (Note [Reading values while recording]), and refuse other
#    fakes with a message. (item, float(), int(), bool() and indexing with a tensor reach the
#    dispatcher, where the recorder answers them.)
#  * new_tensor and the legacy new() derive their options from the key set with
#    c10::legacyExtractDispatchKey, which does not know the Fake and DeferredInit keys ("DispatchKey
#    DeferredInit doesn't correspond to a device"); for a fake they return a fake of the same dtype
#    and device, holding a copy of `data` (under deferred_init, a recorded copy of a constant) or
#    uninitialized for new(*sizes). (Tensor.type() needs nothing: it reads dtype and device.)
_original_repr = torch.Tensor.__repr__
_original_new_tensor = torch.Tensor.new_tensor
_original_new = torch.Tensor.new
_original_tolist = torch.Tensor.tolist
_original_numpy = torch.Tensor.numpy


def _repr(self: torch.Tensor, *args: Any, **kwargs: Any) -> str:
    if _C.is_fake(self):
        return f"FakeTensor({_C.describe(self)}, requires_grad={self.requires_grad})"
    return _original_repr(self, *args, **kwargs)


def _tolist(self: torch.Tensor) -> Any:
    if not _C.is_fake(self):
        return _original_tolist(self)
    return _original_tolist(_C.read_values(self))


def _numpy(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    if not _C.is_fake(self):
        return _original_numpy(self, *args, **kwargs)
    # requires_grad kept, so that numpy() refuses (or, with force=True, accepts) as it does in eager.
    values = _C.read_values(self).requires_grad_(self.requires_grad)
    return _original_numpy(values, *args, **kwargs)


def _new_tensor(self: torch.Tensor, data: Any, dtype=None, device=None, requires_grad=False, **kwargs):
    if not _C.is_fake(self):
        return _original_new_tensor(self, data, dtype=dtype, device=device, requires_grad=requires_grad, **kwargs)
    values = torch.tensor(data, dtype=self.dtype if dtype is None else dtype)
    with _no_cuda_lazy_init(), _C._FakeMode(None):
        made = torch.empty(values.shape, dtype=values.dtype, device=self.device if device is None else device)
        made.copy_(values)
    return made.requires_grad_(requires_grad)


def _new(self: torch.Tensor, *args: Any, device: DeviceLike = None) -> torch.Tensor:
    if not _C.is_fake(self):
        return _original_new(self, *args, **({} if device is None else {"device": device}))
    device = self.device if device is None else device
    sizes = args[0] if len(args) == 1 and isinstance(args[0], torch.Size) else args
    if all(isinstance(size, int) for size in sizes):
        with _no_cuda_lazy_init(), _C._FakeMode(None):
            return torch.empty(tuple(sizes) if sizes else (0,), dtype=self.dtype, device=device)
    if len(args) == 1 and not isinstance(args[0], (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)):
        return _new_tensor(self, args[0], device=device)
    raise TypeError(
        "torchdefer: Tensor.new(tensor or storage) is not supported on a fake "
        f"({_C.describe(self)}); use new_tensor(data), new_empty(sizes) or the tensor itself"
    )


torch.Tensor.__repr__ = _repr  # type: ignore[method-assign]
torch.Tensor.new_tensor = _new_tensor  # type: ignore[method-assign]
torch.Tensor.new = _new  # type: ignore[method-assign]
torch.Tensor.tolist = _tolist  # type: ignore[method-assign]
torch.Tensor.numpy = _numpy  # type: ignore[method-assign]
