"""Trainers' own init flows under deferred_init: a meta build followed by ``to_empty`` and the
trainer's init, explicit ``torch.Generator``s given to every random op (torch mode moves them as
eager does, counter mode keys each op by its generator), construction-time forwards in eval mode,
and the corners random programs found (issue 29)."""

from __future__ import annotations

import copy
import hashlib
import math
import warnings

import pytest
import torch
import torch.nn as nn
import torchdefer
from _same_model import assert_same_state, built_both_ways

WORLD_SIZES = (2, 3, 4, 7)


def _shards(build, name, world, *args, padded=False):
    """Parameter `name` of every rank's shard of `build(*args)` recorded from seed 0, and the
    stats of each."""
    parts, stats = [], []
    for rank in range(world):
        torch.manual_seed(0)
        model = torchdefer.deferred_init(build, *args)
        stats.append(torchdefer.materialize_module(
            model, shard=torchdefer.Shard(rank, world, padded=padded)))
        parts.append(model.get_parameter(name).detach())
    return parts, stats


def _counter(build, *args, seed=0, **kwargs):
    """`build(*args)` recorded from default seed `seed`, materialized in counter mode."""
    torch.manual_seed(seed)
    model = torchdefer.deferred_init(build, *args)
    torchdefer.materialize_module(model, rng="counter", **kwargs)
    return model


# --- A meta build, then to_empty, then the trainer's init (Note [Factories of meta templates]).

class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)
        self.register_buffer("scale", torch.ones(32))


class _MetaBuilt(nn.Module):
    """torchtitan's order: every module on meta, to_empty, init_weights with its own init."""

    def __init__(self, device="cpu", move="root"):
        super().__init__()
        with torch.device("meta"):
            self.embed = nn.Embedding(64, 32)
            self.blocks = nn.ModuleList([_Block() for _ in range(2)])
            self.head = nn.Linear(32, 64, bias=False)
        if move == "root":
            self.to_empty(device=device)
        else:
            self.blocks[1].to_empty(device=device)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        for module in self.modules():
            if isinstance(module, nn.Linear) and not module.weight.is_meta:
                nn.init.trunc_normal_(module.weight, std=0.02, a=-0.04, b=0.04)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding) and not module.weight.is_meta:
                nn.init.normal_(module.weight)
            elif isinstance(module, nn.LayerNorm) and not module.weight.is_meta:
                module.reset_parameters()
        for block in self.blocks:
            if not block.scale.is_meta:
                block.scale.fill_(0.5)


def test_to_empty_of_a_meta_build_is_recorded_and_materializes_as_eager():
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_MetaBuilt)
    assert all(torchdefer._C.is_fake(t) for t in model.state_dict().values())
    assert torchdefer.is_deferred(model)
    assert "trunc_normal_" in torchdefer.explain(model.head.weight)
    torchdefer.materialize_module(model)
    torch.manual_seed(0)
    eager = _MetaBuilt()
    assert_same_state(eager, model)


def test_to_empty_in_a_deferred_block_is_recorded_as_under_deferred_init():
    torch.manual_seed(0)
    with torchdefer.deferred():
        model = _MetaBuilt()
    assert torchdefer.is_deferred(model)
    assert all(torchdefer._C.is_fake(t) for t in model.state_dict().values())
    torchdefer.materialize_module(model)
    torch.manual_seed(0)
    assert_same_state(_MetaBuilt(), model)


def test_to_empty_of_one_submodule_leaves_the_rest_meta_as_in_eager():
    eager, model, eager_next, next_draw = built_both_ways(_MetaBuilt, move="one")
    assert model.head.weight.is_meta and model.blocks[0].attn.weight.is_meta
    assert not model.blocks[1].attn.weight.is_meta
    for name, tensor in eager.state_dict().items():
        got = model.state_dict()[name]
        assert got.is_meta == tensor.is_meta, name
        if not tensor.is_meta:
            assert torch.equal(got, tensor), name
    assert torch.equal(next_draw, eager_next)


