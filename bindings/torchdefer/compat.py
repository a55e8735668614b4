"""torchdistX compatibility: ``import torchdistx`` resolves to torchdefer after :func:`install`.

:func:`install` registers ``torchdistx``, ``torchdistx.deferred_init`` and ``torchdistx.fake``,
which provide every public name of torchdistX's two deferred-initialization modules with its
behaviour, backed by torchdefer. Code written for torchdistX runs unchanged, and so does PyTorch's
FullyShardedDataParallel (FSDP1), which has materialized torchdistX's fakes since PyTorch 1.12:
each FSDP unit materializes its own part as it wraps, bottom-up, with
``torchdistx.deferred_init.materialize_module(module, check_fn=...)``, where ``check_fn`` stops at
modules FSDP has already wrapped or ignores::

    import torchdefer.compat
    torchdefer.compat.install()            # before or after importing torch.distributed.fsdp

    model = torchdefer.deferred_init(MyModel, cfg)
    fsdp_model = FSDP(model, auto_wrap_policy=policy)   # each unit materialized as it is wrapped

Where torchdefer deliberately differs from torchdistX (it materializes in place, records the ops
run on fakes after ``deferred_init`` returned, refuses to "materialize" a fake that nothing
recorded), docs/torchdistx.md lists it.

Note [FSDP imports torchdistX once]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``torch.distributed.fsdp._init_utils`` runs ``from torchdistx import deferred_init, fake`` when it
is first imported and keeps the result in module globals (``_TORCHDISTX_AVAIL``,
``deferred_init``, ``fake``), which it reads when FSDP wraps a module. Registering modules in
``sys.modules`` alone therefore only helps if that happens before torch.distributed.fsdp is
imported. :func:`install` does both: it registers the modules for imports still to come, and, if
FSDP is already imported, sets those three globals, so the order of imports does not matter. A
real torchdistX that is already imported is left alone unless ``replace=True``.

Note [A package that imports like one]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Libraries ask whether torchdistX is there with ``importlib.util.find_spec("torchdistx")``
(``transformers.utils.is_torchdistx_available()`` does), which for a module already in
``sys.modules`` returns its ``__spec__`` and raises if that is None. So each registered module has
a spec, the package one with an empty search path: its submodules are the two registered ones.
torchdistX's other parts (its optimizers, SlowMo, gossip gradient and communication hooks) are
not torchdefer's to provide; a finder at the end of ``sys.meta_path`` answers an import of any
other ``torchdistx.*`` name with an ImportError that says so, instead of the bare "No module
named" that would leave the user guessing which torchdistX is installed. It is a plain
ImportError, not ModuleNotFoundError, because ``from torchdistx import optimizers`` swallows
the latter and reports only "cannot import name".
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Callable, Dict, Iterator, Optional, Union

import torch

from torchdefer import _C, _deferred_init, _dtensor, _heap, _inspect, _materialize, _module_tree, _recording
from torchdefer._build_info import VERSION
from torchdefer._options import Options

__all__ = ["install", "is_installed"]

# The torchdistX API these modules provide (its main branch, after 0.2.0: fake_cuda and
# is_deferred), then who provides it.
TORCHDISTX_VERSION = f"0.3.0.dev0+torchdefer.{VERSION}"

_FSDP_INIT_UTILS = "torch.distributed.fsdp._init_utils"


# --- torchdistx.deferred_init ------------------------------------------------------------------


def deferred_init(module_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """torchdistX's ``deferred_init``: calls ``module_fn(*args, **kwargs)`` with every tensor fake
    and every operation on them recorded (:func:`torchdefer.deferred_init`)."""
    return _deferred_init.deferred_init(module_fn, *args, **kwargs)


def is_deferred(obj: Union[torch.Tensor, torch.nn.Module]) -> bool:
    """torchdistX's ``is_deferred``: for a tensor, whether it is a fake that deferred_init
    recorded and materializing will make real; for a module, whether any of its parameters,
    buffers or tensor attributes (Note [Walking a module] in torchdefer/_module_tree.py) is one."""
    if isinstance(obj, torch.Tensor):
        return _C.can_materialize(obj)
    if isinstance(obj, torch.nn.Module):
        tensors = _module_tree.tree_tensors(obj)
        return any(_C.can_materialize(_dtensor.local_of(t)) for _, t, _ in tensors)
    raise ValueError(
        "torchdistx.deferred_init.is_deferred expects a torch.Tensor or an nn.Module, got "
        f"{type(obj).__name__}"
    )


def materialize_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """torchdistX's ``materialize_tensor``: returns ``tensor`` real. torchdefer makes the same
    object real (in place), so the result is ``tensor`` itself, as it already is for a real one."""
    return _materialize.materialize_tensor(tensor)


def materialize_module(
    module: torch.nn.Module,
    buffers_only: bool = False,
    check_fn: Optional[Callable[[torch.nn.Module], bool]] = None,
) -> None:
    """torchdistX's ``materialize_module``: materializes the tensors of every module in the tree
    for which ``check_fn(module)`` is true (all without ``check_fn``), the root included, children
    before their parent; with ``buffers_only`` the buffers only. ``check_fn`` decides for each
    module's own tensors, not for its subtree: the children of a rejected module are still
    visited. In torch RNG mode (eager's values), in place, and all or nothing: if materializing
    fails, every tensor is as it was."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"torchdistx.deferred_init.materialize_module expects an nn.Module, got "
            f"{type(module).__name__}"
        )
    # Each call is an FSDP1 unit: what the previous one freed goes back to the system first
    # (Note [FSDP1 units and the heap]).
    _materialize.materialize(
        module,
        Options(check_fn=check_fn, check_fn_per_module=True, buffers_only=buffers_only),
        who="torchdistx.deferred_init.materialize_module",
        before=_heap.return_free_memory,
        dtensors=False,
    )


