"""What deferred_init (and a ``deferred()`` block) does with the modules it returns, in one walk.

Note [One walk over a returned module]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Three things happen to a module deferred_init returns: every submodule is guarded under its
qualified name (Note [Forgetting to materialize], ``_guard.py``), the fakes each one holds as
parameters and buffers are remembered for DTensor layouts (Note [DTensor parameters of a deferred
model], ``_dtensor.py``), and those fakes are handed out (Note [Handed-out fakes after
deferred_init], ``_after_return.py``). Each once walked the tree on its own, and the second and
third looked at every parameter and buffer again: for a Hugging Face Llama-70B (1,047 modules)
that was three walks and about 7 ms, 7% of building the model on the meta device. One walk does
all three now: the tree is walked once, with names, and the fakes a module holds are found once
and both remembered and handed out (only a fake can be handed out). A result that is not a module
(a tensor, or lists, tuples and dicts of modules and tensors) takes each step's own walk.
"""

from __future__ import annotations

from typing import Any

import torch

from torchdefer import _after_return, _dtensor, _guard, _module_tree


def settle(result: Any) -> None:
    """Guards, remembers and hands out what ``result`` holds (Note [One walk over a returned
    module])."""
    if not isinstance(result, torch.nn.Module):
        _guard.guard(result)
        _dtensor.remember(result)
        _after_return.hand_out(result)
        return
    named = _module_tree.named_modules(result)
    _guard.guard_named(named)
    for _, module in named:
        for fake in _dtensor.remember_own(module).values():
            _after_return.hand_out_tensor(fake)
