"""The default generator's state, read or set from Python while a recording runs.

Note [The generator's state read while recording]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The recorder applies a recording's draws to the default CPU generator lazily, in one jump when the
recording ends (Note [Torch-mode draw offsets]), and notices that someone moved the generator by
comparing its state with the one it left. Model code that saves and restores the generator while
it builds breaks both halves: ``torch.random.fork_rng()`` and Lightning's ``isolate_rng()``
(NequIP's model builder seeds inside it) read ``torch.get_rng_state()`` before the draws were
applied, so the state they save, or hand to the caller, is not eager's; restoring a state saved
before the draws leaves the generator where the recorder left it, so the restore goes unnoticed
and the draws after it continue the old chain; and ``torch.manual_seed(s)`` with the seed the
recording started from looks the same. All three gave other values than eager with no error.

These functions are plain Python that call the generator with no tensor argument, so no
torch-function mode sees them. While any recording scope is open (deferred_init, a deferred()
block), ``torch.get_rng_state``, ``set_rng_state``, ``manual_seed`` and ``seed``, in ``torch``
and in ``torch.random``, are wrappers that first apply this thread's pending draws
(``_C._settle_default_generator``: one jump), then call torch's function. The state read is
then eager's, and a restore or a reseed changes the generator, which the next recorded random op
notices, starting a new anchor there. Only ``get_rng_state`` resolves value-dependent samplers
(``trunc_normal_``) still owed, by this recording or an earlier one (the generator's debt is the
process's, Note [The owed generator's mark]), at eager's cost: the setters replace the state,
which makes those draws moot, so they apply this thread's plain draws and leave the generator
owed (marked, so that even a reseed to the recording's starting seed is seen as a change). With
nothing pending the wrapper only adds the call. The wrappers are installed by the first scope to
open and removed by the last to close (a count under a lock), as the module registration hooks
of Note [deferred() is deferred_init without a callable] are; another thread sees them, and they
call torch's own function for it.

Not seen: ``torch.default_generator.get_state()`` called directly, references to these functions
taken before the recording started (``from torch import get_rng_state`` at import), and C++ code;
they see the generator before the pending draws, as before.

CUDA's generators, for recordings that draw from them (Note [Torch-mode draws on CUDA] in
recorder/internal/torchdefer/cuda_draws.h), are moved as each op is recorded, except after a
sampler whose increment only its run tells: the generator is then owed and parked at a mark (Note
[Marks of an owed CUDA generator] in recorder/src/cuda_draws.cpp). ``torch.cuda.get_rng_state``
and ``get_rng_state_all`` are wrapped the same way, paying those samplers first (on the GPU), so
the state read, and restored by ``fork_rng``, is eager's; the setters need nothing, a set being a
move the next recorded op sees.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Dict, List, Tuple

import torch

from torchdefer import _C

_NAMES = ("get_rng_state", "set_rng_state", "manual_seed", "seed")
_CUDA_READS = ("get_rng_state", "get_rng_state_all")
_lock = threading.Lock()
_open = 0
_saved: List[Tuple[Any, str, Callable[..., Any]]] = []


def _settled_first(function: Callable[..., Any], settle: Callable[[], None]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        settle()
        return function(*args, **kwargs)

    return wrapper


def _install() -> None:
    wrappers: Dict[int, Callable[..., Any]] = {}
    for module in (torch, torch.random):
        for name in _NAMES:
            function = getattr(module, name)
            about_to_read = name == "get_rng_state"
            wrapper = wrappers.setdefault(id(function), _settled_first(
                function, functools.partial(_C._settle_default_generator, about_to_read)))
            _saved.append((module, name, function))
            setattr(module, name, wrapper)
    for name in _CUDA_READS:
        function = getattr(torch.cuda, name)
        _saved.append((torch.cuda, name, function))
        setattr(torch.cuda, name, _settled_first(function, _C._pay_cuda_generator_debts))


def _uninstall() -> None:
    while _saved:
        module, name, function = _saved.pop()
        setattr(module, name, function)


class settled_on_access:
    """While open, reading or setting the default generator's state from Python first applies
    this thread's pending recorded draws (Note [The generator's state read while recording])."""

    def __enter__(self) -> "settled_on_access":
        global _open
        with _lock:
            if _open == 0:
                _install()
            _open += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        global _open
        with _lock:
            _open -= 1
            if _open == 0:
                _uninstall()
