"""Ops the op table describes, against eager: random ops whose draws torch mode must place
(issue #11 class 5), ops with data-dependent output shapes while recording (class 6), and
size-0 tensors (class 12)."""

import re

import pytest
import torch
import torch.nn as nn

import torchdefer

# Random ops whose draw counts are not a plain per-element rule: each runs inside a module's
# construction between two ordinary random ops, with its output kept or dropped.
_RANDOM_OPS = {
    "randn_like_small": lambda x: torch.randn_like(x[:4]),
    "randn_like_noncontiguous": lambda x: torch.randn_like(x.view(4, 5).t()),
    "normal_tensor_tensor_small": lambda x: torch.normal(x[:4], torch.ones(4)),
    "normal_tensor_tensor": lambda x: torch.normal(x, x.abs()),
    "normal_tensor_float_small": lambda x: torch.normal(x[:5], 2.0),
    "bernoulli_tensor": lambda x: torch.bernoulli(x.sigmoid()),
    "bernoulli_double_tensor": lambda x: torch.bernoulli(x.sigmoid().double()),
    "bernoulli_in_place_tensor_p": lambda x: torch.empty(6).bernoulli_(x[:6].sigmoid()),
    "bernoulli_in_place_double_p": lambda x: torch.empty(4, 5).bernoulli_(x.sigmoid().double()[:5]),
    "bernoulli_scalar": lambda x: torch.bernoulli(x, 0.3),
    "poisson": lambda x: torch.poisson(x.abs() * 5),
    "multinomial": lambda x: torch.multinomial(x.abs() + 0.1, 3).float(),
    "multinomial_replacement": lambda x: torch.multinomial(x.abs() + 0.1, 7, True).float(),
    "dropout": lambda x: torch.nn.functional.dropout(x, 0.5),
    "alpha_dropout": lambda x: torch.nn.functional.alpha_dropout(x, 0.5, training=True),
    "dropout2d": lambda x: torch.nn.functional.dropout2d(x.view(1, 4, 5), 0.5),
    "rrelu": lambda x: torch.nn.functional.rrelu(x, training=True),
    "randint_like": lambda x: torch.randint_like(x, 10),
    "exponential": lambda x: x.clone().exponential_(),
    "log_normal": lambda x: x.clone().log_normal_(),
}


def _module(op, keep):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            x = torch.randn(20)
            y = op(x)
            if keep:
                self.register_buffer("y", y)
            self.register_buffer("after", torch.randn(20))
            self.register_buffer("uniform_after", torch.rand(3))

    return M


@pytest.mark.parametrize("keep", [False, True], ids=["output_unused", "output_used"])
@pytest.mark.parametrize("name", sorted(_RANDOM_OPS))
def test_random_ops_leave_the_generator_where_eager_does(name, keep):
    cls = _module(_RANDOM_OPS[name], keep)
    torch.manual_seed(0)
    eager = cls()
    eager_next = torch.randn(5)
    torch.manual_seed(0)
    module = torchdefer.deferred_init(cls)
    deferred_next = torch.randn(5)
    assert torch.equal(deferred_next, eager_next)
    torchdefer.materialize_module(module)
    for (key, expected), (_, actual) in zip(eager.named_buffers(), module.named_buffers()):
        assert torch.equal(actual, expected), key
    # Materializing again in counter mode works too, whether or not the op has a counter sampler.
    torch.manual_seed(0)
    counter = torchdefer.deferred_init(cls)
    torchdefer.materialize_module(counter, rng="counter")
    assert counter.after.shape == eager.after.shape


def test_random_op_needing_values_of_another_recording_is_refused_while_recording():
    torch.manual_seed(0)
    rates = torchdefer.deferred_init(lambda: torch.rand(4) * 3)
    with pytest.raises(RuntimeError, match="aten::poisson"):
        torchdefer.deferred_init(lambda: torch.poisson(rates))


def _mask_module(op):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            t = torch.randn(4, 5)
            self.register_buffer("x", op(t).float())
            self.register_buffer("after", torch.randn(3))

    return M


