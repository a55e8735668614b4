"""Recording: ``deferred_init``, its block form ``with deferred():``, and ``fake_mode``; what a
recording does with the modules it returns.

Note [One walk over a returned module]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Three things happen to a module deferred_init returns: every submodule is guarded under its
qualified name (Note [Forgetting to materialize], ``_guard.py``), the fakes each one holds as
parameters and buffers are remembered for DTensor layouts (Note [DTensor parameters of a deferred
model], ``_dtensor.py``), and those fakes are handed out (Note [Handed-out fakes after
deferred_init], ``_stand_ins.py``). Each once walked the tree on its own, and the second and
third looked at every parameter and buffer again: for a Hugging Face Llama-70B (1,047 modules)
that was three walks and about 7 ms, 7% of building the model on the meta device. One walk does
all three now: the tree is walked once, with names, and the fakes a module holds are found once
and both remembered and handed out (only a fake can be handed out). A result that is not a module
(a tensor, or lists, tuples and dicts of modules and tensors) takes each step's own walk.

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
``materialize_module`` and ``is_deferred`` (Note [Walking a module] in ``_module_tree.py``), so
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
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
from torch.nn.modules import module as _nn_module

from torchdefer import _C, _dtensor, _generator_state, _guard, _module_tree, _options, _recording, _stand_ins


def _draws_cuda_from_cuda(cuda_draws: Optional[str]) -> bool:
    """Whether a recording's random ops on CUDA tensors draw from CUDA's generator (Note
    [Torch-mode draws on CUDA] in recorder/internal/torchdefer/cuda_draws.h). When
    ``torch.manual_seed`` queued a seed for CUDA's generators (CUDA not initialized yet), CUDA is
    initialized first, which creates no context, so that the seed is in the generator the
    recording reads; otherwise nothing is initialized (a process that forks later stays free to)."""
    if cuda_draws not in (None, "cuda", "cpu"):
        raise ValueError(
            "torchdefer: cuda_draws must be \"cuda\" (CUDA's generator, as eager construction on "
            "the GPU), \"cpu\" (the CPU generator, the same values on every device) or None "
            f"(\"cuda\" where a CUDA device is present), got {cuda_draws!r}"
        )
    available = torch.cuda.is_available()
    on_cuda = available if cuda_draws is None else cuda_draws == "cuda"
    if on_cuda and available and not torch.cuda.is_initialized() and getattr(torch.cuda, "_queued_calls", True):
        torch.cuda.init()
    return on_cuda


@contextlib.contextmanager
def fake_mode(device: _options.DeviceLike = None) -> Iterator[None]:
    """While active, every factory returns a fake tensor (on ``device`` if a factory names none).

    Nothing is recorded: fakes from ``fake_mode`` can be inspected and run forward, not
    materialized. Use :func:`deferred_init` for that. A CUDA ``device`` works without a GPU;
    where CUDA is available, torch's Python factories still initialize it.
    """
    # Python factories always pass a device (torch's default device), so the default that
    # FakeMode sets for C++ callers is set here through torch's own device context too.
    with _recording.mode(), _C._FakeMode(_options.device(device)):
        with torch.device(device or torch.get_default_device()):
            yield


def deferred_init(
    module_cls_or_callable: Callable[..., Any],
    *args: Any,
    exact_generator: bool = False,
    cuda_draws: Optional[str] = None,
    **kwargs: Any,
) -> Any:
    """Calls ``module_cls_or_callable(*args, **kwargs)`` with every tensor fake and every operation
    on them recorded, and returns its result (typically an ``nn.Module`` with fake parameters).

    Random ops whose number of draws depends on their values (``nn.init.trunc_normal_``) are not
    computed while recording, so the default generator is left owed until the first torch-mode
    materialization settles it where eager leaves it (a warning names them if it was drawn from
    before that). ``exact_generator=True`` computes them when recording ends, at eager's cost for
    those ops, and leaves the generator exact at once.

    ``cuda_draws`` says which generator random ops on CUDA tensors draw from, for torch-mode
    materialization: ``"cuda"`` (CUDA's generator, as eager construction on the GPU: eager's bits
    on this GPU model, and CUDA's generator left where eager leaves it), ``"cpu"`` (the CPU
    generator, as eager construction on the CPU: the same bits on every device), or ``None``
    (``"cuda"`` where a CUDA device is present, else ``"cpu"``). Counter mode gives the same values
    either way.
    """
    if not callable(module_cls_or_callable):
        raise TypeError(
            "torchdefer.deferred_init expects an nn.Module class or a callable, got "
            f"{type(module_cls_or_callable).__name__}"
        )
    name = getattr(module_cls_or_callable, "__qualname__", repr(module_cls_or_callable))
    cuda_generator = _draws_cuda_from_cuda(cuda_draws)
    inference_tensors_before = _C._inference_tensors_made()
    with _recording.mode(), _generator_state.settled_on_access(), \
            _C._RecordingScope(name, exact_generator, cuda_generator):
        result = module_cls_or_callable(*args, **kwargs)
    if _C._inference_tensors_made() != inference_tensors_before:
        _refuse_inference_tensors(result, name)
    # Guarded, remembered for DTensors, handed out: Note [One walk over a returned module].
    settle(result)
    return result


def _refuse_inference_tensors(result: Any, name: str) -> None:
    """Note [Inference mode while recording] (recording.cpp): a parameter or buffer that eager
    made as an inference tensor would materialize as an ordinary one."""
    if not isinstance(result, torch.nn.Module):
        return  # materialization refuses it, naming it
    for tensor_name, t, _ in _module_tree.parameters_and_buffers(result):
        if _C.is_fake(t) and _C._made_in_inference_mode(t):
            _C._refuse_inference_tensor(f"{tensor_name} of {name}")


def settle(result: Any) -> None:
    """Guards, remembers and hands out what ``result`` holds (Note [One walk over a returned
    module])."""
    if isinstance(result, torch.nn.Module):
        named = _module_tree.named_modules(result)
        _guard.guard_named(named)
        found = [module for _, module in named]
    else:
        roots, tensors = _module_tree.found_in(result)
        found = [module for root in roots for module in _module_tree.modules(root)]
        for tensor in tensors:
            _stand_ins.hand_out_tensor(tensor)
    for module in found:
        for fake in _dtensor.remember_own(module).values():
            _stand_ins.hand_out_tensor(fake)


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
    the file and line that created it. ``exact_generator`` and ``cuda_draws`` are
    ``deferred_init``'s: the modules
    listed in ``block.modules`` get what ``deferred_init``'s result gets (the forward check, and
    DTensor layouts applied to them later).
    """

    def __init__(self, *, exact_generator: bool = False, cuda_draws: Optional[str] = None) -> None:
        self._exact_generator = exact_generator
        self._cuda_draws = cuda_draws
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
        cuda_generator = _draws_cuda_from_cuda(self._cuda_draws)
        with contextlib.ExitStack() as opening:
            self._mode = opening.enter_context(_recording.mode())
            opening.enter_context(_generator_state.settled_on_access())
            opening.enter_context(
                _C._RecordingScope(self._name, self._exact_generator, cuda_generator))
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
            settle(module)

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
