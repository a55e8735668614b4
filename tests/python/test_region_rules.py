"""Region replay's rules under Shard(rank, W): writes through single elements and views, tensors
that were real at record time, and tensors made by cat and stack. For every world size and both
shard dimensions, the shards concatenate bit for bit to the full counter-mode model."""

import pytest
import torch
import torchdefer
from torch import nn


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))
    )


def record(make, seed=0):
    torch.manual_seed(seed)
    return torchdefer.deferred_init(make)


def assert_shards_concatenate(make, world, dim):
    """Materializes `make`'s module whole (counter mode) and as each of `world` shards along
    `dim`; returns every rank's stats."""
    full = record(make)
    torchdefer.materialize_module(full, rng="counter")
    expected = dict(full.named_parameters())
    pieces = {name: [] for name in expected}
    all_stats = []
    for rank in range(world):
        local = record(make)
        parameters = dict(local.named_parameters())
        stats = torchdefer.materialize_module(local, shard=torchdefer.Shard(rank, world, dim=dim))
        all_stats.append(stats)
        assert {s["name"] for s in stats} >= set(expected), "a parameter is missing from the stats"
        for name, parameter in local.named_parameters():
            assert parameter is parameters[name], f"{name} is not the same Parameter object"
            assert not torchdefer.is_fake(parameter), name
            if parameter.dim() > dim and world > 1:
                info = torchdefer.shard_info(parameter)
                assert info is not None, name
                assert list(info["global_shape"]) == list(expected[name].shape), name
            pieces[name].append(parameter.detach())
    for name, whole in expected.items():
        joined = torch.cat(pieces[name], dim) if whole.dim() > dim else pieces[name][0]
        assert bitwise_equal(joined, whole.detach()), f"{name} dim {dim} world {world}"
    return all_stats


WORLDS = [1, 2, 3, 7]
DIMS = [0, 1]


# --- issue 11 class 4: writes through single elements ---------------------------------------------


class ElementWrites(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.randn(8, 6))
        self.p.data[5].zero_()
        self.bias = nn.Parameter(torch.randn(12))
        self.bias.data[8].random_(51)
        self.bias.data[-3].exponential_()
        self.t = nn.Parameter(torch.randn(5, 4))
        self.t.data.reshape(-1)[1].geometric_(0.1)
        self.w = nn.Parameter(torch.empty(6, 3, 3))
        nn.init.dirac_(self.w)
        self.grouped = nn.Parameter(torch.empty(8, 2, 3, 3))
        nn.init.dirac_(self.grouped, groups=2)
        self.selects = nn.Parameter(torch.rand(7, 5, 3))
        with torch.no_grad():
            self.selects[-1].fill_(3.0)
            self.selects[:, -2].normal_()
            self.selects[:, :, 2].zero_()
            self.selects[2, -1, 0] = 9.0
            self.selects[-2][1][1].uniform_(5, 6)
            self.selects.transpose(0, 2)[1, 3].mul_(-1)
        self.nested = nn.Parameter(torch.randn(7, 5))
        with torch.no_grad():
            self.nested[1:6].t()[2][3].fill_(7.0)
            self.nested.t()[1][2:5].mul_(2)
            self.nested.view(35)[17].cauchy_()
            self.nested.unsqueeze(0)[0, -1, -1].log_normal_()
        self.indexed = nn.Parameter(torch.randn(7, 4))
        with torch.no_grad():
            self.indexed[torch.tensor([2, 6])] = 0.25
            self.indexed.index_fill_(1, torch.tensor([0, 3]), 1.5)
            self.indexed[torch.tensor([1, -1]), torch.tensor([2, 1])].zero_()  # a copy: no effect
        self.strided = nn.Parameter(torch.randn(6, 6))
        with torch.no_grad():
            self.strided.as_strided((2, 3), (6, 1), 7).fill_(3.0)
            self.strided.as_strided((), (), 20).fill_(-2.0)
            self.strided.as_strided((3,), (7,), 0).bernoulli_(0.5)
            self.strided.diagonal().add_(1.0)
            self.strided.unfold(0, 2, 2).select(2, 1).uniform_()
            self.strided.view(36)[3:9].fill_(4.0)


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("world", WORLDS)
def test_element_writes_shard_into_the_full_counter_model(world, dim):
    assert_shards_concatenate(ElementWrites, world, dim)


def test_element_writes_outside_a_rank_slice_do_not_reach_it():
    # The rank holding rows [0, 4) of `p` never sees row 5's zero_ (Note [Views that miss the
    # region]); the rank holding [4, 8) sees it at its own row 1.
    stats = assert_shards_concatenate(ElementWrites, 2, 0)
    for rank_stats in stats:
        for name in ("p", "bias", "t", "w", "selects", "nested"):
            entry = next(s for s in rank_stats if s["name"] == name)
            assert entry["sliced"] and entry["fallback"] == "", entry


