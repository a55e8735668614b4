"""``with torchdefer.deferred():``: deferred_init as a block of code.

Note [deferred() is deferred_init without a callable]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Frameworks give users a place to build a model in a ``with`` block (Lightning Fabric's
``init_module()``, accelerate's ``init_empty_weights()``), not a callable to hand over. The block
opens what ``deferred_init`` opens around its callable, on the same thread and in the same order:
the torch-function mode of Note [What recording changes, and where] (in ``_recording.py``), then
the C++ ``RecordingScope``, one new recording per block. So everything ``deferred_init`` does
while it runs, the block does too, and nothing else: factories return fakes, operations on them
are recorded, blocks and ``deferred_init`` calls nest (each inner one records its own graph), the
default generator is left where eager construction leaves it, and an exception closes the block
and propagates, leaving the fakes made so far fake.

``deferred_init`` does nothing with its result after construction: everything that looks at the
built modules (finding parameters, buffers and tensor attributes, refusing a tensor that
``.data = fake`` left neither real nor fake) happens when the module is walked, in
``materialize_module`` and ``is_deferred`` (Note [Walking a module] in ``__init__.py``). So the
block needs no list of the modules built in it: materializing each module the block produced is
the same call as for ``deferred_init``'s result.

What a callable guarantees and a block does not is the order of exits. The recording state lives
in the thread that opened it (torch's mode stack, the C++ scope's thread-locals), and it is a
stack. A block that ends on another thread (a generator suspended inside it and resumed
elsewhere) or out of order (``__exit__`` called by hand, an ``ExitStack`` popped out of order)
would close someone else's state, so ``__exit__`` refuses both with an error that says which.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any, List, Optional

from torchdefer import _C
from torchdefer import _recording

# The deferred() blocks open on this thread, innermost last.
_open_blocks = threading.local()


def _blocks_on_this_thread() -> List["deferred"]:
    blocks = getattr(_open_blocks, "blocks", None)
    if blocks is None:
        blocks = _open_blocks.blocks = []
    return blocks


class deferred:
    """A block in which every module and tensor built is deferred, as under :func:`deferred_init`::

        torch.manual_seed(0)
        with torchdefer.deferred():
            model = Transformer(cfg)            # fake parameters, initialization recorded
            head = torch.nn.Linear(512, 10)
        torchdefer.materialize_module(model)    # eager's values, bit for bit (torch RNG mode)
        torchdefer.materialize_module(head)

    Each block records on the thread that enters it; threads it starts build real tensors.
    Blocks nest with each other and with ``deferred_init`` (each inner one records separately). An
    exception inside the block closes it and propagates. A ``deferred()`` object can be entered
    again after it has exited, not while it is active. Errors recorded inside the block name it by
    the file and line that created it.
    """

    def __init__(self) -> None:
        caller = sys._getframe(1)
        self._name = (
            f"torchdefer.deferred() at {os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
        )
        self._exit_stack: Optional[contextlib.ExitStack] = None
        self._thread = 0

    def __enter__(self) -> None:
        if self._exit_stack is not None:
            raise RuntimeError(
                f"torchdefer: {self._name} is already active; nest a new torchdefer.deferred() instead "
                "of entering the same one twice"
            )
        with contextlib.ExitStack() as opening:
            opening.enter_context(_recording.mode())
            opening.enter_context(_C._RecordingScope(self._name))
            self._exit_stack = opening.pop_all()
        self._thread = threading.get_ident()
        _blocks_on_this_thread().append(self)

    def __exit__(self, *exc_info: Any) -> None:
        if self._exit_stack is None:
            raise RuntimeError(f"torchdefer: {self._name} is not active, so it cannot be exited")
        self._check_exit_is_in_order()
        _blocks_on_this_thread().pop()
        exit_stack, self._exit_stack = self._exit_stack, None
        exit_stack.close()

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