_DYNAMIC_SHAPE_OPS = {
    "boolean_mask": lambda t: t[t > 0],
    "boolean_mask_rows": lambda t: t[t[:, 0] > 0],
    "byte_mask": lambda t: t[(t > 0).to(torch.uint8).bool()],
    "masked_select": lambda t: torch.masked_select(t, t > 0),
    "nonzero": lambda t: torch.nonzero(t > 0),
    "argwhere": lambda t: torch.argwhere(t > 0),
    "unique": lambda t: torch.unique((t > 0).long()),
    "unique_consecutive": lambda t: torch.unique_consecutive((t > 0).long()),
    "repeat_interleave_fake_repeats": lambda t: torch.repeat_interleave(
        torch.arange(20.0), (t.flatten() > 0).long()
    ),
    "repeat_interleave_tensor": lambda t: torch.repeat_interleave((t.flatten() > 0).long()),
    "one_hot": lambda t: torch.nn.functional.one_hot((t > 0).long().flatten()),
    "bincount": lambda t: torch.bincount((t > 0).long().flatten()),
    "integer_index": lambda t: t[torch.tensor([0, 2])],
    "fake_integer_index": lambda t: t[(t[:, 0] > 0).long()],
    "mask_assignment": lambda t: t.clone().masked_fill_(t > 0, 0.0),
    "mask_setitem": lambda t: t.clone().index_put_((t > 0,), torch.tensor(1.0)),
}


@pytest.mark.parametrize("name", sorted(_DYNAMIC_SHAPE_OPS))
def test_ops_with_data_dependent_shapes_read_values_while_recording(name):
    cls = _mask_module(_DYNAMIC_SHAPE_OPS[name])
    torch.manual_seed(0)
    eager = cls()
    torch.manual_seed(0)
    module = torchdefer.deferred_init(cls)
    torchdefer.materialize_module(module)
    assert torch.equal(module.x, eager.x)
    assert torch.equal(module.after, eager.after)


def test_boolean_mask_on_a_fake_after_recording_gives_eagers_values():
    # Issue 12 item 3: the read replays privately after deferred_init returned, too.
    torch.manual_seed(0)
    eager = torch.randn(4)
    torch.manual_seed(0)
    t = torchdefer.deferred_init(lambda: torch.randn(4))
    masked = t[t > 0]
    assert not torchdefer.is_fake(masked) and torch.equal(masked, eager[eager > 0])
    with torchdefer.fake_mode():
        foreign = torch.randn(4)
    with pytest.raises(RuntimeError, match="boolean mask"):
        foreign[foreign > 0]


_EMPTY_OPS = {
    "randint": lambda: torch.randint(0, 5, (0,)).float(),
    "random_int32": lambda: torch.empty(0, dtype=torch.int32).random_(0, 7).float(),
    "random_int64": lambda: torch.empty(0, 3, dtype=torch.long).random_().float(),
    "normal_int64": lambda: torch.empty(0, dtype=torch.long).normal_().float(),
    "exponential_int32": lambda: torch.empty(0, dtype=torch.int32).exponential_().float(),
    "log_normal_uint8": lambda: torch.empty(0, dtype=torch.uint8).log_normal_().float(),
    "geometric_bool": lambda: torch.empty(0, dtype=torch.bool).geometric_(0.5).float(),
    "bernoulli_tensor_p_int": lambda: torch.empty(0, dtype=torch.int32)
    .bernoulli_(torch.full((0,), 0.5))
    .float(),
    "uniform": lambda: torch.empty(0, 4).uniform_(),
    "normal": lambda: torch.empty(4, 0).normal_(),
    "trunc_normal_int": lambda: nn.init.trunc_normal_(torch.empty(0, dtype=torch.int32)).float(),
    "trunc_normal": lambda: nn.init.trunc_normal_(torch.empty(0, 4)),
    "matmul_empty_rows": lambda: torch.randn(0, 3) @ torch.randn(3, 4),
    "matmul_empty_inner": lambda: torch.randn(4, 0) @ torch.randn(0, 4),
    "linear_no_inputs": lambda: nn.Linear(0, 4).weight.detach(),
    "linear_no_outputs": lambda: nn.Linear(4, 0).weight.detach(),
    "embedding_no_rows": lambda: nn.Embedding(0, 4).weight.detach(),
}


