"""torchdefer.compat: FSDP's torchdistX code path, driven by torchdefer (no process group needed)."""

import subprocess
import sys

import pytest
import torch
import torch.distributed.fsdp._init_utils as fsdp_init_utils
import torchdefer
import torchdefer.compat

from test_torchdefer import Gpt2Like, assert_same_state, bitwise_equal, eager_and_deferred


@pytest.fixture
def installed(monkeypatch):
    """install() for one test; sys.modules and FSDP's globals are restored afterwards."""
    for name in ("torchdistx", "torchdistx.deferred_init", "torchdistx.fake"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    for name in ("_TORCHDISTX_AVAIL", "deferred_init", "fake"):
        monkeypatch.setattr(fsdp_init_utils, name, getattr(fsdp_init_utils, name, None), raising=False)
    torchdefer.compat.install()
    return fsdp_init_utils


def test_install_after_fsdp_was_imported_sets_fsdps_cached_import(installed):
    # FSDP imported torchdistX when this test module imported it (Note [FSDP imports torchdistX
    # once]); install() afterwards must still reach it.
    assert installed._TORCHDISTX_AVAIL
    import torchdistx.deferred_init
    import torchdistx.fake

    assert installed.deferred_init is torchdistx.deferred_init
    assert installed.fake is torchdistx.fake
    assert torchdefer.compat.is_installed()
    torchdefer.compat.install()  # idempotent
    assert sys.modules["torchdistx.fake"] is torchdistx.fake


def test_install_before_fsdp_is_imported():
    program = (
        "import sys, torchdefer.compat\n"
        "torchdefer.compat.install()\n"
        "assert 'torch.distributed.fsdp' not in sys.modules\n"
        "import torch.distributed.fsdp._init_utils as u\n"
        "assert u._TORCHDISTX_AVAIL and u.fake.is_fake is __import__('torchdefer').is_fake\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_real_torchdistx_is_not_replaced_silently(monkeypatch):
    import types

    monkeypatch.setitem(sys.modules, "torchdistx", types.ModuleType("torchdistx"))
    with pytest.raises(RuntimeError, match="replace=True"):
        torchdefer.compat.install()


class Block(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.up = torch.nn.Linear(dim, 2 * dim)
        self.down = torch.nn.Linear(2 * dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.register_buffer("scale", torch.rand(dim))


class Net(torch.nn.Module):
    def __init__(self, dim=16, blocks=3):
        super().__init__()
        self.embed = torch.nn.Embedding(40, dim)
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(blocks))
        self.inner = torch.nn.Sequential(Block(dim), torch.nn.Linear(dim, dim))
        self.head = torch.nn.Linear(dim, 7)


def test_fsdps_bottom_up_calls_give_eager_values_and_never_redo_a_unit(installed):
    # What FSDP1 with an auto-wrap policy does: each Block is a unit, wrapped (and materialized)
    # first, innermost first; each parent's check_fn stops at units already wrapped.
    eager, deferred = eager_and_deferred(Net)
    units = [deferred.inner[0], *deferred.blocks, deferred.inner, deferred]
    wrapped = set()
    pointers = {}
    for unit in units:
        is_meta, is_deferred = installed._need_to_materialize_module(unit, set(), set())
        assert (is_meta, is_deferred) == (False, True)
        installed.deferred_init.materialize_module(unit, check_fn=lambda m: m not in wrapped)
        assert not torchdefer.is_deferred(unit)
        for done in wrapped:
            for name, tensor in done.state_dict(keep_vars=True).items():
                assert tensor.data_ptr() == pointers[done, name], "a wrapped unit was redone"
        wrapped.add(unit)
        pointers.update({(unit, n): t.data_ptr() for n, t in unit.state_dict(keep_vars=True).items()})
    assert_same_state(eager, deferred)


def test_check_fn_skips_what_fsdp_manages_itself(installed):
    _, deferred = eager_and_deferred(Net)
    ignored = deferred.blocks[1]
    installed.deferred_init.materialize_module(deferred, check_fn=lambda m: m is not ignored)
    assert torchdefer.is_deferred(ignored) and not torchdefer.is_deferred(deferred.blocks[0])
    assert not torchdefer.is_fake(deferred.head.weight)


def test_the_torchdistx_api_surface(installed):
    import torchdistx.deferred_init as tdx
    import torchdistx.fake as fake

    torch.manual_seed(2)
    eager = Gpt2Like()
    torch.manual_seed(2)
    model = tdx.deferred_init(Gpt2Like)
    assert tdx.is_deferred(model) and fake.is_fake(model.wte.weight)
    tdx.materialize_module(model, buffers_only=True)
    assert not fake.is_fake(model.mask) and fake.is_fake(model.wte.weight)
    weight = model.wte.weight
    assert tdx.materialize_tensor(weight) is weight and bitwise_equal(weight, eager.wte.weight)
    tdx.materialize_module(model)
    assert model.lm_head.weight is model.wte.weight
    assert_same_state(eager, model)
    with fake.fake_mode():
        assert fake.is_fake(torch.ones(3))
