"""torchdefer.compat as torchdistX: every public name of torchdistx.deferred_init and
torchdistx.fake, with torchdistX's documented behaviour (docs/torchdistx.md lists where torchdefer
deliberately differs), and a torchdistx package that imports like an installed one."""

import importlib.util
import subprocess
import sys

import pytest
import torch
import torchdefer
import torchdefer.compat

from test_torchdefer import assert_same_state, bitwise_equal


@pytest.fixture
def tdx(monkeypatch):
    """install() for one test; sys.modules is restored afterwards. Returns the package."""
    for name in ("torchdistx", "torchdistx.deferred_init", "torchdistx.fake"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    torchdefer.compat.install()
    import torchdistx

    return torchdistx


class TwoParams(torch.nn.Module):
    def __init__(self, width=5, scale=1.0):
        super().__init__()
        self.param1 = torch.nn.Parameter(torch.rand(width) * scale)
        self.param2 = torch.nn.Parameter(torch.randn(width))


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.param1 = torch.nn.Parameter(torch.rand(5))
        self.param2 = self.param1


class Leaf(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 3))
        self.register_buffer("running", torch.rand(3))


class Tree(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Leaf()
        self.mid = torch.nn.Sequential(Leaf(), Leaf())
        self.bias = torch.nn.Parameter(torch.rand(3))


def eager_and_tdx(tdx, make, *args, **kwargs):
    torch.manual_seed(0)
    eager = make(*args, **kwargs)
    torch.manual_seed(0)
    return eager, tdx.deferred_init.deferred_init(make, *args, **kwargs)


# --- torchdistx.deferred_init -------------------------------------------------------------------


def test_every_public_name_imports(tdx):
    from torchdistx.deferred_init import deferred_init, is_deferred, materialize_module, materialize_tensor
    from torchdistx.fake import fake_mode, is_fake, meta_like

    assert sorted(tdx.deferred_init.__all__) == [
        "deferred_init", "is_deferred", "materialize_module", "materialize_tensor"]
    assert sorted(tdx.fake.__all__) == ["fake_mode", "is_fake", "meta_like"]
    assert all(callable(f) for f in (deferred_init, is_deferred, materialize_module,
                                     materialize_tensor, fake_mode, is_fake, meta_like))


def test_materialize_tensor_returns_a_real_tensor_itself(tdx):
    real = torch.ones(10)
    assert tdx.deferred_init.materialize_tensor(real) is real


def test_materialize_tensor_gives_one_tensor_for_tied_parameters(tdx):
    eager, module = eager_and_tdx(tdx, Tied)
    materialize = tdx.deferred_init.materialize_tensor
    a = materialize(module.param1)
    b = materialize(module.param1)
    c = materialize(module.param2)
    assert a is b and a is c and not tdx.fake.is_fake(a)
    assert bitwise_equal(a, eager.param1)


def test_module_fn_is_accepted_as_a_keyword(tdx):
    eager, _ = eager_and_tdx(tdx, TwoParams, 4, scale=2.0)
    torch.manual_seed(0)
    module = tdx.deferred_init.deferred_init(module_fn=TwoParams, width=4, scale=2.0)
    assert tdx.fake.is_fake(module.param1) and module.param1.shape == (4,)
    tdx.deferred_init.materialize_module(module)
    assert_same_state(eager, module)


def test_is_deferred_of_a_module_follows_its_tensors(tdx):
    d = tdx.deferred_init
    assert not d.is_deferred(TwoParams())
    module = d.deferred_init(TwoParams)
    assert d.is_deferred(module)
    d.materialize_module(module)
    assert not d.is_deferred(module)

    module = d.deferred_init(TwoParams)
    module.param1 = d.materialize_tensor(module.param1)
    assert d.is_deferred(module)
    module.param2 = d.materialize_tensor(module.param2)
    assert not d.is_deferred(module)


def test_is_deferred_of_a_tensor_is_whether_materializing_can_make_it_real(tdx):
    d = tdx.deferred_init
    module = d.deferred_init(TwoParams)
    with tdx.fake.fake_mode():
        unrecorded = torch.ones(3)
    assert d.is_deferred(module.param1)
    assert not d.is_deferred(torch.ones(3))
    assert tdx.fake.is_fake(unrecorded) and not d.is_deferred(unrecorded)
    d.materialize_tensor(module.param1)
    assert not d.is_deferred(module.param1)


def test_is_deferred_refuses_what_is_neither_tensor_nor_module(tdx):
    with pytest.raises(ValueError, match="torch.Tensor or an nn.Module, got list"):
        tdx.deferred_init.is_deferred([torch.ones(1)])


def test_materialize_module_gives_eager_values_and_a_second_call_does_nothing(tdx):
    eager, module = eager_and_tdx(tdx, Tree)
    assert tdx.deferred_init.materialize_module(module) is None
    assert_same_state(eager, module)
    pointers = [t.data_ptr() for t in module.state_dict().values()]
    tdx.deferred_init.materialize_module(module)
    assert [t.data_ptr() for t in module.state_dict().values()] == pointers


def test_materialize_module_buffers_only_leaves_parameters_fake(tdx):
    eager, module = eager_and_tdx(tdx, Tree)
    tdx.deferred_init.materialize_module(module, buffers_only=True)
    assert all(not tdx.fake.is_fake(b) for b in module.buffers())
    assert all(tdx.fake.is_fake(p) for p in module.parameters())
    assert bitwise_equal(module.mid[1].running, eager.mid[1].running)
    assert tdx.deferred_init.is_deferred(module)


def test_check_fn_decides_for_each_module_children_first_root_included(tdx):
    eager, module = eager_and_tdx(tdx, Tree)
    asked = []

    def check_fn(m):
        asked.append(m)
        return m is not module and m is not module.mid

    tdx.deferred_init.materialize_module(module, check_fn=check_fn)
    # torchdistX's order: each child's subtree before the child, children in order, then the root.
    assert asked == [module.a, module.mid[0], module.mid[1], module.mid, module]
    # A rejected module keeps its own tensors fake; its children are still materialized.
    assert tdx.fake.is_fake(module.bias)
    assert not tdx.fake.is_fake(module.mid[0].weight) and not tdx.fake.is_fake(module.mid[1].running)
    assert bitwise_equal(module.mid[1].weight, eager.mid[1].weight)
    tdx.deferred_init.materialize_module(module)
    assert_same_state(eager, module)


def test_a_failing_check_fn_leaves_every_tensor_fake(tdx):
    _, module = eager_and_tdx(tdx, Tree)

    def check_fn(m):
        if m is module:
            raise KeyError("no")
        return True

    with pytest.raises(KeyError):
        tdx.deferred_init.materialize_module(module, check_fn=check_fn)
    assert all(tdx.fake.is_fake(t) for t in module.state_dict(keep_vars=True).values())


def test_materializing_a_fake_that_nothing_recorded_is_refused(tdx):
    # torchdistX returns such a fake unchanged; torchdefer says why it cannot be made real.
    with tdx.fake.fake_mode():
        unrecorded = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="made under a FakeMode"):
        tdx.deferred_init.materialize_tensor(unrecorded.weight)
    with pytest.raises(RuntimeError, match="made under a FakeMode"):
        tdx.deferred_init.materialize_module(unrecorded)
    assert tdx.fake.is_fake(unrecorded.weight) and tdx.fake.is_fake(unrecorded.bias)


