"""Complex parameters in counter RNG mode: filled as their real view (Note [Counter RNG]), so a
shard is its box of the full counter model and the values are those of the real draw ATen makes."""

import math

import pytest
import torch
import torchdefer


class _ComplexNormal(torch.nn.Module):
    def __init__(self, std=2.0, dtype=torch.complex64):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(6, 5, dtype=dtype))
        torch.nn.init.normal_(self.w, mean=0.0, std=std)


class _RealPairs(torch.nn.Module):
    """The real view of _ComplexNormal(std=√2): one normal draw of std 1 over [6, 5, 2]."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(6, 5, 2))
        torch.nn.init.normal_(self.w, mean=0.0, std=1.0)


class _Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(7, 3, dtype=torch.complex64))
        self.b = torch.nn.Parameter(torch.rand(9, dtype=torch.complex128))
        self.c = torch.nn.Parameter(torch.randn(5, 4))


def _counter(factory):
    torch.manual_seed(0)
    model = torchdefer.deferred_init(factory)
    torchdefer.materialize_module(model, rng="counter")
    return model


def test_a_complex_normal_is_the_real_normal_of_its_real_view_with_std_over_root_two():
    complex_model = _counter(lambda: _ComplexNormal(std=math.sqrt(2.0)))
    real_model = _counter(_RealPairs)
    assert torch.equal(torch.view_as_real(complex_model.w.detach()), real_model.w.detach())


def test_complex_parameters_have_the_variance_eager_gives_them():
    model = _counter(lambda: _ComplexNormal(std=2.0))
    parts = torch.view_as_real(model.w.detach())
    # 30 complex values of variance 4: each part has variance 2 (std √2); loose, deterministic.
    assert 0.7 < parts.std().item() < 2.5
    assert model.w.dtype == torch.complex64


@pytest.mark.parametrize("world", [2, 3, 7])
def test_complex_shards_are_their_boxes_of_the_full_counter_model(world):
    full = _counter(_Mixed)
    expected = dict(full.named_parameters())
    for rank in range(world):
        torch.manual_seed(0)
        local = torchdefer.deferred_init(_Mixed)
        torchdefer.materialize_module(local, shard=torchdefer.Shard(rank, world))
        for name, value in local.named_parameters():
            want = expected[name].detach()
            info = torchdefer.shard_info(value)
            if info is not None:
                starts, stops = info["box"]
                want = want[tuple(slice(a, b) for a, b in zip(starts, stops))]
            assert torch.equal(value.detach(), want), (name, rank, world)
