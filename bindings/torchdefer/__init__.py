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

Functions: deferred_init (and the block form ``with deferred():``), materialize_module, materialize_tensor, is_fake, is_deferred,
describe, explain, shard_info, fake_mode; the shard spec Shard. Importing the package changes
nothing in torch (Note [What recording changes, and where] in torchdefer/_recording.py). The C++ library does the work
(torchdefer._C); this package adapts it to Python modules. Guide: docs/python.md.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import torch

from torchdefer._build_info import TORCH_VERSION as _BUILT_FOR_TORCH
from torchdefer._build_info import VERSION as __version__

if torch.__version__.split("+")[0] != _BUILT_FOR_TORCH:
    raise ImportError(
        f"torchdefer was compiled against torch {_BUILT_FOR_TORCH}, but torch {torch.__version__} "
        "is installed; their C++ ABIs differ. Rebuild torchdefer against this torch: "
        "`pip install --no-build-isolation .` in its checkout (docs/python.md)."
    )

from torchdefer import _C  # noqa: E402  (after the check: a mismatched _C may not even load)
from torchdefer._C import Shard
from torchdefer import _after_return, _checkpoint, _dtensor, _generator_state, _guard
from torchdefer import _recording, _returned
from torchdefer._context import deferred

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


def _target_device(device: DeviceLike) -> Optional[torch.device]:
    """The device to materialize on: a real one. Meta tensors hold no values, so materializing
    there would spend the recording and give nothing."""
    target = _device(device)
    if target is not None and target.type == "meta":
        raise ValueError(
            'torchdefer: cannot materialize on device="meta": a meta tensor has no values, and '
            "materializing consumes the recording, so the values would be lost. Materialize on a "
            "real device, or keep the fakes (they already have every shape, dtype and stride)"
        )
    return target


def _check_tensor(function: str, tensor: Any) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"torchdefer.{function} expects a torch.Tensor, got {type(tensor).__name__}")


def is_fake(tensor: torch.Tensor) -> bool:
    """True if ``tensor`` is a fake: shape, dtype and device but no storage."""
    _check_tensor("is_fake", tensor)
    return _C.is_fake(tensor)


def describe(tensor: torch.Tensor) -> str:
    """One line naming ``tensor``'s shape, dtype and device, and whether it is fake
    ("fake Float[4, 4] on cuda:0"), without reading values: works on fakes anywhere."""
    _check_tensor("describe", tensor)
    return _C.describe(tensor)


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
def fake_mode(device: DeviceLike = None) -> Iterator[None]:
    """While active, every factory returns a fake tensor (on ``device`` if a factory names none).

    Nothing is recorded: fakes from ``fake_mode`` can be inspected and run forward, not
    materialized. Use :func:`deferred_init` for that. A CUDA ``device`` works without a GPU;
    where CUDA is available, torch's Python factories still initialize it.
    """
    # Python factories always pass a device (torch's default device), so the default that
    # FakeMode sets for C++ callers is set here through torch's own device context too.
    with _recording.mode(), _C._FakeMode(_device(device)):
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
    inference_tensors_before = _C._inference_tensors_made()
    with _recording.mode(), _generator_state.settled_on_access(), \
            _C._RecordingScope(name, exact_generator):
        result = module_cls_or_callable(*args, **kwargs)
    if _C._inference_tensors_made() != inference_tensors_before:
        _refuse_inference_tensors(result, name)
    # Guarded, remembered for DTensors, handed out: Note [One walk over a returned module].
    _returned.settle(result)
    return result


def _refuse_inference_tensors(result: Any, name: str) -> None:
    """Note [Inference mode while recording] (recording.cpp): a parameter or buffer that eager
    made as an inference tensor would materialize as an ordinary one."""
    if not isinstance(result, torch.nn.Module):
        return  # materialization refuses it, naming it
    for tensor_name, t in itertools.chain(result.named_parameters(), result.named_buffers()):
        if _C.is_fake(t) and _C._made_in_inference_mode(t):
            _C._refuse_inference_tensor(f"{tensor_name} of {name}")


# Note [Walking a module]
# ~~~~~~~~~~~~~~~~~~~~~~~
# materialize_module and is_deferred see every tensor reachable from the module's tree: its
# parameters and buffers, and the tensors held as plain attributes (`self.inv_freq = ...`,
# `self.pos = torch.arange(n)`), also inside lists, tuples and dicts. Plain attributes are not
# parameters: a shard keeps them whole, as it keeps buffers, and buffers_only materializes them.
# Parameters and buffers are collected over the whole tree first, so that a parameter also held
# as another module's attribute keeps its parameter name and is sharded. Children come before
# their parent (the order stats are reported in). The walk is iterative on purpose: a nested
# recursive closure is a reference cycle (the function and its cell) that would keep the list,
# and so every materialized tensor, alive until the cyclic collector ran.