def test_materialize_module_refuses_a_non_module(tdx):
    with pytest.raises(TypeError, match="expects an nn.Module, got Tensor"):
        tdx.deferred_init.materialize_module(torch.ones(2))


# --- torchdistx.fake ----------------------------------------------------------------------------


def test_fake_mode_with_fake_cuda_makes_cuda_fakes_and_keeps_the_default_device(tdx):
    with tdx.fake.fake_mode(fake_cuda=True):
        on_cuda = torch.ones([10], device="cuda")
        default = torch.ones([10])
    assert tdx.fake.is_fake(on_cuda) and on_cuda.device.type == "cuda"
    assert tdx.fake.is_fake(default) and default.device == torch.get_default_device()


def test_fake_mode_without_fake_cuda_refuses_a_cuda_factory_where_cuda_is_unavailable(tdx):
    if torch.cuda.is_available():
        with tdx.fake.fake_mode():
            assert tdx.fake.is_fake(torch.ones([10], device="cuda"))
        return
    with pytest.raises((AssertionError, RuntimeError)):
        with tdx.fake.fake_mode():
            torch.ones([10], device="cuda")
    with tdx.fake.fake_mode():
        assert tdx.fake.is_fake(torch.ones([10]))


def test_cuda_factories_fail_again_after_fake_mode_where_cuda_is_unavailable(tdx):
    with tdx.fake.fake_mode(fake_cuda=True):
        torch.ones([10], device="cuda")
    if torch.cuda.is_available():
        assert not tdx.fake.is_fake(torch.ones([10], device="cuda"))
        return
    with pytest.raises((AssertionError, RuntimeError)):
        torch.ones([10], device="cuda")


