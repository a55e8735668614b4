"""Where a call is recorded (Note [Where an op is recorded], Note [Composite ops under
autocast]): calls made inside a TorchDispatchMode or a subclass's __torch_dispatch__ are recorded
as eager runs them, and composite ops under autocast replay in the dtypes eager computed them in."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import torchdefer
from test_recording_state import assert_same_state, eager_and_materialized


class PassThrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class DoublesResults(TorchDispatchMode):
    """A mode that changes what construction computes: eager's values are the doubled ones."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.randn.default:
            return out * 2
        return out


def _modes():
    return [PassThrough, lambda: FlopCounterMode(display=False), DoublesResults]


@pytest.mark.parametrize("mode", _modes(), ids=["pass_through", "flop_counter", "doubles"])
def test_in_place_initialization_inside_a_dispatch_mode_is_recorded(mode):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            with mode():
                torch.nn.init.normal_(self.lin.weight, std=5.0)
                torch.nn.init.zeros_(self.lin.bias)
                self.register_buffer("noise", torch.randn(3))

    assert_same_state(*eager_and_materialized(M))


@pytest.mark.parametrize("mode", _modes(), ids=["pass_through", "flop_counter", "doubles"])
def test_a_draw_inside_a_dispatch_mode_moves_the_generator_for_later_parameters(mode):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            with mode():
                torch.randn(100)
            self.w = torch.nn.Parameter(torch.randn(4))

    assert_same_state(*eager_and_materialized(M))


def test_deferred_init_under_an_outer_dispatch_mode_matches_eager():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.emb = torch.nn.Embedding(5, 4)
            torch.nn.init.zeros_(self.lin.bias)

    torch.manual_seed(1)
    with FlopCounterMode(display=False):
        eager = M()
    torch.manual_seed(1)
    with FlopCounterMode(display=False):
        deferred = torchdefer.deferred_init(M)
    torchdefer.materialize_module(deferred)
    assert_same_state(eager, deferred)


def test_a_write_after_return_inside_a_dispatch_mode_is_recorded():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

    torch.manual_seed(2)
    eager = M()
    with PassThrough():
        eager.lin.bias.data.fill_(0.5)
    torch.manual_seed(2)
    deferred = torchdefer.deferred_init(M)
    with PassThrough():
        deferred.lin.bias.data.fill_(0.5)
    torchdefer.materialize_module(deferred)
    assert_same_state(eager, deferred)


_UNDER_AUTOCAST = {
    "linear": lambda a, b: F.linear(a, b),
    "matmul": lambda a, b: a @ b.t(),
    "einsum": lambda a, b: torch.einsum("ij,kj->ik", a, b) + torch.zeros(4, 4),
    "linalg_vecdot": lambda a, b: torch.linalg.vecdot(a, b),
    "sdpa": lambda a, b: F.scaled_dot_product_attention(a[None], b[None], b[None]),
    "conv2d": lambda a, b: F.conv2d(a.reshape(1, 2, 4, 4), b.reshape(4, 2, 2, 2)),
    "mm": lambda a, b: torch.mm(a, b.t()),
    # _trilinear's kernel runs bmm below the recorder, which autocast casts in eager.
    "bilinear": lambda a, b: F.bilinear(a, b, torch.randn(3, 8, 8)),
}


@pytest.mark.parametrize("name", sorted(_UNDER_AUTOCAST))
def test_a_composite_op_under_autocast_replays_in_eagers_dtype(name):
    compute = _UNDER_AUTOCAST[name]

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            a, b = torch.randn(4, 8), torch.randn(4, 8)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                self.register_buffer("out", compute(a, b))

    eager, deferred = eager_and_materialized(M)
    if name in ("linear", "matmul", "mm", "sdpa", "conv2d"):
        assert eager.out.dtype == torch.bfloat16  # autocast did change eager's computation
    assert_same_state(eager, deferred)


def test_a_kernel_dispatching_under_float16_autocast_replays_under_it():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            a, b = torch.randn(4, 8), torch.randn(4, 8)
            with torch.autocast("cpu", dtype=torch.float16):
                self.register_buffer("out", F.bilinear(a, b, torch.randn(3, 8, 8)))
                self.register_buffer("mm", torch.mm(a, b.t()))

    eager, deferred = eager_and_materialized(M)
    assert eager.mm.dtype == torch.float16
    assert_same_state(eager, deferred)
    assert not torch.is_autocast_enabled("cpu")


def test_more_than_two_autocast_device_types_are_refused_while_recording():
    if not torch.amp.is_autocast_available("xpu") or not torch.amp.is_autocast_available("mps"):
        pytest.skip("this torch build has no autocast for xpu or mps")

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            with torch.autocast("cpu"), torch.autocast("xpu"), torch.autocast("mps"):
                self.w = torch.nn.Parameter(torch.randn(3))

    with pytest.raises(RuntimeError, match="more than two device types"):
        torchdefer.deferred_init(M)


class ReplacesParts(TorchDispatchMode):
    """A mode that computes something else for the parts of composites (addmm under linear)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.uniform_.default:
            return args[0].fill_(0.25)
        if func is torch.ops.aten.addmm.default:
            return func(*args, **kwargs) * 2
        return func(*args, **kwargs)


def test_a_composite_op_under_a_dispatch_mode_records_what_the_mode_computed():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            with ReplacesParts():
                self.lin = torch.nn.Linear(3, 3)
                self.register_buffer("y", self.lin(torch.ones(2, 3)).detach())

    assert_same_state(*eager_and_materialized(M))


def test_a_replay_under_autocast_leaves_autocasts_dtype_as_it_was():
    def build():
        m = torch.nn.Linear(4, 4)
        with torch.autocast("cpu", dtype=torch.float16):
            h = m.weight * 3
        assert h.float().abs().sum().item() > -1  # a read replays h's nodes under float16
        with torch.autocast("cpu"):  # autocast's default dtype: bfloat16
            m.register_buffer("y", m(torch.ones(2, 4)).detach())
        return m

    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build)
    assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert deferred.y.dtype == eager.y.dtype == torch.bfloat16
    torchdefer.materialize_module(deferred)
    assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")
    assert_same_state(eager, deferred)


def test_a_forward_in_the_autocast_region_of_deferred_init_uses_the_real_parameters():
    def build():
        lin = torch.nn.Linear(4, 4)
        lin(torch.ones(2, 4))  # autocast caches the cast of the fake weight
        return lin

    x = torch.ones(2, 4)
    torch.manual_seed(0)
    with torch.autocast("cpu"):
        eager = build()
        expected = eager(x)
    torch.manual_seed(0)
    with torch.autocast("cpu"):
        deferred = torchdefer.deferred_init(build)
        torchdefer.materialize_module(deferred)
        got = deferred(x)
    assert not torchdefer.is_fake(got)
    assert torch.equal(expected, got)