def test_to_empty_to_cuda_is_a_fake_cuda_tensor_with_or_without_a_gpu():
    model = torchdefer.deferred_init(_MetaBuilt, "cuda")
    assert model.head.weight.device == torch.device("cuda", 0)
    assert torchdefer._C.is_fake(model.head.weight)
    torchdefer.materialize_module(model, device="cpu")
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_MetaBuilt, "cuda")
    torchdefer.materialize_module(model, device="cpu")
    torch.manual_seed(0)
    assert_same_state(_MetaBuilt(), model)


def test_like_factories_of_meta_templates_make_fakes_under_fake_mode():
    template = torch.empty(3, 5, device="meta", dtype=torch.float16)
    with torchdefer.fake_mode():
        for made in (torch.empty_like(template, device="cpu"),
                     torch.zeros_like(template, device="cpu"),
                     torch.ones_like(template, device="cpu"),
                     torch.full_like(template, 2.0, device="cpu"),
                     torch.randn_like(template, device="cpu"),
                     template.new_zeros(4, device="cpu")):
            assert torchdefer._C.is_fake(made) and made.device.type == "cpu"
        assert torch.empty_like(template).is_meta  # no device: meta, as in eager


def test_a_meta_template_changed_after_recording_does_not_change_the_model():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            template = torch.empty(4, 4, device="meta")
            self.w = nn.Parameter(torch.zeros_like(template, device="cpu"))
            template.resize_(2)  # eager does not care; neither may the recording
    model = torchdefer.deferred_init(M)
    torchdefer.materialize_module(model)
    assert torch.equal(model.w, torch.zeros(4, 4))


def test_shards_of_a_meta_build_compute_only_the_shard():
    for world in WORLD_SIZES:
        parts, stats = _shards(_MetaBuilt, "head.weight", world)
        full = _counter(_MetaBuilt)
        assert torch.equal(torch.cat(parts), full.head.weight.detach())
        for rank_stats in stats:
            for entry in rank_stats:
                assert entry["bytes_computed"] == entry["bytes_kept"], entry


# --- trunc_normal_(generator=g): one recorded op, anchored on g.

def _with_generator(seed, n=64, std=1.0, bound=0.4):
    g = torch.Generator().manual_seed(seed)
    model = nn.Linear(n, n)
    nn.init.trunc_normal_(model.weight, std=std, a=-bound, b=bound, generator=g)
    nn.init.normal_(model.bias, generator=g)
    model.g = g
    return model


@pytest.mark.parametrize("seed", range(20))
def test_trunc_normal_with_a_generator_is_eager_in_torch_mode_and_bounded_in_counter_mode(seed):
    torch.manual_seed(0)
    eager = _with_generator(seed)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_with_generator, seed)
    assert torch.equal(model.g.get_state(), eager.g.get_state())  # where eager leaves it, at once
    torchdefer.materialize_module(model)
    assert torch.equal(model.weight, eager.weight) and torch.equal(model.bias, eager.bias)
    counter = _counter(_with_generator, seed)
    assert counter.weight.abs().max() <= 0.4


def test_trunc_normal_with_a_generator_is_recorded_as_one_op():
    model = torchdefer.deferred_init(_with_generator, 0)
    recorded = torchdefer.explain(model.weight)
    assert recorded.count("trunc_normal_") == 1
    assert "where" not in recorded and "__or__" not in recorded


def test_trunc_normal_with_a_generator_shards_compute_what_they_keep():
    full = _counter(_with_generator, 3)
    for world in WORLD_SIZES:
        parts, stats = _shards(_with_generator, "weight", world, 3)
        assert torch.equal(torch.cat(parts), full.weight.detach())
        for rank_stats in stats:
            weight = next(entry for entry in rank_stats if entry["name"] == "weight")
            assert weight["bytes_computed"] == weight["bytes_kept"], weight


def test_counter_truncated_normal_keeps_its_bounds_and_moments():
    def build():
        g = torch.Generator().manual_seed(7)
        w = nn.Parameter(torch.empty(512, 512))
        nn.init.trunc_normal_(w, mean=0.5, std=2.0, a=-1.0, b=3.0, generator=g)
        return nn.ParameterList([w])
    w = _counter(build)[0].detach().double()
    assert w.min() >= -1.0 and w.max() <= 3.0
    # The truncated normal's moments, from its standardized bounds.
    alpha, beta = (-1.0 - 0.5) / 2.0, (3.0 - 0.5) / 2.0
    pdf = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    cdf = lambda x: (1 + math.erf(x / math.sqrt(2))) / 2  # noqa: E731
    z = cdf(beta) - cdf(alpha)
    mean = 0.5 + 2.0 * (pdf(alpha) - pdf(beta)) / z
    var = 4.0 * (1 + (alpha * pdf(alpha) - beta * pdf(beta)) / z - ((pdf(alpha) - pdf(beta)) / z) ** 2)
    assert abs(w.mean().item() - mean) < 0.01
    assert abs(w.std().item() - math.sqrt(var)) < 0.01