def test_writes_through_views_that_are_no_box_fall_back_whole_and_say_so():
    stats = assert_shards_concatenate(ElementWrites, 3, 0)
    strided = next(s for s in stats[1] if s["name"] == "strided")
    assert not strided["sliced"]
    assert "through a view that is not a box" in strided["fallback"]
    indexed = next(s for s in stats[1] if s["name"] == "indexed")
    assert not indexed["sliced"] and "index" in indexed["fallback"], indexed


# --- issue 11 class 7: parameters that were real at record time -----------------------------------


class RealParameters(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([0.5, 2.0]))
        self.linear = nn.Linear(4, 6)
        read = self.linear.weight.detach().sum(1).tolist()  # values read while recording
        self.table = nn.Parameter(torch.tensor([read, [2 * v for v in read], [1.0] * 6]).t().contiguous())
        self.gain = nn.Parameter(self.scale.detach()[1] * self.linear.weight.detach())
        self.register_buffer("steps", torch.tensor([3, 4, 5]))


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("world", WORLDS)
def test_real_parameters_are_sharded_in_place_and_reported(world, dim):
    all_stats = assert_shards_concatenate(RealParameters, world, dim)
    for stats in all_stats:
        table = next(s for s in stats if s["name"] == "table")
        assert table["fallback"] == "real at record time", table
        assert (table["box"] is not None) == (world > 1), table
        assert "steps" not in {s["name"] for s in stats}  # buffers stay whole, as before


def test_a_real_parameter_read_after_it_was_sliced_fails_with_a_message():
    class ReadLater(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.tensor([0.5, 2.0, 4.0]))
            self.child = nn.Module()
            with torch.no_grad():
                self.child.weight = nn.Parameter(torch.randn(4, 3) * self.scale)

    model = record(ReadLater)
    torchdefer.materialize_module(model, shard=torchdefer.Shard(0, 2), check_fn=lambda m: False)
    with pytest.raises(RuntimeError, match="sliced by a sharded materialization"):
        torchdefer.materialize_module(model.child, shard=torchdefer.Shard(0, 2))
    assert torchdefer.is_fake(model.child.weight)


def test_materializing_twice_leaves_sliced_real_parameters_alone():
    model = record(RealParameters)
    torchdefer.materialize_module(model, shard=torchdefer.Shard(1, 2))
    scale = model.scale.detach().clone()
    assert torchdefer.materialize_module(model, shard=torchdefer.Shard(1, 2)) == []
    assert bitwise_equal(model.scale.detach(), scale)


# --- issue 14 item 4: cat and stack ----------------------------------------------------------------


class FusedQkv(nn.Module):
    """torch.cat of three initialized projections into one Parameter, and separate inits into
    views of one tensor."""

    def __init__(self, dim=12):
        super().__init__()
        q, k, v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        nn.init.normal_(k.weight, std=0.02)
        self.qkv = nn.Parameter(torch.cat([q.weight, k.weight, v.weight]))
        self.qkv_bias = nn.Parameter(torch.cat([q.bias, k.bias, torch.zeros(dim)]))
        self.out = nn.Parameter(torch.empty(dim, 3 * dim))
        nn.init.xavier_uniform_(self.out[:, :dim])
        nn.init.kaiming_uniform_(self.out[:, dim : 2 * dim], a=5**0.5)
        nn.init.zeros_(self.out[:, 2 * dim :])
        self.heads = nn.Parameter(torch.stack([torch.randn(dim, 4) * 0.1 for _ in range(3)], dim=1))
        self.mixed = nn.Parameter(torch.cat([torch.rand(5, 2), torch.randn(5, 3, dtype=torch.float64)], dim=-1))
        parts = torch.randn(dim, 9).split([2, 3, 4], dim=1)
        self.split = nn.Parameter(torch.cat([parts[2], parts[0] * 2], dim=1))
        chunks = torch.rand(3 * dim, 5).chunk(3)
        self.chunked = nn.Parameter(chunks[1].clone())
        self.unbound = nn.Parameter(torch.stack(torch.randn(4, dim, 6).unbind(0)[::-1], dim=2))


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("world", WORLDS)
def test_concatenated_and_stacked_parameters_are_computed_only_in_their_slice(world, dim):
    for stats in assert_shards_concatenate(FusedQkv, world, dim):
        for entry in stats:
            if entry["box"] is None:
                continue
            assert entry["sliced"] and entry["fallback"] == "", entry
            # Each part costs its region (and a pointwise op's input region, `randn(...) * 0.1`),
            # plus the concatenation when the slice spans several parts: never the whole tensor.
            limit = 2 if entry["name"] in ("qkv", "out") else 3
            assert entry["bytes_computed"] <= limit * entry["bytes_kept"], entry


def test_a_fused_slice_inside_one_projection_costs_only_the_slice():
    # Rows [12, 24) of qkv are k's weight exactly: that part is computed once, nothing else.
    model = record(FusedQkv)
    stats = torchdefer.materialize_module(model, shard=torchdefer.Shard(1, 3))
    qkv = next(s for s in stats if s["name"] == "qkv")
    assert qkv["sliced"] and qkv["bytes_computed"] == qkv["bytes_kept"] == 12 * 12 * 4, qkv