_MODULE_INTERNALS = frozenset({"_parameters", "_buffers", "_modules"})


def _modules_children_first(
    module: torch.nn.Module, check_fn: Optional[Callable[[torch.nn.Module], bool]]
) -> List[Tuple[str, torch.nn.Module]]:
    """(prefix, module) for ``module`` and every descendant ``check_fn`` does not skip, children
    before their parent."""
    parents_first: List[Tuple[str, torch.nn.Module]] = []
    pending = [("", module, True)]
    while pending:
        prefix, m, is_root = pending.pop()
        if not is_root and check_fn is not None and not check_fn(m):
            continue
        parents_first.append((prefix, m))
        pending.extend((f"{prefix}{name}.", child, False) for name, child in m.named_children())
    parents_first.reverse()
    return parents_first


def _attribute_tensors(name: str, value: Any, out: List[Tuple[str, torch.Tensor, bool]], seen: set) -> None:
    """Appends the tensors in ``value`` (a tensor, or lists, tuples and dicts of them, nested)."""
    pending = [(name, value)]
    while pending:
        name, value = pending.pop()
        if isinstance(value, torch.Tensor):
            out.append((name, value, False))
        elif isinstance(value, (list, tuple, dict)) and id(value) not in seen:
            seen.add(id(value))
            items = value.items() if isinstance(value, dict) else enumerate(value)
            pending.extend(reversed([(f"{name}[{key!r}]", item) for key, item in items]))


def _module_tensors(
    module: torch.nn.Module, check_fn: Optional[Callable[[torch.nn.Module], bool]], buffers_only: bool
) -> List[Tuple[str, torch.Tensor, bool]]:
    """Every (name, tensor, is_parameter) reachable from ``module`` (Note [Walking a module])."""
    modules = _modules_children_first(module, check_fn)
    owned: List[Tuple[str, torch.Tensor, bool]] = []
    held: List[Tuple[str, torch.Tensor, bool]] = []
    containers: set = set()
    for prefix, m in modules:
        if not buffers_only:
            owned.extend((prefix + n, p, True) for n, p in m.named_parameters(recurse=False))
        owned.extend((prefix + n, b, False) for n, b in m.named_buffers(recurse=False))
        for attribute, value in vars(m).items():
            if attribute not in _MODULE_INTERNALS:
                _attribute_tensors(prefix + attribute, value, held, containers)
    return owned + held


def _check_not_a_husk(name: str, tensor: torch.Tensor) -> None:
    """Refuses a real tensor that was given a fake's metadata with ``.data = fake`` outside
    deferred_init and fake_mode (inside them the assignment itself is refused)."""
    if _C._is_neither_real_nor_fake(tensor):
        raise RuntimeError(
            f"torchdefer: {name} is neither real nor fake: it was a real tensor, and `.data = fake` "
            f"gave it the fake's metadata ({_C.describe(tensor)}) without making it a fake, so it "
            "can be neither read nor materialized. Assign `nn.Parameter(fake)` (or register the fake "
            "itself) instead of setting `.data` of a real tensor."
        )


