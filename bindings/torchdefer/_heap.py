"""Returning freed heap memory to the system between FSDP1 units (glibc only).

Note [FSDP1 units and the heap]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
FSDP1 materializes a deferred model one unit at a time, innermost first: the unit's parameters
whole, then ``torch.cat`` of them into the flat parameter, then this rank's chunk of it; the unit's
parameters and the whole flat parameter are freed. glibc keeps freed blocks below its mmap
threshold (dynamic, up to 32 MiB) in the heap, resident, and the next unit's allocations do not
always fit into those holes, so with many units the resident set grows past what is live: on
bench/fsdp1_memory.py that made the deferred path's per-rank peak exceed eager construction's
(docs/distributed.md). ``malloc_trim(0)`` before each unit gives the free pages back, so the peak
is what the units keep plus the one unit in flight. Where the C library is not glibc (no
``malloc_trim``), nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Callable, Optional


@functools.lru_cache(maxsize=None)
def _malloc_trim() -> Optional[Callable[[int], int]]:
    """glibc's malloc_trim, looked up at first use (find_library runs ldconfig)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def return_free_memory() -> None:
    """Gives the heap's free pages back to the system (Note [FSDP1 units and the heap])."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
