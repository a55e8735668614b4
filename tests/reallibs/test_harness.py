"""The suite's checks can fail: each catches the difference it is for, on plain torch modules."""

import itertools
import math

import pytest
import torch
from harness import (Promise, check_counter_promises, check_fake_after_deferred_init,
                     check_shards, check_torch_mode, observe_promises)

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


_REAL = torch.zeros(3)


def test_fake_check_catches_a_real_tensor_after_deferred_init():
    def build():  # a buffer made before the recording began: real, as a to_empty that escaped
        module = torch.nn.Linear(4, 6)
        module.register_buffer("made_before", _REAL)
        return module

    check_fake_after_deferred_init(lambda: torch.nn.Linear(4, 6))
    with pytest.raises(AssertionError, match="made_before .* is real after deferred_init"):
        check_fake_after_deferred_init(build)


def test_torch_mode_check_catches_a_library_generator_left_elsewhere():
    def flow():
        module = torch.nn.Linear(4, 6)
        generator = torch.Generator().manual_seed(5)
        torch.nn.init.normal_(module.weight, generator=generator)
        if next(_calls) % 2 == 0:
            torch.rand(1, generator=generator)  # every other run draws once more from it
        return module, {"own": generator}

    with pytest.raises(AssertionError, match="library's generator 'own'"):
        check_torch_mode(flow)


def test_promises_are_the_last_init_call_of_each_tensor():
    def build():
        module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
        torch.nn.init.trunc_normal_(module[0].weight, std=0.02, a=-0.04, b=0.04)
        torch.nn.init.trunc_normal_(module[1].weight, std=0.02, a=-0.04, b=0.04)
        module[1].weight.data.mul_(2)  # written after its init call: no promise left
        return module

    _, promises = observe_promises(build)
    assert promises["0.weight"].kind == "trunc_normal" and promises["0.weight"].params["b"] == 0.04
    assert "1.weight" not in promises  # the later mul_ made it something else
    assert promises["0.bias"].kind == "uniform"  # Linear.reset_parameters' bias, the last writer


@pytest.mark.parametrize("values, broken", [
    (torch.full((1000,), 0.05), "outside"),
    (torch.empty(1000).uniform_(-0.04, 0.04), "std"),
    (torch.nn.init.trunc_normal_(torch.empty(1000), mean=0.01, std=0.02, a=-0.04, b=0.04), "mean"),
])
def test_a_promise_is_broken_by_values_it_rules_out(values, broken):
    promise = Promise("trunc_normal", "trunc_normal_", False, mean=0.0, std=0.02, a=-0.04, b=0.04)
    assert promise.broken_by(torch.nn.init.trunc_normal_(
        torch.empty(1000), std=0.02, a=-0.04, b=0.04)) is None
    assert broken in promise.broken_by(values)
    mean, std = Promise("trunc_normal", "", False, mean=0.0, std=1.0, a=-math.inf,
                        b=math.inf).moments()
    assert (mean, std) == (0.0, 1.0)


def test_promise_check_catches_a_flow_whose_generator_ignores_its_seed():
    def flow(seed):  # OLMo-core's smallmoe() preset dropped the init_seed given to it
        module = torch.nn.Linear(64, 64)
        generator = torch.Generator().manual_seed(7)
        torch.nn.init.normal_(module.weight, std=0.02, generator=generator)
        return module, {"own": generator}

    with pytest.raises(AssertionError, match="same counter values for the library's generator"):
        check_counter_promises(flow)
