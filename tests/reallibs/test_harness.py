"""The suite's checks can fail: each catches the difference it is for, on plain torch modules."""

import itertools

import pytest
import torch
from harness import check_shards, check_torch_mode

_calls = itertools.count()


class _DiffersPerCall(torch.nn.Module):
    """Each construction's buffer holds how many were built before: never equal to the last."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 6)
        self.register_buffer("calls", torch.full((3,), float(next(_calls))))


def test_both_checks_pass_on_a_plain_module():
    check_torch_mode(lambda: torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.LayerNorm(6)))
    check_shards(lambda: torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.LayerNorm(6)))


def test_torch_mode_check_catches_a_value_that_differs_from_eager():
    with pytest.raises(AssertionError, match="buffer|calls"):
        check_torch_mode(_DiffersPerCall)


def test_shard_check_catches_a_rank_that_differs_from_the_full_model():
    with pytest.raises(AssertionError, match="calls"):
        check_shards(_DiffersPerCall)


def test_torch_mode_check_catches_a_generator_left_elsewhere():
    def build():
        module = torch.nn.Linear(4, 6)
        if next(_calls) % 2 == 0:
            torch.rand(1)  # every other construction draws once more after the weights
        return module

    with pytest.raises(AssertionError, match="generator state"):
        check_torch_mode(build)


_store = {}


def test_torch_mode_check_catches_a_case_that_reuses_the_eager_models_tensors():
    def build():  # a process-wide store handing out what the first construction made
        module = torch.nn.Module()
        module.weight = torch.nn.Parameter(_store.setdefault("weight", torch.randn(3)))
        return module

    with pytest.raises(AssertionError, match="eager model's own memory"):
        check_torch_mode(build)
