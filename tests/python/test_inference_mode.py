"""torch.inference_mode() inside deferred_init (Note [Inference mode while recording]): a recorded
call that makes a tensor in inference mode is refused before it runs, since materialization makes
ordinary tensors where eager made inference ones (views included); writes into existing fakes
and calls on real tensors give eager's model."""

from __future__ import annotations

import pytest
import torch
import torchdefer


class BufferMadeInInferenceMode(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        with torch.inference_mode():
            self.register_buffer("table", torch.zeros(3))


class InitializedInInferenceMode(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        with torch.inference_mode():
            self.linear.weight.normal_(0.0, 0.02)
            self.linear.bias.zero_()


class RealTableInInferenceMode(torch.nn.Module):
    def __init__(self, base: torch.Tensor):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        with torch.inference_mode():
            table = base * 0.5  # real tensors only: it runs for real
        self.table = table  # a plain attribute: a real tensor, kept as it is


def test_a_tensor_made_in_inference_mode_is_refused_naming_the_op_and_the_mode():
    with pytest.raises(RuntimeError, match=r"aten::zeros.*inference_mode.*no_grad"):
        torchdefer.deferred_init(BufferMadeInInferenceMode)


def test_the_refusal_leaves_eager_construction_working():
    torch.manual_seed(0)
    with pytest.raises(RuntimeError):
        torchdefer.deferred_init(BufferMadeInInferenceMode)
    model = BufferMadeInInferenceMode()
    assert model.table.is_inference()


def test_an_initialization_written_in_inference_mode_gives_eagers_values_and_generator():
    torch.manual_seed(7)
    eager = InitializedInInferenceMode()
    eager_next = torch.rand(3)
    torch.manual_seed(7)
    deferred = torchdefer.deferred_init(InitializedInInferenceMode)
    torchdefer.materialize_module(deferred)
    assert torch.equal(deferred.linear.weight, eager.linear.weight)
    assert torch.equal(deferred.linear.bias, eager.linear.bias)
    assert not deferred.linear.weight.is_inference()
    assert torch.equal(torch.rand(3), eager_next)


def test_real_tensors_made_in_inference_mode_stay_eagers_inference_tensors():
    base = torch.arange(6, dtype=torch.float32)
    torch.manual_seed(1)
    eager = RealTableInInferenceMode(base)
    torch.manual_seed(1)
    deferred = torchdefer.deferred_init(RealTableInInferenceMode, base)
    torchdefer.materialize_module(deferred)
    assert deferred.table.is_inference() and eager.table.is_inference()
    assert torch.equal(deferred.table, eager.table)
    assert torch.equal(deferred.linear.weight, eager.linear.weight)


class ViewWrittenInInferenceMode(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        with torch.inference_mode():
            self.linear.weight[0].fill_(0.5)


def test_a_view_made_in_inference_mode_is_refused_with_the_same_message():
    with pytest.raises(RuntimeError, match=r"aten::select.*inference_mode"):
        torchdefer.deferred_init(ViewWrittenInInferenceMode)


def test_a_tensor_made_from_a_returned_fake_in_inference_mode_is_refused():
    model = torchdefer.deferred_init(torch.nn.Linear, 4, 4)
    with torch.inference_mode():
        with pytest.raises(RuntimeError, match=r"inference_mode"):
            model.weight * 2
    torchdefer.materialize_module(model)
    assert model.weight.shape == (4, 4)
