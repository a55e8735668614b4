"""A module tree walked, and modules remembered weakly, by identity.

torch's own walk (``named_modules``, ``modules``) and ``weakref.WeakKeyDictionary`` hash every
module, and a module class that compares by value (a dataclass module) is unhashable; deferred_init
and materialize_module accept such modules, so what they keep about modules never hashes one.
"""

from __future__ import annotations

import weakref
from typing import Dict, Generic, List, Optional, Tuple, TypeVar

import torch

V = TypeVar("V")


def named_modules(
    root: torch.nn.Module, prefix: str = "", remove_duplicate: bool = True
) -> List[Tuple[str, torch.nn.Module]]:
    """``root.named_modules(prefix=prefix, remove_duplicate=...)``, parents before children, with
    modules told apart by identity."""
    out: List[Tuple[str, torch.nn.Module]] = []
    seen = set()
    pending = [(prefix, root)]
    while pending:
        name, module = pending.pop()
        if remove_duplicate:
            if id(module) in seen:
                continue
            seen.add(id(module))
        out.append((name, module))
        children = module._modules
        if not children:
            continue
        dot = name + "." if name else ""
        pending.extend((dot + key, child) for key, child in reversed(children.items()) if child is not None)
    return out


def modules(root: torch.nn.Module) -> List[torch.nn.Module]:
    """``root.modules()``, parents before children, told apart by identity."""
    out: List[torch.nn.Module] = []
    seen = set()
    pending = [root]
    while pending:
        module = pending.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        out.append(module)
        children = module._modules
        if children:
            pending.extend(child for child in reversed(children.values()) if child is not None)
    return out


class _EntryRef(weakref.ref):
    """A weak reference to a module that carries the module's key and value in the map, so that
    an entry is one object and its removal callback is shared (no closure per module). Built by
    weakref.ref's own constructor, its slots set after: no Python __new__/__init__ runs for it
    (a map gets an entry per module deferred_init returns, 1,771 for a Hugging Face Llama-70B)."""

    __slots__ = ("key", "value")


class WeakModuleMap(Generic[V]):
    """A map from modules to values that neither hashes nor keeps its modules alive."""

    def __init__(self) -> None:
        self._entries: Dict[int, _EntryRef] = {}
        # The map lives as long as the package, so the bound method's reference to it is harmless.
        self._on_collected = self._drop

    def _drop(self, ref: _EntryRef) -> None:
        if self._entries.get(ref.key) is ref:
            del self._entries[ref.key]

    def _entry(self, module: object) -> Optional[_EntryRef]:
        ref = self._entries.get(id(module))
        return ref if ref is not None and ref() is module else None

    def __setitem__(self, module: torch.nn.Module, value: V) -> None:
        key = id(module)
        entry = _EntryRef(module, self._on_collected)
        entry.key, entry.value = key, value
        self._entries[key] = entry

    def get(self, module: torch.nn.Module, default: Optional[V] = None) -> Optional[V]:
        ref = self._entry(module)
        return default if ref is None else ref.value

    def setdefault(self, module: torch.nn.Module, value: V) -> V:
        ref = self._entry(module)
        if ref is not None:
            return ref.value
        self[module] = value
        return value

    def pop(self, module: torch.nn.Module, default: Optional[V] = None) -> Optional[V]:
        if self._entry(module) is None:
            return default
        return self._entries.pop(id(module)).value

    def __delitem__(self, module: torch.nn.Module) -> None:
        if self._entry(module) is None:
            raise KeyError(module)
        del self._entries[id(module)]

    def __contains__(self, module: object) -> bool:
        return self._entry(module) is not None

    def __len__(self) -> int:
        return len(self._entries)