def _named_tensors(
    module: torch.nn.Module,
    check_fn: Optional[Callable[[torch.nn.Module], bool]],
    buffers_only: bool,
    real: bool = False,
) -> List[Tuple[str, torch.Tensor, bool]]:
    """The tensors of ``module`` to materialize, each once, by the first name found: the fakes,
    and with ``real`` also the real ones, which the C++ side shards (Note [Real tensors of a
    sharded module]) or loads from a checkpoint (Note [Loading a tensor real at record time])."""
    entries: List[Tuple[str, torch.Tensor, bool]] = []
    seen = set()
    for name, tensor, is_parameter in _module_tensors(module, check_fn, buffers_only):
        fake = _C.is_fake(tensor)
        if not fake:
            _check_not_a_husk(name, tensor)
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        if fake or real:
            entries.append((name, tensor, is_parameter))
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
    checkpoint: Optional[_checkpoint.Checkpoint] = None,
    strict: bool = True,
    checkpoint_prefix: str = "",
) -> List[Dict[str, Any]]:
    """Turns the fake parameters, buffers and tensor attributes of ``module`` real, in place.

    Every ``nn.Parameter`` stays the same Python object (attributes and hooks survive), tied
    parameters stay tied, and tensors that are already real are never touched (so calling it
    again does nothing). ``device`` overrides the device each fake reports. ``check_fn(child)``
    returning False skips a child's subtree (as FSDP does). ``shard=Shard(rank, world_size)``
    makes each parameter this rank's slice, one that was real at record time (built from Python
    numbers or read values) included: it is sliced in place and reported with ``fallback``
    "real at record time"; buffers and tensor attributes stay whole. ``rng`` is ``"torch"``
    (default without a shard: the
    values eager construction gives) or ``"counter"`` (default with a shard: the same values for
    every world size), ``counter_seed`` the counter mode's seed (by default derived from the
    seed at recording). ``buffers_only`` leaves parameters fake. ``progress=True`` shows a tqdm
    bar (or a line on stderr without tqdm); a callable gets ``(done, total, name)`` after each
    replayed op (each tensor when sharding).

    ``checkpoint`` (a ``.safetensors`` file, a directory ``save_pretrained`` or
    ``torch.distributed.checkpoint`` wrote, or a mapping of names to tensors) supplies tensors by
    qualified name, read (only this rank's box when sharding), cast to the recorded dtype and
    placed on the target device; the rest is initialized as without it. ``strict=False`` ignores
    checkpoint names that match no parameter or buffer; tensors the checkpoint lacks are
    initialized either way. ``checkpoint_prefix`` is prepended to the module's names (a child
    materialized on its own). See docs/checkpoints.md.

    Returns one dict per materialized tensor: ``name``, ``global_shape``, ``box`` (the shard's
    ``(start, stop)``, or None), ``sliced``, ``fallback``, ``bytes_computed``, ``bytes_kept``,
    ``source`` (``"checkpoint"`` or ``"init"``).
    Raises TypeError/ValueError for bad arguments, RuntimeError naming the tensor or op when
    materializing fails; then (or if ``check_fn`` or ``progress`` raises) every tensor is as it
    was: nothing is half-materialized.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"torchdefer.materialize_module expects an nn.Module, got {type(module).__name__}"
        )
    loading: Dict[str, Any] = {}
    if checkpoint is not None:
        loading = dict(
            checkpoint=_checkpoint.open_checkpoint(checkpoint),
            strict=bool(strict),
            checkpoint_prefix=checkpoint_prefix,
        )
    if _dtensor.holds_deferred_dtensors(module):
        stats = _dtensor.materialize_module(
            module, device, shard, rng, check_fn, buffers_only, counter_seed, progress, loading
        )
        _forget_what_is_real(module)
        return stats
    _check_options(shard, rng, check_fn, counter_seed, progress)
    target = _target_device(device)
    _dtensor.forget_settled(module)
    entries = _named_tensors(module, check_fn, buffers_only, real=shard is not None or bool(loading))
    stats: List[Dict[str, Any]] = []
    if entries:
        if loading:
            loading["module_entries"] = _checkpoint.module_entries(module, _module_tensors)
        with _progress_callback(progress, "tensor" if shard is not None else "op") as callback:
            stats = _after_return.materialize_named(
                entries, target, rng, counter_seed, shard, progress=callback, **loading
            )
    _forget_what_is_real(module)
    return stats


def _forget_what_is_real(module: torch.nn.Module) -> None:
    """Drops what the package keeps about ``module``'s fakes once they are real: the forward check
    (Note [Forgetting to materialize]) and the fakes remembered for DTensor layouts, which would
    otherwise keep tensors alive that FSDP or the user let go of."""
    _guard.release(module)
    _dtensor.forget_settled(module)


def materialize_tensor(
    tensor: torch.Tensor, *, device: DeviceLike = None, rng: Optional[str] = None
) -> torch.Tensor:
    """Turns ``tensor`` real in place (the same object) and returns it; a real tensor is
    returned untouched. ``device`` and ``rng`` are as for :func:`materialize_module`."""
    _check_tensor("materialize_tensor", tensor)
    _check_options(None, rng, None, None)
    _after_return.materialize_named([("tensor", tensor, True)], _target_device(device), rng, None, None)
    return tensor


def is_deferred(module: torch.nn.Module) -> bool:
    """True if any tensor of ``module`` is still fake: a parameter, a buffer, or a tensor held as a
    plain attribute (also in lists, tuples and dicts) of it or of a descendant."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"torchdefer.is_deferred expects an nn.Module, got {type(module).__name__}")
    return any(
        _C.is_fake(data) or _C._is_neither_real_nor_fake(data)
        for data in (_data_of(t) for _, t, _ in _module_tensors(module, None, False))
    )


def _data_of(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding ``t``'s values: a DTensor's local shard (FSDP2, tensor parallel), else ``t``."""
    return _dtensor.local_of(t)
