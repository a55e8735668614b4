"""Construction code that recording used to get wrong or explain wrongly (issue 11, classes 2, 9
and 13): each case works as in eager, or is refused with a message that says what is true."""

from __future__ import annotations

import pytest
import torch
import torchdefer
from _same_model import assert_same_state, built_both_ways


class ScaledRotary(torch.nn.Module):
    """torch.tensor of 0-dim tensors, as rotary-embedding scaling code builds its frequencies."""

    def __init__(self, dim: int = 8):
        super().__init__()
        freqs = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim) * torch.rand(dim // 2)
        scaled = torch.tensor([f / 2 for f in freqs])
        nested = torch.tensor([[freqs[0], 1.5], (freqs[1] * 3, freqs[2])], dtype=torch.float64)
        self.register_buffer("scaled", scaled)
        assert torch.as_tensor(freqs) is freqs  # a tensor itself stays as it is, fake and recorded
        self.register_buffer("copied", torch.tensor(freqs * 2))
        self.register_buffer("nested", nested)
        self.weight = torch.nn.Parameter(torch.randn(dim // 2) * scaled)


def test_torch_tensor_of_zero_dim_fakes_has_eager_values():
    for seed in range(3):
        torch.manual_seed(seed)
        eager = ScaledRotary()
        torch.manual_seed(seed)
        deferred = torchdefer.deferred_init(ScaledRotary)
        torchdefer.materialize_module(deferred)
        for name, tensor in eager.state_dict().items():
            other = deferred.state_dict()[name]
            assert other.dtype == tensor.dtype and torch.equal(other, tensor), name


def test_torch_tensor_of_fakes_without_values_is_refused():
    with torchdefer.fake_mode():
        x = torch.ones(2)
        with pytest.raises(RuntimeError, match="made under a FakeMode, which records nothing"):
            torch.tensor([x[0], x[1]])


def test_data_assignment_of_a_fake_into_a_real_parameter_is_refused():
    real = torch.ones(3)

    def build():
        p = torch.nn.Parameter(real)
        p.data = torch.zeros(3)
        return p

    with pytest.raises(RuntimeError, match=r"`.data = fake` on a real tensor .* neither real nor fake"):
        torchdefer.deferred_init(build)
    assert torch.equal(real, torch.ones(3))


def test_data_assignment_after_deferred_init_is_caught_by_materialize_module():
    deferred = torchdefer.deferred_init(torch.nn.Linear, 2, 2)
    layer = torch.nn.Linear(2, 2)
    layer.weight.data = deferred.weight  # outside deferred_init: nothing sees the assignment
    assert torchdefer.is_deferred(layer)
    with pytest.raises(RuntimeError, match="weight is neither real nor fake"):
        torchdefer.materialize_module(layer)
    assert not torchdefer.is_fake(layer.bias), "the refusal materialized nothing; bias was real"


def test_a_negative_size_gives_eagers_message():
    with pytest.raises(RuntimeError) as eager:
        torch.randn(-1)
    for factory, args in ((torch.randn, (-1,)), (torch.rand, (3, -2)), (torch.empty, (-1,))):
        with pytest.raises(RuntimeError, match="Trying to create tensor with negative dimension"):
            torchdefer.deferred_init(factory, *args)
    with pytest.raises(RuntimeError) as deferred:
        torchdefer.deferred_init(torch.randn, -1)
    assert str(deferred.value).startswith(str(eager.value))
    with torchdefer.fake_mode(), pytest.raises(RuntimeError, match="negative dimension -1"):
        torch.randn(-1)


def test_reading_a_recorded_fake_after_deferred_init_gives_eagers_value():
    # Issue 12 item 3: a value read after deferred_init returned replays privately, as during
    # recording (Note [Reading values while recording]).
    torch.manual_seed(0)
    eager = torch.nn.Linear(2, 2)
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(torch.nn.Linear, 2, 2)
    assert deferred.weight.sum().item() == eager.weight.sum().item()
    assert torchdefer.is_fake(deferred.weight)
    with pytest.raises(RuntimeError) as error:
        deferred.weight.view(5)  # an error after the call still names where the op was recorded
    assert "on a fake recorded by deferred_init of Linear, outside that call" in str(error.value)


class EmptiedBuffer(torch.nn.Module):
    """`set_()` with no source: the buffer gets a new, empty storage (Note [A storage a write
    makes])."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 4))
        self.register_buffer("scratch", torch.randn(3))
        with torch.no_grad():
            self.scratch.set_()
        self.bias = torch.nn.Parameter(torch.randn(5))


def test_set_without_a_source_materializes_eagers_empty_tensor_and_the_rest():
    eager, deferred, eager_next, deferred_next = built_both_ways(EmptiedBuffer, seed=4)
    assert deferred.scratch.shape == (0,)
    assert_same_state(eager, deferred)
    assert torch.equal(deferred_next, eager_next)


def test_set_without_a_source_after_deferred_init_returned_materializes():
    def with_buffer():
        module = torch.nn.Linear(3, 3)
        module.register_buffer("table", torch.randn(6))
        return module

    torch.manual_seed(5)
    eager = with_buffer()
    eager.table.set_()
    torch.manual_seed(5)
    deferred = torchdefer.deferred_init(with_buffer)
    deferred.table.set_()
    torchdefer.materialize_module(deferred)
    assert deferred.table.shape == (0,)
    assert torch.equal(deferred.weight, eager.weight)
    for rank in range(2):
        shard = torchdefer.deferred_init(EmptiedBuffer)
        torchdefer.materialize_module(shard, shard=torchdefer.Shard(rank, 2))
        assert shard.scratch.numel() == 0
