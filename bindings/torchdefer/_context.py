"""``with torchdefer.deferred():``: deferred_init as a block of code.

Note [deferred() is deferred_init without a callable]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Frameworks give users a place to build a model in a ``with`` block (Lightning Fabric's
``init_module()``, accelerate's ``init_empty_weights()``), not a callable to hand over. The block
opens what ``deferred_init`` opens around its callable, on the same thread and in the same order:
the FakeTensorFunctions of Note [What recording changes, and where] (in ``_recording.py``), then
the C++ ``RecordingScope``, one new recording per block. So everything ``deferred_init`` does
while it runs, the block does too, and nothing else: factories return fakes, operations on them
are recorded, blocks and ``deferred_init`` calls nest (each inner one records its own graph), the
default generator is left where eager construction leaves it, and an exception closes the block
and propagates, leaving the fakes made so far fake.

``deferred_init`` does nothing with its result after construction: everything that looks at the
built modules (finding parameters, buffers and tensor attributes, refusing a tensor that
``.data = fake`` left neither real nor fake) happens when the module is walked, in
``materialize_module`` and ``is_deferred`` (Note [Walking a module] in ``__init__.py``), so
materializing each module the block produced is the same call as for ``deferred_init``'s result.

A callable also returns what it built, and a block does not: code after ``deferred_init`` can
act on its result, code after a block needs another way to the modules. So the block lists them
as ``block.modules``: the modules that received a fake parameter, buffer or submodule in it, less
those that became a submodule of another one and those dropped before the block ended (the
roots, in the order they were first seen). It
learns them from torch's process-wide module registration hooks, registered while any block is
open and removed when the last one closes; a registration on another thread, or inside a
``deferred_init`` or block nested in this one (whose mode is then the innermost), is not this
block's. A module that holds fakes only as plain attributes, with no fake parameter, buffer or
submodule, is not listed (it is still materialized by ``materialize_module`` like any other).

Note [Exits in order]
~~~~~~~~~~~~~~~~~~~~~
What a callable guarantees and a block does not is the order of exits. The recording state lives
in the thread that opened it (its FakeTensorFunctions, the C++ scope's thread-locals), and it is a
stack. A block that ends on another thread (a generator suspended inside it and resumed
elsewhere) or out of order (``__exit__`` called by hand, an ``ExitStack`` popped out of order)
would close someone else's state, so ``__exit__`` refuses both with an error that says which.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref
from typing import Any, Dict, List, Optional

import torch
from torch.nn.modules import module as _nn_module

from torchdefer import _C, _generator_state, _recording, _returned

# The deferred() blocks open on this thread, innermost last.
_open_blocks = threading.local()


def _blocks_on_this_thread() -> List["deferred"]:
    blocks = getattr(_open_blocks, "blocks", None)
    if blocks is None:
        blocks = _open_blocks.blocks = []
    return blocks


# The registration hooks, while any block is open on any thread (Note [deferred() is
# deferred_init without a callable]).
_hooks_lock = threading.Lock()
_hook_handles: List[Any] = []
_blocks_open_anywhere = 0


def _recording_block() -> Optional["deferred"]:
    """The block whose recording this thread's registrations belong to, if any: the innermost
    block, unless a deferred_init (or fake_mode) inside it is innermost."""
    blocks = getattr(_open_blocks, "blocks", None)
    if not blocks:
        return None
    return blocks[-1] if _recording.innermost() is blocks[-1]._mode else None


# Modules by id, held weakly: a module class may define __eq__ and so not be hashable, and a module
# built and dropped inside the block is not the block's result.
_WeakModules = Dict[int, "weakref.ReferenceType[torch.nn.Module]"]


def _note(table: _WeakModules, module: torch.nn.Module) -> None:
    held = table.get(id(module))
    if held is None or held() is not module:  # new, or an id a dropped module had
        table[id(module)] = weakref.ref(module)


def _holds(table: _WeakModules, module: torch.nn.Module) -> bool:
    held = table.get(id(module))
    return held is not None and held() is module


def _on_tensor_registered(module: torch.nn.Module, name: str, tensor: Any) -> None:
    if isinstance(tensor, torch.Tensor) and _C.is_fake(tensor):
        block = _recording_block()
        if block is not None:
            _note(block._built, module)


def _on_submodule_registered(module: torch.nn.Module, name: str, submodule: Any) -> None:
    if isinstance(submodule, torch.nn.Module):
        block = _recording_block()
        if block is not None:
            _note(block._built, module)
            _note(block._children, submodule)


def _hooks_for_one_more_block() -> None:
    global _blocks_open_anywhere
    with _hooks_lock:
        _blocks_open_anywhere += 1
        if _blocks_open_anywhere == 1:
            _hook_handles.extend([
                _nn_module.register_module_parameter_registration_hook(_on_tensor_registered),
                _nn_module.register_module_buffer_registration_hook(_on_tensor_registered),
                _nn_module.register_module_module_registration_hook(_on_submodule_registered),
            ])


def _hooks_for_one_block_less() -> None:
    global _blocks_open_anywhere
    with _hooks_lock:
        _blocks_open_anywhere -= 1
        if _blocks_open_anywhere == 0:
            for handle in _hook_handles:
                handle.remove()
            _hook_handles.clear()


class deferred:
    """A block in which every module and tensor built is deferred, as under :func:`deferred_init`::

        torch.manual_seed(0)
        with torchdefer.deferred():
            model = Transformer(cfg)            # fake parameters, initialization recorded
            head = torch.nn.Linear(512, 10)
        torchdefer.materialize_module(model)    # eager's values, bit for bit (torch RNG mode)
        torchdefer.materialize_module(head)

    ``with torchdefer.deferred() as block:`` gives, after the block, ``block.modules``: the
    top-level modules built in it (here ``[model, head]``), e.g. to materialize them all.
    Each block records on the thread that enters it; threads it starts build real tensors.
    Blocks nest with each other and with ``deferred_init`` (each inner one records separately). An
    exception inside the block closes it and propagates. A ``deferred()`` object can be entered
    again after it has exited, not while it is active. Errors recorded inside the block name it by
    the file and line that created it. ``exact_generator`` is ``deferred_init``'s: the modules
    listed in ``block.modules`` get what ``deferred_init``'s result gets (the forward check, and
    DTensor layouts applied to them later).
    """

    def __init__(self, *, exact_generator: bool = False) -> None:
        self._exact_generator = exact_generator
        caller = sys._getframe(1)
        self._name = (
            f"torchdefer.deferred() at {os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
        )
        self._exit_stack: Optional[contextlib.ExitStack] = None
        self._thread = 0
        self._mode: Optional[_recording.FakeTensorFunctions] = None
        self._built: _WeakModules = {}
        self._children: _WeakModules = {}
        # The top-level modules built in the block, once it has exited.
        self.modules: List[torch.nn.Module] = []

    def __enter__(self) -> "deferred":
        if self._exit_stack is not None:
            raise RuntimeError(
                f"torchdefer: {self._name} is already active; nest a new torchdefer.deferred() instead "
                "of entering the same one twice"
            )
        with contextlib.ExitStack() as opening:
            self._mode = opening.enter_context(_recording.mode())
            opening.enter_context(_generator_state.settled_on_access())
            opening.enter_context(_C._RecordingScope(self._name, self._exact_generator))
            _hooks_for_one_more_block()
            opening.callback(_hooks_for_one_block_less)
            self._exit_stack = opening.pop_all()
        self._thread = threading.get_ident()
        self._built, self._children, self.modules = {}, {}, []
        _blocks_on_this_thread().append(self)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._exit_stack is None:
            raise RuntimeError(f"torchdefer: {self._name} is not active, so it cannot be exited")
        self._check_exit_is_in_order()
        _blocks_on_this_thread().pop()
        exit_stack, self._exit_stack = self._exit_stack, None
        exit_stack.close()
        built = [held() for held in self._built.values()]
        self.modules = [m for m in built if m is not None and not _holds(self._children, m)]
        self._built, self._children = {}, {}
        # What deferred_init does with its result, for each module the block built.
        for module in self.modules:
            _returned.settle(module)

    def _check_exit_is_in_order(self) -> None:
        if threading.get_ident() != self._thread:
            raise RuntimeError(
                f"torchdefer: {self._name} is exited on a thread other than the one that entered it; "
                "recording belongs to the entering thread, so it stays open there. Enter and exit a "
                "block on one thread (do not suspend a generator inside it and resume it elsewhere)"
            )
        inner = _blocks_on_this_thread()[-1]
        if inner is not self:
            raise RuntimeError(
                f"torchdefer: {self._name} is exited while {inner._name}, entered inside it, is still "
                "active; exit the inner block first"
            )
