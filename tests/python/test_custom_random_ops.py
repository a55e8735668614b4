"""Custom ops that draw random numbers (Note [An untagged op that draws], replay/src/replay.cpp):
one tagged nondeterministic_seeded is recorded as a random op and gives eager's bits; one that
draws from the default CPU generator without the tag is refused when materialization runs it,
with the generator put back and the model left fake; one that draws nothing runs."""

import pytest
import torch
import torchdefer

from test_recording_state import assert_same_state


@torch.library.custom_op("torchdefer_tests::noise_untagged", mutates_args=())
def noise_untagged(x: torch.Tensor) -> torch.Tensor:
    return x + torch.rand(x.shape)


@torch.library.custom_op(
    "torchdefer_tests::noise_tagged", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,)
)
def noise_tagged(x: torch.Tensor) -> torch.Tensor:
    return x + torch.rand(x.shape)


@torch.library.custom_op("torchdefer_tests::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


for op in (noise_untagged, noise_tagged, twice):
    op.register_fake(lambda x: torch.empty_like(x))


class Noisy(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.w = torch.nn.Parameter(op(torch.zeros(4)))
        self.v = torch.nn.Parameter(torch.rand(4))


def test_a_tagged_custom_random_op_gives_eagers_bits_and_generator():
    torch.manual_seed(0)
    eager, eager_next = Noisy(noise_tagged), torch.rand(3)
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(Noisy, noise_tagged)
    deferred_next = torch.rand(3)
    torchdefer.materialize_module(deferred)
    assert_same_state(eager, deferred)
    assert torch.equal(eager_next, deferred_next)


def test_an_untagged_custom_op_that_draws_is_refused_at_materialization_and_changes_nothing():
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(Noisy, noise_untagged)
    state = torch.get_rng_state()
    refusal = "noise_untagged drew from the default CPU generator.*nondeterministic_seeded"
    with pytest.raises(RuntimeError, match=refusal):
        torchdefer.materialize_module(deferred)
    assert torch.equal(torch.get_rng_state(), state)
    assert torchdefer.is_fake(deferred.w) and torchdefer.is_fake(deferred.v)
    with pytest.raises(RuntimeError, match="noise_untagged drew"):
        torchdefer.materialize_module(deferred, rng="counter")
    assert torch.equal(torch.get_rng_state(), state)


def test_a_custom_op_that_draws_nothing_materializes():
    torch.manual_seed(0)
    eager = Noisy(twice)
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(Noisy, twice)
    torchdefer.materialize_module(deferred)
    assert_same_state(eager, deferred)
