"""Torch's CUDA initialization, skipped for fakes where CUDA is unavailable.

Torch's Python factories call ``torch.cuda._lazy_init()`` for a CUDA device before the dispatcher
sees the call, which fails where CUDA is unavailable, although a fake needs no CUDA. Torch's C++
layer skips that call for a device type it considers initialized
(``torch::utils::set_requires_device_init``, a process-wide flag). So CUDA is marked initialized
while anything that makes fakes needs it (a recording or fake mode open on any thread, a handed-out
fake's ``new_tensor``), counted under a lock: the first to need it clears the flag, the last sets it
again, so that none unmarks it while another needs it (Note [What recording changes, and where] in
``_recording.py`` says what other threads see meanwhile).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import torch

from torchdefer import _C

_lock = threading.Lock()
_skipping = 0


def skip() -> None:
    """One more user of CUDA marked initialized."""
    global _skipping
    with _lock:
        if _skipping == 0:
            _C._set_requires_cuda_init(False)
        _skipping += 1


def stop_skipping() -> None:
    """One user of CUDA marked initialized less."""
    global _skipping
    with _lock:
        _skipping -= 1
        if _skipping == 0:
            _C._set_requires_cuda_init(True)


@contextlib.contextmanager
def marked_initialized() -> Iterator[None]:
    """CUDA marked initialized where it is unavailable, for a call that makes a fake CUDA tensor
    outside any recording, counted with the recordings that mark it."""
    if torch.cuda.is_available():
        yield
        return
    skip()
    try:
        yield
    finally:
        stop_skipping()


def after_fork_in_child(users: int) -> None:
    """In a child forked while marked, only the forking thread goes on: ``users`` is how many of
    its open recordings mark CUDA initialized, and the flag is set again if none does."""
    global _lock, _skipping
    _lock = threading.Lock()
    if _skipping and not users:
        _C._set_requires_cuda_init(True)
    _skipping = users
