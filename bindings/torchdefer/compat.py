"""torchdistX compatibility: lets PyTorch's FSDP materialize torchdefer models unchanged.

FullyShardedDataParallel (FSDP1) has supported torchdistX's deferred initialization since
PyTorch 1.12. When a module's parameters are torchdistX fakes, each FSDP unit materializes its own
part as it wraps, bottom-up, with
``torchdistx.deferred_init.materialize_module(module, check_fn=...)``, where ``check_fn`` stops at
children FSDP has already wrapped. :func:`install` provides those modules, backed by torchdefer::

    import torchdefer.compat
    torchdefer.compat.install()            # before or after importing torch.distributed.fsdp

    model = torchdefer.deferred_init(MyModel, cfg)
    fsdp_model = FSDP(model, auto_wrap_policy=policy)   # each unit materialized as it is wrapped

Note [FSDP imports torchdistX once]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``torch.distributed.fsdp._init_utils`` runs ``from torchdistx import deferred_init, fake`` when it
is first imported and keeps the result in module globals (``_TORCHDISTX_AVAIL``,
``deferred_init``, ``fake``), which it reads when FSDP wraps a module. Registering modules in
``sys.modules`` alone therefore only helps if that happens before torch.distributed.fsdp is
imported. :func:`install` does both: it registers ``torchdistx``, ``torchdistx.deferred_init`` and
``torchdistx.fake`` for imports still to come, and, if FSDP is already imported, sets those three
globals, so the order of imports does not matter. A real torchdistX that is already imported is
left alone unless ``replace=True``.
"""

from __future__ import annotations

import sys
import types
from typing import Callable, Optional

import torch

import torchdefer
from torchdefer import _heap

__all__ = ["install", "is_installed"]

_FSDP_INIT_UTILS = "torch.distributed.fsdp._init_utils"


def _materialize_module(
    module: torch.nn.Module,
    buffers_only: bool = False,
    check_fn: Optional[Callable[[torch.nn.Module], bool]] = None,
) -> None:
    """torchdistX's ``materialize_module``: materializes ``module`` in place, in torch RNG mode,
    so the values are the ones eager construction gives.

    One difference from torchdistX: ``check_fn(child) == False`` skips the child's whole subtree
    (torchdistX skipped the child's own tensors but visited its children). FSDP's ``check_fn``
    rejects already-wrapped units and ignored modules, whose subtrees FSDP manages itself, so
    both readings agree there.
    """
    _heap.return_free_memory()  # what the previous unit freed (Note [FSDP1 units and the heap])
    torchdefer.materialize_module(module, buffers_only=buffers_only, check_fn=check_fn)


def _materialize_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """torchdistX's ``materialize_tensor``; torchdefer turns the same object real."""
    return torchdefer.materialize_tensor(tensor)


def _fake_mode(*, fake_cuda: bool = False):
    """torchdistX's ``fake_mode``: fakes on CUDA if ``fake_cuda``, else where factories ask."""
    return torchdefer.fake_mode("cuda" if fake_cuda else None)


def _build_modules() -> types.ModuleType:
    package = types.ModuleType("torchdistx", "torchdistX's API, provided by torchdefer.compat.")
    package.__path__ = []  # a package, so that `import torchdistx.fake` resolves in sys.modules

    deferred_init = types.ModuleType("torchdistx.deferred_init")
    deferred_init.deferred_init = torchdefer.deferred_init
    deferred_init.is_deferred = torchdefer.is_deferred
    deferred_init.materialize_module = _materialize_module
    deferred_init.materialize_tensor = _materialize_tensor

    fake = types.ModuleType("torchdistx.fake")
    fake.is_fake = torchdefer.is_fake
    fake.fake_mode = _fake_mode

    package.deferred_init = deferred_init
    package.fake = fake
    package.__torchdefer__ = True
    return package


def is_installed() -> bool:
    """True if ``torchdistx`` resolves to torchdefer's modules."""
    return getattr(sys.modules.get("torchdistx"), "__torchdefer__", False)


def install(*, replace: bool = False) -> None:
    """Makes ``torchdistx.deferred_init`` and ``torchdistx.fake`` resolve to torchdefer, for
    imports to come and for an FSDP that is already imported (Note [FSDP imports torchdistX
    once]). Idempotent. Raises if a real torchdistX is already imported, unless ``replace``."""
    existing = sys.modules.get("torchdistx")
    if existing is not None and not getattr(existing, "__torchdefer__", False) and not replace:
        raise RuntimeError(
            "torchdefer.compat.install: a real torchdistx is already imported; pass replace=True "
            "to have FSDP use torchdefer instead"
        )
    package = existing if is_installed() else _build_modules()
    sys.modules["torchdistx"] = package
    sys.modules["torchdistx.deferred_init"] = package.deferred_init
    sys.modules["torchdistx.fake"] = package.fake

    init_utils = sys.modules.get(_FSDP_INIT_UTILS)
    if init_utils is not None:
        init_utils.deferred_init = package.deferred_init
        init_utils.fake = package.fake
        init_utils._TORCHDISTX_AVAIL = True
