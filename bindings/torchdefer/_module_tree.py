"""A module tree walked, and modules remembered weakly, by identity.

torch's own walk (``named_modules``, ``modules``) and ``weakref.WeakKeyDictionary`` hash every
module, and a module class that compares by value (a dataclass module) is unhashable; deferred_init
and materialize_module accept such modules, so what they keep about modules never hashes one.
"""

from __future__ import annotations

import weakref
from typing import Dict, Generic, Iterator, List, Optional, Tuple, TypeVar

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
        children = [(f"{name}.{key}" if name else key, child) for key, child in module._modules.items()]
        pending.extend(reversed([c for c in children if c[1] is not None]))
    return out


def modules(root: torch.nn.Module) -> Iterator[torch.nn.Module]:
    return (module for _, module in named_modules(root))


class WeakModuleMap(Generic[V]):
    """A map from modules to values that neither hashes nor keeps its modules alive."""

    def __init__(self) -> None:
        self._entries: Dict[int, Tuple["weakref.ReferenceType[torch.nn.Module]", V]] = {}

    def _drop(self, key: int, ref: "weakref.ReferenceType[torch.nn.Module]") -> None:
        entry = self._entries.get(key)
        if entry is not None and entry[0] is ref:
            del self._entries[key]

    def __setitem__(self, module: torch.nn.Module, value: V) -> None:
        key = id(module)
        ref = weakref.ref(module, lambda r, key=key: self._drop(key, r))
        self._entries[key] = (ref, value)

    def get(self, module: torch.nn.Module, default: Optional[V] = None) -> Optional[V]:
        entry = self._entries.get(id(module))
        return entry[1] if entry is not None and entry[0]() is module else default

    def setdefault(self, module: torch.nn.Module, value: V) -> V:
        if module not in self:
            self[module] = value
        return self.get(module)

    def pop(self, module: torch.nn.Module, default: Optional[V] = None) -> Optional[V]:
        if module not in self:
            return default
        return self._entries.pop(id(module))[1]

    def __delitem__(self, module: torch.nn.Module) -> None:
        if module not in self:
            raise KeyError(module)
        del self._entries[id(module)]

    def __contains__(self, module: object) -> bool:
        entry = self._entries.get(id(module))
        return entry is not None and entry[0]() is module

    def __len__(self) -> int:
        return len(self._entries)
