"""Recording torch.nn.init.trunc_normal_ (PyTorch 2.13's rejection sampler).

Since 2.13, trunc_normal_ redraws rejected values until none is left: how many numbers it draws
depends on the values, so its steps cannot be recorded one by one. Under deferred_init it runs as
one operator instead, torchdefer::trunc_normal_, whose kernel is torch's own sampler and which
ATen's nondeterministic_seeded tag marks as random. The patch replaces torch.nn.init's internal
_no_grad_trunc_normal_, which trunc_normal_ looks up on every call, so that code holding its own
reference to trunc_normal_ (Hugging Face's initialization module does) is covered too. The recorder then treats it like any random
op whose draws it cannot count: it runs it once for real at record time on a scratch tensor of
the same shape (so the default generator ends where eager construction leaves it), and replays
it from that anchored generator state, giving eager's bits (Note [Torch-mode draw offsets]).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch

_ORIGINAL = torch.nn.init._no_grad_trunc_normal_
_LIBRARY = torch.library.Library("torchdefer", "DEF")
_LIBRARY.define(
    "trunc_normal_(Tensor(a!) self, float mean, float std, float a, float b) -> Tensor(a!)",
    tags=(torch.Tag.nondeterministic_seeded,),
)


def _kernel(tensor: torch.Tensor, mean: float, std: float, a: float, b: float) -> torch.Tensor:
    # On meta tensors (the Fake layer's shadows) torch's sampler returns at once.
    return _ORIGINAL(tensor, mean, std, a, b)


_LIBRARY.impl("trunc_normal_", _kernel, "CompositeExplicitAutograd")


def _recordable(
    tensor: torch.Tensor,
    mean: float,
    std: float,
    a: float,
    b: float,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    if generator is not None:
        return _ORIGINAL(tensor, mean, std, a, b, generator=generator)
    with torch.no_grad():
        return torch.ops.torchdefer.trunc_normal_(tensor, mean, std, a, b)


@contextlib.contextmanager
def recordable_trunc_normal() -> Iterator[None]:
    """While active, torch.nn.init.trunc_normal_ runs as one recordable operator."""
    torch.nn.init._no_grad_trunc_normal_ = _recordable
    try:
        yield
    finally:
        torch.nn.init._no_grad_trunc_normal_ = _ORIGINAL
