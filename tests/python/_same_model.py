"""A model built eagerly and through deferred_init + materialize_module from the same seed, with
the generator's next draw after each: what regression tests of silently different models compare."""

from __future__ import annotations

from typing import Any, Callable, Tuple

import torch
import torchdefer
from test_recording_state import assert_same_state as same_state_bitwise


def built_both_ways(build: Callable[..., Any], *args: Any, seed: int = 0,
                    **kwargs: Any) -> Tuple[Any, Any, torch.Tensor, torch.Tensor]:
    """(eager model, deferred model, eager's next draw, the deferred one's next draw)."""
    torch.manual_seed(seed)
    eager = build(*args, **kwargs)
    eager_next = torch.rand(3)
    torch.manual_seed(seed)
    deferred = torchdefer.deferred_init(build, *args, **kwargs)
    torchdefer.materialize_module(deferred)
    return eager, deferred, eager_next, torch.rand(3)


def assert_same_state(eager: torch.nn.Module, deferred: torch.nn.Module) -> None:
    """test_recording_state's comparison (bitwise, requires_grad, nothing left fake), in eager's
    order."""
    assert list(deferred.state_dict()) == list(eager.state_dict())
    same_state_bitwise(eager, deferred)