# --- torchdistx.fake ---------------------------------------------------------------------------


@contextlib.contextmanager
def fake_mode(*, fake_cuda: bool = False) -> Iterator[None]:
    """torchdistX's ``fake_mode``: every tensor created inside is a fake (nothing is recorded).

    Where CUDA is unavailable, a CUDA factory fails as it does outside the mode (torch's own
    error) unless ``fake_cuda=True``, which allows fake CUDA tensors without CUDA; where CUDA is
    available, ``fake_cuda`` changes nothing. Either way factories keep their default device.
    """
    if fake_cuda or torch.cuda.is_available():
        with _deferred_init.fake_mode():
            yield
        return
    # torchdefer's own mode lets fakes be CUDA tensors without CUDA; this one leaves torch's
    # CUDA initialization check in place, so that CUDA factories raise as in torchdistX.
    with _recording.FakeTensorFunctions(skip_cuda_init=False), _C._FakeMode(None):
        yield


def meta_like(fake: torch.Tensor) -> torch.Tensor:
    """torchdistX's ``meta_like``: a new meta tensor with the sizes, strides, storage offset and
    dtype of the fake ``fake``, outside the autograd graph (as ``detach()`` is). Raises
    ValueError if ``fake`` is not a fake."""
    if not isinstance(fake, torch.Tensor) or not _C.is_fake(fake):
        what = _C.describe(fake) if isinstance(fake, torch.Tensor) else type(fake).__name__
        raise ValueError(f"torchdistx.fake.meta_like expects a fake tensor, got {what}")
    # A meta storage just large enough for the fake's elements at its offset and strides.
    extent = 1 + sum((size - 1) * stride for size, stride in zip(fake.shape, fake.stride()))
    elements = fake.storage_offset() + (extent if fake.numel() > 0 else 0)
    storage = torch.empty(elements, dtype=fake.dtype, device="meta")
    return storage.as_strided(fake.shape, fake.stride(), fake.storage_offset())


# --- the modules -------------------------------------------------------------------------------


class _NotProvided(importlib.abc.MetaPathFinder):
    """Answers imports of torchdistX's parts that torchdefer does not provide (Note [A package
    that imports like one])."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if not fullname.startswith("torchdistx.") or not is_installed():
            return None
        raise ImportError(
            f"{fullname} is not provided by torchdefer: torchdefer.compat.install() made "
            "`torchdistx` resolve to torchdefer, which provides torchdistx.deferred_init and "
            "torchdistx.fake only. For torchdistX's other parts (optimizers, slowmo, gossip_grad, "
            "comm hooks) install torchdistX itself and do not call torchdefer.compat.install().",
            name=fullname,
        )


_NOT_PROVIDED = _NotProvided()


def _module(name: str, doc: str, names: Dict[str, Any], is_package: bool = False) -> types.ModuleType:
    module = types.ModuleType(name, doc)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=is_package)
    attributes = dict(names, __all__=sorted(n for n in names if not n.startswith("_")))
    if is_package:
        attributes["__path__"] = module.__spec__.submodule_search_locations
    vars(module).update(attributes)
    return module


def _build_modules() -> types.ModuleType:
    deferred = _module(
        "torchdistx.deferred_init",
        "torchdistX's deferred initialization, provided by torchdefer.compat.",
        {
            "deferred_init": deferred_init,
            "is_deferred": is_deferred,
            "materialize_module": materialize_module,
            "materialize_tensor": materialize_tensor,
        },
    )
    fake = _module(
        "torchdistx.fake",
        "torchdistX's fake tensors, provided by torchdefer.compat.",
        {
            # torchdistX's is_fake is torchdefer's: whether deferred_init or fake_mode made it.
            "fake_mode": fake_mode,
            "is_fake": _inspect.is_fake,
            "meta_like": meta_like,
        },
    )
    package = _module(
        "torchdistx",
        "torchdistX's API, provided by torchdefer.compat.",
        {"deferred_init": deferred, "fake": fake, "__version__": TORCHDISTX_VERSION, "__torchdefer__": True},
        is_package=True,
    )
    return package


def is_installed() -> bool:
    """True if ``torchdistx`` resolves to torchdefer's modules."""
    return getattr(sys.modules.get("torchdistx"), "__torchdefer__", False)


def install(*, replace: bool = False) -> None:
    """Makes ``torchdistx``, ``torchdistx.deferred_init`` and ``torchdistx.fake`` resolve to
    torchdefer, for imports to come and for an FSDP that is already imported (Note [FSDP imports
    torchdistX once]). Idempotent. Raises if a real torchdistX is already imported, unless
    ``replace``."""
    existing = sys.modules.get("torchdistx")
    if existing is not None and not getattr(existing, "__torchdefer__", False) and not replace:
        raise RuntimeError(
            "torchdefer.compat.install: a real torchdistx is already imported; pass replace=True "
            "to have FSDP use torchdefer instead"
        )
    package = existing if existing is not None and is_installed() else _build_modules()
    sys.modules["torchdistx"] = package
    sys.modules["torchdistx.deferred_init"] = package.deferred_init
    sys.modules["torchdistx.fake"] = package.fake
    if _NOT_PROVIDED not in sys.meta_path:
        sys.meta_path.append(_NOT_PROVIDED)

    init_utils = sys.modules.get(_FSDP_INIT_UTILS)
    if init_utils is not None:
        vars(init_utils).update(deferred_init=package.deferred_init, fake=package.fake, _TORCHDISTX_AVAIL=True)
