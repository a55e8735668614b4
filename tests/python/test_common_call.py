"""The common call (Note [The common call] in recorder/src/recording.cpp): a call described in
one walk, in place in the graph's own lists, whose description is abandoned for the general path
at the first tensor that is not a fake of the recording in progress. Whatever path a call takes,
the materialized model is eager's, bit for bit."""

import torch

import torchdefer
from test_recording_state import assert_same_state, eager_and_materialized

OUTSIDE = torch.arange(6, dtype=torch.float32).reshape(2, 3)


class AbandonsAfterAFake(torch.nn.Module):
    """add_ and mul_ have the common shape; their second tensor is real, so each description is
    abandoned after its first tensor, and the calls after them describe where those were."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(2, 3))
        with torch.no_grad():
            self.w.uniform_(-1, 1)
            self.w.add_(OUTSIDE)
            self.w.mul_(OUTSIDE)
            self.w.clamp_(-2.5, 30.0)
        self.v = torch.nn.Parameter(torch.randn(3, 2))
        with torch.no_grad():
            self.v.mul_(0.5).add_(1.0)


class ViewsAndInPlaceViews(torch.nn.Module):
    """Views are common calls that make new values of one storage; an in-place view changes the
    written fake's geometry, so the fake gets a new value rather than keeping its own."""

    def __init__(self):
        super().__init__()
        w = torch.empty(4, 6)
        t = w.t()
        flat = w.view(24)
        with torch.no_grad():
            w.normal_()
            t.uniform_(2, 3)
            flat[::5].fill_(7.0)
        u = torch.empty(3, 5).uniform_()
        u.t_()
        u.mul_(2)
        self.register_buffer("w", w)
        self.register_buffer("u", u)


class ForeignFakeAfterOwn(torch.nn.Module):
    """A fake of another recording as the second tensor: the description is abandoned and the
    general path records it (and materialization refuses what it cannot replay)."""

    def __init__(self, other):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3))
        with torch.no_grad():
            self.w.add_(other)


def test_descriptions_abandoned_at_a_real_tensor_leave_the_recording_as_eager_made_it():
    assert_same_state(*eager_and_materialized(AbandonsAfterAFake))


def test_views_and_in_place_views_recorded_as_common_calls_materialize_eagers_values():
    assert_same_state(*eager_and_materialized(ViewsAndInPlaceViews))


def test_a_fake_of_another_recording_is_recorded_by_the_general_path():
    other = torchdefer.deferred_init(lambda: torch.nn.Linear(3, 3)).bias
    m = torchdefer.deferred_init(ForeignFakeAfterOwn, other)
    torchdefer.materialize_module(m)
    assert not torchdefer.is_fake(m.w)
    torch.testing.assert_close(m.w.detach(), torch.zeros(3) + torchdefer.materialize_tensor(other))