# --- The generator a trunc_normal_ draws from is followed (Note [Followed generators]).

def _samplers_run(fn):
    """How many rejection tests ``fn()`` ran: the ``any()`` that ends each round of a trunc_normal_
    sampler (recording runs no kernel on a fake's meta shadow)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        fn()
    return sum(1 for event in profile.events() if event.name == "aten::any")


class _Trainer(nn.Module):
    """A trainer's init: every weight from one seeded generator, trunc_normal_ and counted draws
    interleaved."""

    def __init__(self, g, n=32):
        super().__init__()
        self.a = nn.Linear(n, n)
        self.b = nn.Linear(n, 2 * n)
        nn.init.trunc_normal_(self.a.weight, std=0.02, generator=g)
        nn.init.uniform_(self.a.bias, generator=g)
        nn.init.trunc_normal_(self.b.weight, std=1.0, a=-0.4, b=0.4, generator=g)
        nn.init.normal_(self.b.bias, generator=g)
        self.register_buffer("noise", torch.randn(3, 5, generator=g))  # normal_ of 15: run on scratch


def _trainer_both_ways(seed=1):
    torch.manual_seed(0)
    g_eager = torch.Generator().manual_seed(seed)
    eager = _Trainer(g_eager)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(seed)
    return eager, g_eager, torchdefer.deferred_init(_Trainer, g), g


def test_recording_trunc_normal_with_a_generator_runs_no_sampler_until_the_generator_is_read():
    g = torch.Generator().manual_seed(1)
    models = []
    assert _samplers_run(lambda: models.append(torchdefer.deferred_init(_Trainer, g))) == 0
    assert _samplers_run(g.get_state) > 0  # the read pays what the recording owed
    assert _samplers_run(g.get_state) == 0  # once


@pytest.mark.parametrize("read", ["get_state", "clone_state", "draw", "draw_on_fake", "deepcopy",
                                  "materialize_first", "under_a_dispatch_mode"])
def test_a_followed_generator_answers_every_read_as_after_eager_construction(read):
    eager, g_eager, model, g = _trainer_both_ways()
    if read == "get_state":
        assert torch.equal(g.get_state(), g_eager.get_state())
    elif read == "clone_state":
        assert torch.equal(g.clone_state().get_state(), g_eager.get_state())
    elif read == "draw":
        assert torch.equal(torch.randn(40, generator=g), torch.randn(40, generator=g_eager))
        assert torch.equal(torch.empty(7).uniform_(generator=g),
                           torch.empty(7).uniform_(generator=g_eager))
    elif read == "draw_on_fake":  # recorded on the model's fakes after deferred_init returned
        nn.init.trunc_normal_(model.a.weight, std=0.5, generator=g)
        nn.init.trunc_normal_(eager.a.weight, std=0.5, generator=g_eager)
        assert torch.equal(torch.rand(9, generator=g), torch.rand(9, generator=g_eager))
    elif read == "deepcopy":
        assert torch.equal(copy.deepcopy(g).get_state(), g_eager.get_state())
    elif read == "materialize_first":
        torchdefer.materialize_module(model)
        assert torch.equal(g.get_state(), g_eager.get_state())
    elif read == "under_a_dispatch_mode":  # the payment is torchdefer's: the mode does not see it
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            g.get_state()
    torchdefer.materialize_module(model)
    assert_same_state(eager, model)
    assert torch.equal(g.get_state(), g_eager.get_state())
    assert g.initial_seed() == g_eager.initial_seed() == 1


@pytest.mark.parametrize("reset", ["manual_seed", "set_state", "seed"])
def test_reseeding_a_followed_generator_drops_what_it_owed_as_eager_does(reset):
    eager, g_eager, model, g = _trainer_both_ways()
    for generator in (g, g_eager):
        if reset == "manual_seed":
            generator.manual_seed(7)
        elif reset == "set_state":
            generator.set_state(torch.Generator().manual_seed(8).get_state())
        else:
            generator.seed()
    assert _samplers_run(g.get_state) == 0  # nothing was paid: the debt was moot
    if reset != "seed":
        assert torch.equal(g.get_state(), g_eager.get_state())
    torchdefer.materialize_module(model)
    assert_same_state(eager, model)


def test_a_followed_generator_carries_its_debt_into_the_next_recording():
    torch.manual_seed(0)
    g_eager = torch.Generator().manual_seed(3)
    eager = [_Trainer(g_eager), _Trainer(g_eager)]
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    models = [torchdefer.deferred_init(_Trainer, g), torchdefer.deferred_init(_Trainer, g)]
    for e, m in zip(reversed(eager), reversed(models)):  # the later model first
        torchdefer.materialize_module(m)
        assert_same_state(e, m)
    assert torch.equal(g.get_state(), g_eager.get_state())


def test_a_sampler_nothing_keeps_is_paid_when_its_generator_is_read():
    def build(g):
        scratch = torch.empty(300)
        nn.init.trunc_normal_(scratch, std=0.3, a=-0.1, b=0.1, generator=g)  # dropped
        return nn.Linear(4, 4)
    g_eager, g = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    build(g_eager)
    torchdefer.materialize_module(torchdefer.deferred_init(build, g))
    assert torch.equal(g.get_state(), g_eager.get_state())


def test_a_real_tensor_drawn_from_a_followed_generator_while_recording_gets_eager_numbers():
    def build(g, out):
        model = _Trainer(g)
        out.normal_(generator=g)  # a real tensor: drawn at once, from the generator paid first
        return model
    expected, real = torch.empty(6), torch.empty(6)
    torch.manual_seed(0)
    eager = build(torch.Generator().manual_seed(2), expected)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(build, torch.Generator().manual_seed(2), real)
    assert torch.equal(real, expected)
    torchdefer.materialize_module(model)
    assert_same_state(eager, model)


def test_a_draw_that_takes_only_the_cached_normal_sample_moves_a_followed_generator():
    """normal_ of fewer than 16 elements keeps the second Box-Muller value in the generator and
    takes it on the next call without moving the engine: the generator has moved all the same."""
    def first(g):
        w = nn.Parameter(torch.empty(5))
        nn.init.trunc_normal_(w, generator=g)  # normal_ of 5: leaves a cached sample
        return nn.ParameterList([w])

    def second(g):
        return nn.ParameterList([nn.Parameter(torch.empty(3).normal_(generator=g))])
    for seed in range(10, 14):
        g_eager, g = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        first(g_eager)
        torchdefer.deferred_init(first, g)
        assert torch.equal(torch.randn(1, generator=g), torch.randn(1, generator=g_eager))
        eager, model = second(g_eager), torchdefer.deferred_init(second, g)
        torchdefer.materialize_module(model)
        assert_same_state(eager, model)
        assert torch.equal(g.get_state(), g_eager.get_state())


def test_a_cpu_generator_drawing_into_a_fake_cuda_tensor_is_refused_as_eager_refuses_it():
    def build(g):
        with torch.device("cuda"):
            layer = nn.Linear(4, 4)
        nn.init.trunc_normal_(layer.weight, generator=g)
        return layer
    with pytest.raises(RuntimeError, match="from a CPU generator, which eager refuses"):
        torchdefer.deferred_init(build, torch.Generator().manual_seed(0))


def test_a_long_chain_of_owed_samplers_is_paid_on_a_small_stack():
    """Resolution walks the chain oldest first, not one stack frame per sampler."""
    import threading

    def build(g, n):
        weights = nn.ParameterList(nn.Parameter(torch.empty(2)) for _ in range(n))
        for w in weights:
            nn.init.trunc_normal_(w, std=0.5, a=-0.1, b=0.1, generator=g)
        return weights
    g_eager, g = torch.Generator().manual_seed(6), torch.Generator().manual_seed(6)
    build(g_eager, 5000)
    result = {}

    def read():
        result["state"] = g.get_state()
    torchdefer.deferred_init(build, g, 5000)
    previous = threading.stack_size(128 * 1024)
    try:
        reader = threading.Thread(target=read)
        reader.start()
        reader.join()
    finally:
        threading.stack_size(previous)
    assert torch.equal(result["state"], g_eager.get_state())


@pytest.mark.parametrize("between", ["nothing", "get_state", "materialize", "exact_generator"])
def test_counter_weights_after_a_followed_sampler_do_not_depend_on_reads_in_between(between):
    def build(g, read):
        model = _Trainer(g)
        if read:
            g.get_state()
        model.c = nn.Linear(32, 32)
        nn.init.trunc_normal_(model.c.weight, std=0.5, a=-0.3, b=0.3, generator=g)
        nn.init.uniform_(model.c.bias, generator=g)
        return model

    def counter(read=False, exact=False):
        torch.manual_seed(0)
        model = torchdefer.deferred_init(build, torch.Generator().manual_seed(9), read,
                                         exact_generator=exact)
        if between == "materialize":  # a torch-mode replay resolves the anchors the copy shares
            torchdefer.materialize_module(copy.deepcopy(model))
        torchdefer.materialize_module(model, rng="counter")
        return model

    reference = counter()
    model = counter(read=between == "get_state", exact=between == "exact_generator")
    assert_same_state(reference, model)
    assert model.c.weight.abs().max() <= 0.3 and model.b.weight.abs().max() <= 0.4


def test_counter_keys_of_a_followed_generator_are_scheme_threes_known_answers():
    """Note [Counter scheme versions]: the ops after a trunc_normal_ on one generator are keyed by
    their place on its followed chain; a change of these bits is a new scheme."""
    assert torchdefer._C.counter_scheme_version() == 3
    model = _counter(_Trainer, torch.Generator().manual_seed(1))
    digests = {name: hashlib.sha256(t.detach().numpy().tobytes()).hexdigest()[:16]
               for name, t in model.state_dict().items()}
    assert digests == {
        "a.weight": "7d8436bb6dece843",  # from the generator's state
        "a.bias": "f165f1214286c0f1",  # after the first trunc_normal_: from its lazy anchor
        "b.weight": "7faf3b037a41d2b8",
        "b.bias": "b6bc38ebee5205f8",
        "noise": "7eb1da4e9142cce7",
    }


# --- Every random op given a generator, both modes (Note [Counter keys of explicit generators]).

def _draw(name, g, w):
    """One random op of family `name` drawing from `g`, writing parameter-shaped `w`."""
    with torch.no_grad():
        if name == "trunc_normal_":
            nn.init.trunc_normal_(w, generator=g)
        elif name == "normal_":
            w.normal_(0.0, 1.0, generator=g)
        elif name == "uniform_":
            nn.init.uniform_(w, -1.0, 1.0, generator=g)
        elif name == "kaiming_uniform_":
            nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=g)
        elif name == "xavier_normal_":
            nn.init.xavier_normal_(w, generator=g)
        elif name == "randn":
            w.copy_(torch.randn(w.shape, generator=g))
        elif name == "rand":
            w.copy_(torch.rand(w.shape, generator=g))
        elif name == "randint":
            w.copy_(torch.randint(-5, 5, w.shape, generator=g))
        elif name == "bernoulli_":
            w.bernoulli_(0.3, generator=g)
        elif name == "exponential_":
            w.exponential_(2.0, generator=g)
        elif name == "log_normal_":
            w.log_normal_(0.0, 0.5, generator=g)
        elif name == "cauchy_":
            w.cauchy_(generator=g)
        elif name == "geometric_":
            w.geometric_(0.4, generator=g)
        elif name == "random_":
            w.random_(0, 10, generator=g)
        elif name == "randperm":
            w.copy_(torch.randperm(w.numel(), generator=g).view(w.shape).float())
        elif name == "multinomial":
            probabilities = torch.ones(w.shape[1])
            w.copy_(torch.multinomial(probabilities, w.shape[1], generator=g).float().expand(w.shape))
        else:
            raise AssertionError(name)


FAMILIES = ("trunc_normal_", "normal_", "uniform_", "kaiming_uniform_", "xavier_normal_", "randn",
            "rand", "randint", "bernoulli_", "exponential_", "log_normal_", "cauchy_",
            "geometric_", "random_", "randperm", "multinomial")


class _Drawn(nn.Module):
    def __init__(self, name, seed):
        super().__init__()
        self.g = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.empty(8, 6))
        self.v = nn.Parameter(torch.empty(5, 6))
        _draw(name, self.g, self.w)
        _draw(name, self.g, self.v)  # a second draw from the same generator


@pytest.mark.parametrize("name", FAMILIES)
def test_every_random_op_with_a_generator_is_eager_in_torch_mode(name):
    eager, model, eager_next, next_draw = built_both_ways(_Drawn, name, 11)
    assert_same_state(eager, model)
    assert torch.equal(model.g.get_state(), eager.g.get_state())
    assert torch.equal(next_draw, eager_next)


@pytest.mark.parametrize("name", FAMILIES)
def test_counter_mode_follows_the_generator_each_random_op_was_given(name):
    one, two = _counter(_Drawn, name, 1), _counter(_Drawn, name, 2)
    # Another default generator and another counter seed: the same weights.
    again = _counter(_Drawn, name, 1, seed=123, counter_seed=99)
    assert torch.equal(one.w, again.w) and torch.equal(one.v, again.v)
    assert not torch.equal(one.w, two.w)
    if name not in ("randperm", "multinomial"):  # a permutation of 6 may repeat
        assert not torch.equal(one.w[:5], one.v)  # the second draw is not the first again


@pytest.mark.parametrize("name", [f for f in FAMILIES if f not in ("randperm", "multinomial")])
def test_shards_of_ops_with_a_generator_concatenate_to_the_counter_model(name):
    full = _counter(_Drawn, name, 5)
    for world in (2, 3):
        parts, _ = _shards(_Drawn, "w", world, name, 5)
        assert torch.equal(torch.cat(parts), full.w.detach())


# --- Construction-time forwards (Note [Writes the schema does not show]).

class _Detector(nn.Module):
    def __init__(self, train):
        super().__init__()
        self.body = nn.Sequential(*[layer for _ in range(4) for layer in (
            nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())])
        self.inorm = nn.InstanceNorm2d(4, track_running_stats=True)
        self.train(train)
        with torch.no_grad():
            self.stride = 64 // self.inorm(self.body(torch.zeros(1, 4, 16, 16))).shape[-1]


def test_an_eval_mode_forward_is_not_in_the_history_of_running_statistics():
    model = torchdefer.deferred_init(_Detector, False)
    for name, buffer in model.named_buffers():
        recorded = torchdefer.explain(buffer)
        assert "batch_norm" not in recorded and "conv" not in recorded, (name, recorded)
    eager, model, eager_next, next_draw = built_both_ways(_Detector, False)
    assert_same_state(eager, model)


def test_a_train_mode_forward_updates_running_statistics_as_in_eager():
    model = torchdefer.deferred_init(_Detector, True)
    assert "batch_norm" in torchdefer.explain(model.body[1].running_mean)
    eager, model, eager_next, next_draw = built_both_ways(_Detector, True)
    assert_same_state(eager, model)
    assert not torch.equal(model.body[1].running_var, torch.ones(4))


# --- Corners found by random programs.

class _DeadSampler(nn.Module):
    def __init__(self):
        super().__init__()
        t0 = torch.randint(-1, 1, (6, 0, 1), dtype=torch.float32)
        t1 = torch.ones(8, 3)
        self.r = float(t0.float().numpy().sum())
        t2 = t0.float()
        nn.init.trunc_normal_(t0, std=0.867)
        t1.diagonal(1).view(-1).log_normal_(0.5, 0.5)
        self.register_buffer("x", t2)


def test_a_full_materialization_pays_for_samplers_nothing_keeps():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        eager, model, eager_next, next_draw = built_both_ways(_DeadSampler)
    assert_same_state(eager, model)
    assert torch.equal(next_draw, eager_next)


class _RealData(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(2, 1)
        self.mha.in_proj_weight.data = torch.arange(12.0).view(6, 2)
        with torch.no_grad():
            self.mha.in_proj_weight[0].mul_(2)
            self.mha.in_proj_weight[2:].add_(1)


@pytest.mark.parametrize("world", (4, 7))
def test_a_parameter_given_real_data_is_this_ranks_padded_chunk(world):
    torch.manual_seed(0)
    full = _RealData().mha.in_proj_weight.detach()
    chunk = -(-6 // world)
    parts, stats = _shards(_RealData, "mha.in_proj_weight", world, padded=True)
    for rank, part in enumerate(parts):
        expected = full[rank * chunk:(rank + 1) * chunk]
        assert part.shape == (chunk, 2)
        assert torch.equal(part[:expected.shape[0]], expected)
        assert not part[expected.shape[0]:].any()


class _AllDead(nn.Module):
    """Every random op from a trunc_normal_ on is dead, and nothing fake is kept."""

    def __init__(self, variant):
        super().__init__()
        nn.init.trunc_normal_(torch.empty(6))
        if variant == "dead_draw_after":
            _ = torch.randn(3)
        if variant == "real_param_after":
            self.p = nn.Parameter(torch.randn(1))
            self.p.data = torch.tensor([1.0, 2.0])


@pytest.mark.parametrize("variant", ("alone", "dead_draw_after", "real_param_after"))
def test_a_recording_that_keeps_no_fake_pays_the_generator_when_it_ends(variant):
    _, _, eager_next, next_draw = built_both_ways(_AllDead, variant)
    assert torch.equal(next_draw, eager_next)


class _ReplacedAfterReturn(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.empty(2, 5))
        self.register_buffer("b", torch.zeros(()))
        nn.init.trunc_normal_(self.w)
        _ = torch.randn(3)


@pytest.mark.parametrize("seed", range(5))
def test_to_empty_after_return_leaves_nothing_owed_once_the_model_is_materialized(seed):
    torch.manual_seed(seed)
    _ReplacedAfterReturn().to_empty(device="cpu")
    expected = torch.get_rng_state()
    torch.manual_seed(seed)
    model = torchdefer.deferred_init(_ReplacedAfterReturn)
    model.to_empty(device="cpu")
    torchdefer.materialize_module(model)
    assert torch.equal(torch.get_rng_state(), expected)


class _KeptForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(2)
        y = self.bn(torch.randn(4, 2))
        self.register_buffer("y", y.detach().clone())


def test_a_train_mode_forward_kept_updates_running_statistics_once_when_materialized_child_first():
    torch.manual_seed(0)
    eager = _KeptForward()
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_KeptForward)
    torchdefer.materialize_module(model.bn)
    torchdefer.materialize_module(model)
    assert_same_state(eager, model)


class _ViewOfADraw(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(640)
        self.register_buffer("order", torch.randperm(18, generator=g).view(2, 9))
        nn.init.trunc_normal_(torch.randn(9, 2).clone())


def test_a_view_kept_as_a_buffer_turns_its_base_real_and_the_generator_is_paid():
    eager, model, eager_next, next_draw = built_both_ways(_ViewOfADraw)
    assert_same_state(eager, model)
    assert not torchdefer._C.is_fake(model.order._base)
    assert torch.equal(next_draw, eager_next)


class _TwoSubs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)


@pytest.mark.parametrize("when", ("constructor", "after_return"))
def test_the_owed_generator_warning_names_samplers_recorded_in_submodules(when, capfd):
    def build():
        model = _TwoSubs()
        if when == "constructor":
            for child in model.children():
                nn.init.trunc_normal_(child.weight)
        return model

    model = torchdefer.deferred_init(build)
    if when == "after_return":
        for child in model.children():
            nn.init.trunc_normal_(child.weight)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.randn(3)  # draws before the owed generator is paid
        torchdefer.materialize_module(model)
    said = capfd.readouterr().err + "".join(str(w.message) for w in caught)
    assert said.count("torchdefer::trunc_normal_ on fake Float[4, 4]") == 2, said


class _RowOfAWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.holder = nn.Module()
        self.holder.register_buffer("row", self.linear.weight[0])


def test_a_buffer_viewing_a_sharded_parameter_leaves_the_parameter_its_shard():
    full = _counter(_RowOfAWeight)
    parts, _ = _shards(_RowOfAWeight, "linear.weight", 2)
    assert torch.equal(torch.cat(parts), full.linear.weight.detach())
