"""The one module walker: a module tree walked, the tensors its modules hold, and modules
remembered weakly, by identity.

torch's own walks (``named_modules``, ``modules``, ``named_children``, a recursive
``named_parameters``) and ``weakref.WeakKeyDictionary`` hash every module, and a module class that
compares by value (a dataclass module) is unhashable; deferred_init and materialize_module accept
such modules, so every walk of the package is one of these, and what it keeps about modules never
hashes one.

Note [Walking a module]
~~~~~~~~~~~~~~~~~~~~~~~
materialize_module and is_deferred see every tensor reachable from the module's tree: its
parameters and buffers, and the tensors held as plain attributes (`self.inv_freq = ...`,
`self.pos = torch.arange(n)`), also inside lists, tuples and dicts. Plain attributes are not
parameters: a shard keeps them whole, as it keeps buffers, and buffers_only materializes them.
Parameters and buffers are collected over the whole tree first, so that a parameter also held
as another module's attribute keeps its parameter name and is sharded. Children come before
their parent (the order stats are reported in). The walks are iterative on purpose: a nested
recursive closure is a reference cycle (the function and its cell) that would keep the list,
and so every materialized tensor, alive until the cyclic collector ran.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, Generic, Iterable, List, Optional, Tuple, TypeVar

import torch

from torchdefer import _C

V = TypeVar("V")
# (name, tensor, is_parameter): what a walk finds, and what _C.materialize_named takes.
Entry = Tuple[str, torch.Tensor, bool]
CheckFn = Callable[[torch.nn.Module], bool]

_MODULE_INTERNALS = frozenset({"_parameters", "_buffers", "_modules"})


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


def parameters_and_buffers(root: torch.nn.Module, remove_duplicate: bool = True) -> List[Entry]:
    """``root.named_parameters(remove_duplicate=...)``, then ``root.named_buffers(...)``, as
    (name, tensor, is_parameter), with modules told apart by identity."""
    named = named_modules(root, remove_duplicate=remove_duplicate)
    entries: List[Entry] = []
    for is_parameter in (True, False):
        seen = set()
        for prefix, module in named:
            for name, tensor in (module._parameters if is_parameter else module._buffers).items():
                if tensor is None or (remove_duplicate and id(tensor) in seen):
                    continue
                seen.add(id(tensor))
                entries.append((f"{prefix}.{name}" if prefix else name, tensor, is_parameter))
    return entries


def children_first(
    root: torch.nn.Module, enter: Optional[CheckFn] = None, remove_duplicate: bool = False
) -> List[Tuple[str, torch.nn.Module]]:
    """(prefix, module) for ``root`` and its descendants, each child's subtree before the child,
    children in order, then the parent; a prefix is the qualified name with a trailing dot ("" for
    ``root``). ``enter(child)`` returning False leaves out the child's subtree (``root`` is always
    entered); with ``remove_duplicate`` a module reached again is left out, as torchdistX does."""
    out: List[Tuple[str, torch.nn.Module]] = []
    seen = set()
    # (prefix, module, whether its children are already pending): a module is written out when it
    # comes up the second time, after its subtree.
    pending: List[Tuple[str, torch.nn.Module, bool]] = [("", root, False)]
    while pending:
        prefix, module, expanded = pending.pop()
        if expanded:
            out.append((prefix, module))
            continue
        if module is not root and enter is not None and not enter(module):
            continue
        if remove_duplicate:
            if id(module) in seen:
                continue
            seen.add(id(module))
        pending.append((prefix, module, True))
        pending.extend(reversed(_children(prefix, module)))
    return out


def _children(prefix: str, module: torch.nn.Module) -> List[Tuple[str, torch.nn.Module, bool]]:
    """``module.named_children()`` (each child once, by its first name), as pending entries."""
    children: List[Tuple[str, torch.nn.Module, bool]] = []
    seen = set()
    for name, child in module._modules.items():
        if child is not None and id(child) not in seen:
            seen.add(id(child))
            children.append((f"{prefix}{name}.", child, False))
    return children


def found_in(value: Any) -> Tuple[List[torch.nn.Module], List[torch.Tensor]]:
    """The modules and the tensors in ``value`` (one, or lists, tuples and dicts of them, nested)."""
    found_modules: List[torch.nn.Module] = []
    tensors: List[torch.Tensor] = []
    pending = [value]
    seen = set()
    while pending:
        value = pending.pop()
        if isinstance(value, torch.Tensor):
            tensors.append(value)
        elif isinstance(value, torch.nn.Module):
            found_modules.append(value)
        elif isinstance(value, (list, tuple, dict)) and id(value) not in seen:
            seen.add(id(value))
            pending.extend(value.values() if isinstance(value, dict) else value)
    return found_modules, tensors


def _attribute_tensors(name: str, value: Any, out: List[Entry], seen: set) -> None:
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


def tensors(named: Iterable[Tuple[str, torch.nn.Module]], buffers_only: bool = False) -> List[Entry]:
    """Every (name, tensor, is_parameter) the modules ``named`` (prefix, module) hold themselves:
    parameters and buffers first, then tensor attributes (Note [Walking a module])."""
    owned: List[Entry] = []
    held: List[Entry] = []
    containers: set = set()
    for prefix, m in named:
        if not buffers_only:
            owned.extend((prefix + n, p, True) for n, p in m.named_parameters(recurse=False))
        owned.extend((prefix + n, b, False) for n, b in m.named_buffers(recurse=False))
        for attribute, value in vars(m).items():
            if attribute not in _MODULE_INTERNALS:
                _attribute_tensors(prefix + attribute, value, held, containers)
    return owned + held


def tree_tensors(root: torch.nn.Module) -> List[Entry]:
    """Every (name, tensor, is_parameter) reachable from ``root`` (Note [Walking a module])."""
    return tensors(children_first(root))


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


def to_materialize(found: List[Entry], real: bool = False) -> List[Entry]:
    """The tensors of ``found`` to materialize, each once, by the first name found: the fakes, and
    with ``real`` also the real ones, which the C++ side shards (Note [Real tensors of a sharded
    module]) or loads from a checkpoint (Note [Loading a tensor real at record time])."""
    entries: List[Entry] = []
    seen = set()
    for name, tensor, is_parameter in found:
        fake = _C.is_fake(tensor)
        if not fake:
            _check_not_a_husk(name, tensor)
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        if fake or real:
            entries.append((name, tensor, is_parameter))
    return entries


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
