"""torch.inference_mode() inside deferred_init (Note [Inference mode while recording]): a module
tensor that eager makes as an inference tensor is refused, naming it, since materialization makes
ordinary tensors; temporaries made in inference mode that only feed writes into the model, writes
into existing fakes and calls on real tensors give eager's model; views are refused when made."""

from __future__ import annotations

import pytest
import torch
import torchdefer
from _same_model import assert_same_state, built_both_ways


class BufferMadeInInferenceMode(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        with torch.inference_mode():
            self.register_buffer("table", torch.zeros(3))


class InitializedInInferenceMode(torch.nn.Module):
    """Initializations whose temporaries are made in inference mode and only written into
    parameters: eager's parameters stay ordinary tensors."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.masked = torch.nn.Parameter(torch.empty(4, 4))
        self.square = torch.nn.Parameter(torch.empty(6, 6))
        self.cast = torch.nn.Parameter(torch.ones(3))
        with torch.inference_mode():
            torch.nn.init.orthogonal_(self.square)  # writes through view_as, a composite's view
            self.cast.mul_(self.cast.to(torch.float32))  # .to() of its own dtype: the fake itself
            self.linear.weight.normal_(0.0, 0.02)
            self.linear.bias.zero_()
            self.masked.copy_(torch.ones(4, 4))
            self.masked.masked_fill_(torch.eye(4, dtype=torch.bool), 0.0)
            self.masked.div_(self.masked.norm())


class RealTableInInferenceMode(torch.nn.Module):
    def __init__(self, base: torch.Tensor):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        with torch.inference_mode():
            table = base * 0.5  # real tensors only: it runs for real
        self.table = table  # a plain attribute: a real tensor, kept as it is


class ViewWrittenInInferenceMode(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        with torch.inference_mode():
            self.linear.weight[0].fill_(0.5)


def test_a_buffer_made_in_inference_mode_is_refused_naming_it_when_deferred_init_returns():
    with pytest.raises(RuntimeError, match=r"table of BufferMadeInInferenceMode.*inference_mode.*"
                                           r"no_grad"):
        torchdefer.deferred_init(BufferMadeInInferenceMode)


class AliasTakenOutsideInferenceMode(torch.nn.Module):
    def __init__(self, alias):
        super().__init__()
        with torch.inference_mode():
            table = torch.arange(6.0)
        self.register_buffer("table", alias(table))  # eager: an inference tensor too


@pytest.mark.parametrize("alias", [lambda t: t.detach(), lambda t: t.view(2, 3),
                                   lambda t: torch.nn.Parameter(t, requires_grad=False)],
                         ids=["detach", "view", "parameter"])
def test_an_alias_of_a_tensor_made_in_inference_mode_is_refused_wherever_it_was_taken(alias):
    assert alias(torch.inference_mode()(torch.arange)(6.0)).is_inference()
    with pytest.raises(RuntimeError, match=r"table of AliasTakenOutsideInferenceMode was made "
                                           r"under torch.inference_mode\(\)"):
        torchdefer.deferred_init(AliasTakenOutsideInferenceMode, alias)


def test_the_refusal_leaves_eager_construction_working():
    with pytest.raises(RuntimeError):
        torchdefer.deferred_init(BufferMadeInInferenceMode)
    assert BufferMadeInInferenceMode().table.is_inference()


def test_temporaries_made_in_inference_mode_for_writes_give_eagers_values_and_generator():
    eager, deferred, eager_next, deferred_next = built_both_ways(InitializedInInferenceMode, seed=7)
    assert_same_state(eager, deferred)
    assert not any(t.is_inference() for t in deferred.state_dict().values())
    assert torch.equal(deferred_next, eager_next)


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


def test_a_view_made_in_inference_mode_is_refused_when_made():
    with pytest.raises(RuntimeError, match=r"aten::select.*inference_mode.*makes a view"):
        torchdefer.deferred_init(ViewWrittenInInferenceMode)



def test_a_buffer_made_from_a_returned_fake_in_inference_mode_is_refused_by_materialization():
    model = torchdefer.deferred_init(torch.nn.Linear, 4, 4)
    with torch.inference_mode():
        model.register_buffer("scaled", model.weight * 2)
        temporary = model.weight + 1  # made, never held by the model: fine
    del temporary
    with pytest.raises(RuntimeError, match=r"cannot materialize scaled: .*inference_mode"):
        torchdefer.materialize_module(model)


def test_a_returned_model_written_in_inference_mode_materializes():
    torch.manual_seed(2)
    eager = torch.nn.Linear(4, 4)
    with torch.inference_mode():
        eager.weight.mul_(torch.full((4, 4), 0.5))
    torch.manual_seed(2)
    model = torchdefer.deferred_init(torch.nn.Linear, 4, 4)
    with torch.inference_mode():
        model.weight.mul_(torch.full((4, 4), 0.5))
    torchdefer.materialize_module(model)
    assert torch.equal(model.weight, eager.weight)


class DataAssignedInInferenceMode(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(3))
        with torch.inference_mode():
            self.weight.data = torch.ones(3)  # eager: the parameter becomes an inference tensor


class TemporariesAssignedAcrossInferenceMode(torch.nn.Module):
    """`.data` assigned between temporaries of both kinds; the parameters are made from them
    outside inference mode, so eager's are ordinary tensors."""

    def __init__(self):
        super().__init__()
        made_outside = torch.empty(3)
        ordinary = torch.arange(3.0)
        with torch.inference_mode():
            made_inside = torch.empty(3)
            made_inside.data = ordinary  # an inference tensor takes an ordinary one's data
            inference = torch.arange(3.0, 6.0)
        made_outside.data = inference  # an ordinary tensor takes an inference one's
        self.first = torch.nn.Parameter(made_inside * 2)
        self.second = torch.nn.Parameter(made_outside * 2)


def test_data_assigned_a_tensor_made_in_inference_mode_gives_a_parameter_eager_makes_an_inference_tensor():
    assert DataAssignedInInferenceMode().weight.is_inference()  # eager
    with pytest.raises(RuntimeError, match=r"weight of DataAssignedInInferenceMode was made under torch\.inference_mode"):
        torchdefer.deferred_init(DataAssignedInInferenceMode)
    with torchdefer.fake_mode():
        assert DataAssignedInInferenceMode().weight.is_inference()


def test_data_assigned_between_temporaries_across_inference_mode_gives_eagers_model():
    eager, deferred, eager_next, deferred_next = built_both_ways(TemporariesAssignedAcrossInferenceMode)
    assert_same_state(eager, deferred)
    assert torch.equal(deferred_next, eager_next)
    assert not deferred.first.is_inference() and not deferred.second.is_inference()
    with torchdefer.fake_mode():
        faked = TemporariesAssignedAcrossInferenceMode()
    assert not faked.first.is_inference() and not faked.second.is_inference()