def _empty_module(op):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.x = nn.Parameter(op(), requires_grad=False)
            self.after = nn.Parameter(torch.randn(6, 2))

    return M


def _chunk(t, rank, world):
    """Rank `rank`'s torch.chunk of `t` along dim 0 (empty past the end)."""
    size = t.shape[0]
    rows = -(-size // world)
    start = min(rank * rows, size)
    return t.narrow(0, start, min(rows, size - start))


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")
@pytest.mark.parametrize("name", sorted(_EMPTY_OPS))
def test_size_zero_tensors_materialize_as_eager_in_both_modes_and_sharded(name):
    cls = _empty_module(_EMPTY_OPS[name])
    torch.manual_seed(0)
    eager = cls()
    torch.manual_seed(0)
    module = torchdefer.deferred_init(cls)
    torchdefer.materialize_module(module)
    assert torch.equal(module.x, eager.x) and torch.equal(module.after, eager.after)
    torch.manual_seed(0)
    full = torchdefer.deferred_init(cls)
    torchdefer.materialize_module(full, rng="counter")
    assert full.x.shape == eager.x.shape
    for world in (2, 3):
        for rank in range(world):
            torch.manual_seed(0)
            shard = torchdefer.deferred_init(cls)
            torchdefer.materialize_module(shard, shard=torchdefer.Shard(rank, world))
            for key in ("x", "after"):
                expected = _chunk(getattr(full, key), rank, world)
                assert torch.equal(getattr(shard, key), expected), (key, rank, world)


_FILLS_EAGER_REFUSES = {
    "normal_int64": lambda: torch.empty(3, dtype=torch.long).normal_(),
    "normal_negative_std": lambda: torch.empty(3).normal_(0.0, -1.0),
    "uniform_from_above_to": lambda: torch.empty(3).uniform_(2.0, 1.0),
    "bernoulli_p_above_one": lambda: torch.empty(3).bernoulli_(2.0),
    "random_bool_past_range": lambda: torch.empty(3, dtype=torch.bool).random_(0, 3),
    "exponential_negative_lambda": lambda: torch.empty(3).exponential_(-1.0),
    "normal_into_overlapping_elements": lambda: torch.empty(3).expand(2, 3).normal_(),
}


@pytest.mark.parametrize("name", sorted(_FILLS_EAGER_REFUSES))
def test_random_fills_of_fakes_raise_eagers_error_and_leave_the_generator_alone(name):
    # Note [Random fills skip the meta kernel]: the arguments are checked by the CPU kernel.
    fill = _FILLS_EAGER_REFUSES[name]
    with pytest.raises(Exception) as eager:
        fill()
    state = torch.get_rng_state()
    with torchdefer.fake_mode(), pytest.raises(type(eager.value)) as faked:
        fill()
    assert str(faked.value).startswith(str(eager.value).split("\n")[0])
    assert torch.equal(torch.get_rng_state(), state)
    with pytest.raises(type(eager.value), match=re.escape(str(eager.value).split("\n")[0][:60])):
        torchdefer.deferred_init(fill)


def test_random_fills_of_fakes_record_and_materialize_as_eager():
    def build():
        w = torch.empty(5, 3)
        w.normal_(0.0, 0.02).uniform_(-1.0, 1.0).exponential_(2.0)
        return torch.stack([w, torch.empty(5, 3, dtype=torch.float64).cauchy_().float()])

    torch.manual_seed(0)
    eager, eager_next = build(), torch.rand(2)
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build)
    assert torch.equal(torch.rand(2), eager_next)
    torchdefer.materialize_tensor(deferred)
    assert torch.equal(deferred, eager)