def test_fake_mode_records_nothing(tdx):
    with tdx.fake.fake_mode():
        module = torch.nn.Linear(3, 3)
    assert tdx.fake.is_fake(module.weight) and not tdx.deferred_init.is_deferred(module)


def test_meta_like_is_a_meta_tensor_with_the_fakes_layout(tdx):
    with tdx.fake.fake_mode():
        a = torch.ones([10])
        b = torch.ones([4, 6], dtype=torch.float16).t()[1:]
        c = torch.ones([2, 3], requires_grad=True)
    for fake in (a, b, c):
        meta = tdx.fake.meta_like(fake)
        assert not tdx.fake.is_fake(meta) and meta.device.type == "meta"
        assert (meta.dtype, meta.size(), meta.stride(), meta.storage_offset()) == (
            fake.dtype, fake.size(), fake.stride(), fake.storage_offset())
        assert not meta.requires_grad and meta.grad_fn is None


def test_meta_like_of_a_recorded_fake(tdx):
    module = tdx.deferred_init.deferred_init(torch.nn.Linear, 4, 2)
    meta = tdx.fake.meta_like(module.weight)
    assert meta.is_meta and meta.shape == (2, 4)
    assert tdx.deferred_init.is_deferred(module.weight)


def test_meta_like_refuses_a_real_tensor(tdx):
    with pytest.raises(ValueError, match="expects a fake tensor, got Float\\[10\\] on cpu"):
        tdx.fake.meta_like(torch.ones([10]))


def test_is_fake(tdx):
    module = tdx.deferred_init.deferred_init(torch.nn.Linear, 2, 2)
    assert tdx.fake.is_fake(module.weight) and not tdx.fake.is_fake(torch.ones(2))


# --- the package ---------------------------------------------------------------------------------


def test_find_spec_finds_the_package_and_its_modules(tdx):
    spec = importlib.util.find_spec("torchdistx")
    assert spec is not None and spec.name == "torchdistx" and spec.submodule_search_locations == []
    assert importlib.util.find_spec("torchdistx.fake").name == "torchdistx.fake"
    assert importlib.util.find_spec("torchdistx.deferred_init") is tdx.deferred_init.__spec__


def test_the_version_names_the_api_and_its_provider(tdx):
    from packaging.version import Version

    version = Version(tdx.__version__)
    assert version.public == "0.3.0.dev0"
    assert version.local == f"torchdefer.{torchdefer.__version__}"


@pytest.mark.parametrize("statement", [
    "import torchdistx.optimizers",
    "from torchdistx import slowmo",
    "from torchdistx.comm import hooks",
    "import torchdistx.gossip_grad",
])
def test_parts_torchdefer_does_not_provide_say_so(tdx, statement):
    with pytest.raises(ImportError, match="is not provided by torchdefer.*deferred_init and torchdistx.fake only"):
        exec(statement, {})


def test_transformers_sees_torchdistx_after_install():
    program = (
        "import torchdefer.compat\n"
        "torchdefer.compat.install()\n"
        "from transformers.utils import is_torchdistx_available\n"
        "assert is_torchdistx_available()\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
