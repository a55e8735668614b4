"""Conjugate views of fakes while recording, refused: Note [Conjugate and negative views of fakes]
(recorder/src/recording.cpp). ``conj()`` reaches the recorder as ``aten::_conj``, which refuses
it there; ``.mH``, ``.H`` and ``adjoint()`` of a complex tensor make the conjugate view without a
call the recorder sees, so the recording's torch-function mode refuses them here."""

from __future__ import annotations

from typing import Any, Callable, Dict

import torch

from torchdefer import _C

_TensorBase = torch._C.TensorBase
# The getters of the properties that conjugate a complex tensor.
GETTERS = (_TensorBase.__dict__["mH"], _TensorBase.__dict__["H"])


def refuse_if_conjugating(name: str, tensor: Any) -> None:
    """Raises when `tensor` is a complex fake, whose `name` would be a conjugate view."""
    if isinstance(tensor, torch.Tensor) and _C.is_fake(tensor) and tensor.is_complex():
        raise RuntimeError(
            f"torchdefer: {name} of {_C.describe(tensor)} while recording would make a conjugate "
            "view, which fakes do not keep. Use .mT.conj_physical() instead, or compute it after "
            "materialization."
        )


def adjoint(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    """The recording's handler of ``adjoint``."""
    refuse_if_conjugating("adjoint()", args[0] if args else kwargs.get("input"))
    return func(*args, **kwargs)
