"""Custom ops that draw random numbers (Note [An untagged op that draws], replay/src/replay.cpp):
one tagged nondeterministic_seeded is recorded as a random op and gives eager's bits, from the
default generator or one given to it; one that draws from the default CPU generator without the
tag is refused when materialization runs it, with the generator put back and the model left fake;
one given a generator without the tag, or generators in two arguments or a list, is refused when
recorded (Note [A generator recording cannot follow], recorder/src/recording.cpp); one that draws
nothing runs."""

import pytest
import torch
import torchdefer

from test_recording_state import assert_same_state


@torch.library.custom_op("torchdefer_tests::noise_untagged", mutates_args=())
def noise_untagged(x: torch.Tensor) -> torch.Tensor:
    return x + torch.rand(x.shape)


@torch.library.custom_op("torchdefer_tests::normal_untagged", mutates_args=())
def normal_untagged(x: torch.Tensor) -> torch.Tensor:
    return x + torch.randn(1)  # one normal: the generator caches the other of its pair


@torch.library.custom_op(
    "torchdefer_tests::noise_tagged", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,)
)
def noise_tagged(x: torch.Tensor) -> torch.Tensor:
    return x + torch.rand(x.shape)


@torch.library.custom_op("torchdefer_tests::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


for op in (noise_untagged, normal_untagged, noise_tagged, twice):
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


def test_a_tagged_custom_random_op_materializes_in_counter_mode_and_as_shards():
    torch.manual_seed(0)
    whole = torchdefer.deferred_init(Noisy, noise_tagged)
    torchdefer.materialize_module(whole, rng="counter")
    torch.manual_seed(0)
    again = torchdefer.deferred_init(Noisy, noise_tagged)
    torchdefer.materialize_module(again, rng="counter")
    assert torch.equal(whole.w, again.w) and torch.equal(whole.v, again.v)
    torch.manual_seed(0)
    sharded = torchdefer.deferred_init(Noisy, noise_tagged)
    torchdefer.materialize_module(sharded, shard=torchdefer.Shard(0, 2))
    assert not torchdefer.is_fake(sharded.w) and not torchdefer.is_fake(sharded.v)


@pytest.mark.parametrize("op", [noise_untagged, normal_untagged], ids=["rand", "randn"])
def test_an_untagged_custom_op_that_draws_is_refused_at_materialization_and_changes_nothing(op):
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(Noisy, op)
    state = torch.get_rng_state()
    refusal = "_untagged drew from the default CPU generator.*nondeterministic_seeded"
    with pytest.raises(RuntimeError, match=refusal):
        torchdefer.materialize_module(deferred)
    assert torch.equal(torch.get_rng_state(), state)
    assert torchdefer.is_fake(deferred.w) and torchdefer.is_fake(deferred.v)
    with pytest.raises(RuntimeError, match="_untagged drew"):
        torchdefer.materialize_module(deferred, rng="counter")
    assert torch.equal(torch.get_rng_state(), state)


def test_a_custom_op_that_draws_nothing_materializes():
    torch.manual_seed(0)
    eager = Noisy(twice)
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(Noisy, twice)
    torchdefer.materialize_module(deferred)
    assert_same_state(eager, deferred)


# torch.library.custom_op takes no Generator argument: these are defined by schema.
_GENERATOR_OPS = torch.library.Library("torchdefer_tests_generators", "DEF")
for _name, _tags in (("noise_from_untagged", ()), ("noise_from_tagged", (torch.Tag.nondeterministic_seeded,))):
    _GENERATOR_OPS.define(f"{_name}(Tensor x, Generator? generator=None) -> Tensor", tags=_tags)
    _GENERATOR_OPS.impl(_name, lambda x, generator=None: x + torch.rand(x.shape, generator=generator), "CPU")
    _GENERATOR_OPS.impl(_name, lambda x, generator=None: torch.empty_like(x), "Meta")
# A tagged op whose generator argument has another name, or is keyword-only; untagged ones with
# generators in two arguments or in a list.
_GENERATOR_OPS.define("noise_from_gen(Tensor x, Generator? gen=None) -> Tensor", tags=(torch.Tag.nondeterministic_seeded,))
_GENERATOR_OPS.impl("noise_from_gen", lambda x, gen=None: x + torch.rand(x.shape, generator=gen), "CPU")
_GENERATOR_OPS.define("noise_from_keyword(Tensor x, *, Generator? g=None) -> Tensor",
                      tags=(torch.Tag.nondeterministic_seeded,))
_GENERATOR_OPS.impl("noise_from_keyword", lambda x, g=None: x + torch.rand(x.shape, generator=g), "CPU")
_GENERATOR_OPS.define("noise_from_either(Tensor x, Generator? a=None, Generator? b=None) -> Tensor",
                      tags=(torch.Tag.nondeterministic_seeded,))
_GENERATOR_OPS.impl("noise_from_either", lambda x, a=None, b=None: x + torch.rand(x.shape, generator=b or a), "CPU")
_GENERATOR_OPS.define("noise_from_list(Tensor x, Generator?[] generators) -> Tensor")
_GENERATOR_OPS.impl("noise_from_list", lambda x, generators: x + torch.rand(x.shape, generator=generators[0]), "CPU")
for _name in ("noise_from_gen", "noise_from_keyword", "noise_from_either", "noise_from_list"):
    _GENERATOR_OPS.impl(_name, lambda x, *args, **kwargs: torch.empty_like(x), "Meta")
noise_from_untagged = torch.ops.torchdefer_tests_generators.noise_from_untagged
noise_from_tagged = torch.ops.torchdefer_tests_generators.noise_from_tagged
_ops = torch.ops.torchdefer_tests_generators


class NoisyFrom(torch.nn.Module):
    def __init__(self, op, generator):
        super().__init__()
        self.w = torch.nn.Parameter(op(torch.zeros(4), generator))
        self.v = torch.nn.Parameter(torch.rand(4, generator=generator))


def test_an_untagged_custom_op_given_a_generator_is_refused_when_recorded_naming_it():
    NoisyFrom(noise_from_untagged, torch.Generator().manual_seed(1))  # eager builds it
    with pytest.raises(RuntimeError, match=r"noise_from_untagged in deferred_init of NoisyFrom was given a generator "
                                           r"\(argument 'generator'\) but has no nondeterministic_seeded tag"):
        torchdefer.deferred_init(NoisyFrom, noise_from_untagged, torch.Generator().manual_seed(1))
    # On a returned model's fakes too, where the call would be recorded as well.
    deferred = torchdefer.deferred_init(NoisyFrom, noise_from_tagged, None)
    with pytest.raises(RuntimeError, match="nondeterministic_seeded tag"):
        noise_from_untagged(deferred.w, torch.Generator().manual_seed(1))
    # Given none, it draws from the default generator: Note [An untagged op that draws] refuses it
    # when materialization runs it.
    recorded = torchdefer.deferred_init(NoisyFrom, noise_from_untagged, None)
    with pytest.raises(RuntimeError, match="drew from the default CPU generator"):
        torchdefer.materialize_module(recorded)


@pytest.mark.parametrize("call", [
    noise_from_tagged,
    lambda x, generator: _ops.noise_from_gen(x, generator),
    lambda x, generator: _ops.noise_from_keyword(x, g=generator),
], ids=["named-generator", "named-gen", "keyword-only"])
def test_a_tagged_custom_op_given_a_generator_moves_it_as_eager_does_whatever_its_name(call):
    generator = torch.Generator().manual_seed(1)
    eager, eager_next = NoisyFrom(call, generator), torch.rand(3, generator=generator)
    generator.manual_seed(1)
    deferred = torchdefer.deferred_init(NoisyFrom, call, generator)
    deferred_next = torch.rand(3, generator=generator)
    torchdefer.materialize_module(deferred)
    assert_same_state(eager, deferred)
    assert torch.equal(eager_next, deferred_next)


@pytest.mark.parametrize("call, named", [
    (lambda x, generator: _ops.noise_from_either(x, None, generator), r"'b'"),
    (lambda x, generator: _ops.noise_from_either(x, generator, generator), r"'a', 'b'"),
    (lambda x, generator: _ops.noise_from_list(x, [generator]), r"'generators'\[0\]"),
], ids=["second-of-two", "both-of-two", "in-a-list"])
def test_generators_recording_cannot_follow_are_refused_naming_them(call, named):
    NoisyFrom(call, torch.Generator().manual_seed(1))  # eager builds it
    with pytest.raises(RuntimeError, match=named):
        torchdefer.deferred_init(NoisyFrom, call, torch.Generator().manual_seed(1))
