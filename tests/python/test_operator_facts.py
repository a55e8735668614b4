"""An operator's facts are asked once per operator and thread and trusted below the recorder (Note
[Operators known by their schema's address], Note [A caller that knows the operator]): an operator
defined again with other tags is asked anew, so a data-dependent one is never run on meta shadows
as the earlier definition could be."""

from __future__ import annotations

import pytest
import torch
import torchdefer
from torch import nn


def define(namespace: str, data_dependent: bool) -> torch.library.Library:
    lib = torch.library.Library(namespace, "DEF")
    lib.define("pick(Tensor x) -> Tensor", tags=(torch.Tag.data_dependent_output,) if data_dependent else ())
    lib.impl("pick", (lambda x: x[x > 0].clone()) if data_dependent else (lambda x: x * 2), "CPU")
    lib.impl("pick", lambda x: torch.empty_like(x), "Meta")
    return lib


class Picks(nn.Module):
    def __init__(self, pick):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 5))
        with torch.no_grad():
            self.register_buffer("picked", pick(self.weight))


@pytest.mark.parametrize("first_data_dependent", [False, True], ids=["plain-then-data-dependent",
                                                                      "data-dependent-then-plain"])
def test_an_operator_defined_again_with_other_tags_records_as_its_new_definition(first_data_dependent):
    namespace = f"torchdefer_test_facts_{int(first_data_dependent)}"
    for data_dependent in (first_data_dependent, not first_data_dependent):
        lib = define(namespace, data_dependent)
        try:
            pick = getattr(getattr(torch.ops, namespace), "pick")
            torch.manual_seed(0)
            eager = Picks(pick)
            torch.manual_seed(0)
            deferred = torchdefer.deferred_init(Picks, pick)
            torchdefer.materialize_module(deferred)
            assert deferred.picked.shape == eager.picked.shape
            assert torch.equal(deferred.picked, eager.picked)
            assert torch.equal(deferred.weight, eager.weight)
        finally:
            lib._destroy()
