"""The forward guard: running a deferred module before materializing it fails at once.

A module returned by :func:`torchdefer.deferred_init` whose tensors are still fake raises when it
is called, naming the module that holds the fakes and the call to make, instead of recording the
forward silently (ops on recorded fakes are recorded) or failing deep inside FSDP's lazy init.

Note [Forgetting to materialize]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The check is a forward pre-hook that torch runs for every module call, registered with
``torch.nn.modules.module.register_module_forward_pre_hook`` only while a guarded module exists,
and removed when none does. It is process-wide rather than per module because of FSDP2:
``fully_shard`` registers its own pre-forward hook with ``prepend=True`` after deferred_init
returned, and that hook runs the root's lazy init, which reads the (fake) shard's storage. Torch
runs global pre-hooks before any module's own, so a global one is the only hook that always
comes first. FSDP1 runs its lazy init inside the wrapper's ``forward``, so a call of an FSDP1
wrapper is checked as a call of the module it wraps.

Nothing is registered at import (tests/python/test_torch_untouched.py). deferred_init records
every submodule of the module it returns, with its qualified name, in a weak table. A call of a
module in the table checks the tensors of its subtree (parameters, buffers, tensor attributes,
the local tensor of a DTensor): if one is fake it raises; if none is, the module and its subtree
leave the table, so each module is checked at most once after it turned real. ``materialize_module``
takes the module it materialized out of the table when all of it is real, and the hook goes when
the table is empty (at once, or at the next module call once the garbage collector emptied it).
A forward under :func:`torchdefer.fake_mode` (or inside deferred_init, as constructors that run a
forward to infer shapes do) is a forward on fakes on purpose and is let through.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
from torch.utils.hooks import RemovableHandle

from torchdefer import _C, _dtensor, _module_tree, _recording

# module -> its qualified name in the module deferred_init returned ("" for that module itself).
_guarded: "_module_tree.WeakModuleMap[str]" = _module_tree.WeakModuleMap()
_handle: Optional[RemovableHandle] = None


def guard_named(named: List[Tuple[str, torch.nn.Module]]) -> None:
    """Guards the modules of a tree walked by ``_module_tree.named_modules``, under those names."""
    global _handle
    for name, module in named:
        _guarded.setdefault(module, name)
    if _handle is None:
        _handle = torch.nn.modules.module.register_module_forward_pre_hook(_check_before_forward)


def release(module: torch.nn.Module) -> None:
    """Forgets ``module`` and its subtree if every tensor in it is real (after materialize_module;
    a DTensor's local shard counts, which materialize_module may not have reached)."""
    if not _guarded or _holders(module, ""):
        return
    _forget(module)


def _forget(module: torch.nn.Module) -> None:
    for submodule in _module_tree.modules(module):
        _guarded.pop(submodule, None)
    _remove_hook_if_unused()


def _remove_hook_if_unused() -> None:
    global _handle
    if _handle is not None and not _guarded:
        _handle.remove()
        _handle = None


def _guarded_module(module: torch.nn.Module) -> Tuple[Optional[str], bool]:
    """The name under which ``module`` is guarded (None if it is not), and whether it is an FSDP1
    wrapper, which stands for the module it wraps (its subtree holds the flat parameters)."""
    name = _guarded.get(module)
    if name is not None:
        return name, False
    wrapped = getattr(module, "_fsdp_wrapped_module", None)
    if isinstance(wrapped, torch.nn.Module):
        return _guarded.get(wrapped), True
    return None, False


def _is_fake(tensor: torch.Tensor) -> bool:
    data = _dtensor.local_of(tensor)  # a DTensor's local shard (FSDP2, tensor parallel)
    return _C.is_fake(data) or _C._is_neither_real_nor_fake(data)


def _own_fakes(module: torch.nn.Module) -> List[str]:
    """The names, in ``module``, of its own fake tensors (not its children's): parameters, buffers
    and the attributes that hold one (Note [Walking a module])."""
    names: List[str] = []
    for name, tensor, _ in _module_tree.tensors([("", module)]):
        attribute = name.split("[", 1)[0]  # an attribute's list, tuple or dict by the attribute
        if _is_fake(tensor) and attribute not in names:
            names.append(attribute)
    return names


def _holders(module: torch.nn.Module, name: str) -> List[Tuple[str, str, List[str]]]:
    """(qualified name, class name, fake tensor names) of each module in ``module``'s subtree that
    holds fakes. Names leave out FSDP1's wrapper level, as the model's own state dict does."""
    holders = []
    for prefix, submodule in _module_tree.named_modules(module):
        fakes = _own_fakes(submodule)
        if fakes:
            parts = (name, *prefix.split("."))
            qualified = ".".join(p for p in parts if p and p != "_fsdp_wrapped_module")
            holders.append((qualified, type(submodule).__name__, fakes))
    return holders


def _forward_on_fakes_on_purpose() -> bool:
    return _recording.innermost() is not None


def _materialize_call(module: torch.nn.Module, fsdp1: bool) -> str:
    if fsdp1:
        return "torchdefer.compat.install() before FSDP(model) (FSDP then materializes each unit)"
    return "torchdefer.materialize_module(model)"


def _check_before_forward(module: torch.nn.Module, args: Any) -> None:
    if not _guarded:
        _remove_hook_if_unused()
        return
    name, fsdp1 = _guarded_module(module)
    if name is None or _forward_on_fakes_on_purpose():
        return
    holders = _holders(module, name)
    if not holders:
        _forget(module)
        return
    where, kind, fakes = holders[0]
    more = f" (and {len(holders) - 1} more modules)" if len(holders) > 1 else ""
    label = f"module '{where}'" if where else "the module deferred_init returned"
    raise RuntimeError(
        f"torchdefer: {label} ({kind}) still holds deferred tensors ({', '.join(fakes)}){more}, so "
        f"{type(module).__name__}.forward would run on fakes: call {_materialize_call(module, fsdp1)} "
        "before forward (or run the forward under torchdefer.fake_mode() to get fakes on purpose)"
    )
