"""What init code does after deferred_init returned with fakes it computes from the handed-out ones,
with fakes held as plain attributes, and with the generator (issue 12 item 3's leftovers): each
gives eager's values, eager's classes once real, and with exact_generator=True eager's generator
right after the call (Note [Fakes computed after deferred_init returned] in
bindings/torchdefer/_stand_ins.py, Note [Deep copies after deferred_init returned] in
_deepcopy.py, Note [The generator after deferred_init] in recorder/internal/torchdefer/rng_anchors.h).
"""

import copy
import threading
import warnings

import numpy
import pytest
import torch
import torchdefer
from torch import nn
from torchdefer import _stand_ins as _after_return

from test_torchdefer import bitwise_equal


def build():
    return nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 6))


def eager_and_deferred(seed=3, exact_generator=False):
    torch.manual_seed(seed)
    eager = build()
    torch.manual_seed(seed)
    return eager, torchdefer.deferred_init(build, exact_generator=exact_generator)


def assert_same_model(eager, model):
    expected, got = eager.state_dict(keep_vars=True), model.state_dict(keep_vars=True)
    assert list(expected) == list(got)
    for name, value in expected.items():
        assert not torchdefer.is_fake(got[name]), name
        assert type(got[name]) is type(value), name
        assert bitwise_equal(value.detach(), got[name].detach()), name


# --- fakes computed after return read values and make tensors as eager's tensors do --------------

COMPUTED = {
    "(p * 2).tolist()": lambda m: (m[0].weight * 2).tolist(),
    "p[0].detach().numpy()": lambda m: m[0].weight[0].detach().numpy().tolist(),
    "numpy.asarray(p.detach().t())": lambda m: numpy.asarray(m[0].weight.detach().t()).tolist(),
    "chunk(p)[1].tolist()": lambda m: torch.chunk(m[1].weight, 2)[1].tolist(),
    "max(dim=0).values.tolist()": lambda m: m[0].weight.max(dim=0).values.tolist(),
    "state_dict() values": lambda m: [v.tolist() for v in m.state_dict().values()],
    "p.t().new_tensor(data)": lambda m: m[0].weight.t().new_tensor([1.5, 2.5]).tolist(),
    "p[0].new_tensor(p[1].tolist())": lambda m: m[0].weight[0].new_tensor(m[0].weight[1].tolist()).tolist(),
    "p.t().new(2, 3)": lambda m: (m[0].weight.t().new(2, 3).shape, m[0].weight.t().new(2, 3).dtype),
    "p.T.new(list)": lambda m: m[0].weight.T.new([3.0, 4.0]).tolist(),
    "f'{p.std():.4f}'": lambda m: f"{m[0].weight.std():.4f}",
    "f'{p.sum()}'": lambda m: f"{m[0].weight.sum()}",
    "(p - p.mean()).abs().tolist()": lambda m: (m[1].bias - m[1].bias.mean()).abs().tolist(),
    "[r.tolist() for r in p]": lambda m: [r.tolist() for r in m[0].weight],
}


@pytest.mark.parametrize("name", list(COMPUTED))
def test_a_fake_computed_after_return_reads_values_as_eager_does(name):
    eager, model = eager_and_deferred()
    assert COMPUTED[name](model) == COMPUTED[name](eager)
    torchdefer.materialize_module(model)
    assert_same_model(eager, model)


def test_fakes_computed_after_return_are_handed_out_and_real_results_are_plain():
    _, model = eager_and_deferred()
    p = model[0].weight
    for computed in (p * 2, p[0], p.t(), p.detach(), p.data, torch.chunk(p, 2)[0], p.max(dim=0).values,
                     p.new_tensor([1.0]), p.t().new(2)):
        assert type(computed) is _after_return.DeferredTensor and torchdefer.is_fake(computed)
    assert type((p > 0).nonzero()) is torch.Tensor and not torchdefer.is_fake((p > 0).nonzero())
    with torchdefer.fake_mode():
        unrecorded = torch.ones(2)
    assert type(unrecorded + 1) is torch.Tensor  # fake_mode's fakes are not deferred_init's


@pytest.mark.parametrize("view", ["p[0]", "p.t()", "p.data[1:]"])
def test_trunc_normal_of_a_fake_computed_after_return_gives_eagers_bits(view):
    def init(m):
        p = m[1].weight
        target = {"p[0]": lambda: p[0], "p.t()": lambda: p.t(), "p.data[1:]": lambda: p.data[1:]}[view]
        with torch.no_grad():
            nn.init.trunc_normal_(target(), std=0.5)
            nn.init.trunc_normal_(m[0].weight.t(), std=0.3, a=-0.5, b=0.5)

    torch.manual_seed(3)
    eager = build()
    init(eager)
    expected_next = torch.rand(3)
    torch.manual_seed(3)
    model = torchdefer.deferred_init(build)
    init(model)
    assert torchdefer.explain(model[0].weight).endswith("trunc_normal_(0, 0.3, -0.5, 0.5)")
    torchdefer.materialize_module(model)
    assert torch.equal(torch.rand(3), expected_next)
    assert_same_model(eager, model)


def test_computed_fakes_kept_by_the_model_materialize_to_eagers_tensors_and_classes():
    def keep(m):
        p = m[0].weight
        m.register_buffer("doubled", p.detach() * 2)
        m.made = p.t().new_tensor([[1.0, 2.0]])
        m.scaled = nn.Parameter(p * 0.5)
        m.rows = [p[0].detach(), p[1].detach().clone()]

    eager, model = eager_and_deferred()
    keep(eager)
    keep(model)
    assert isinstance(model.scaled, nn.Parameter) and "scaled" in dict(model.named_parameters())
    torchdefer.materialize_module(model)
    assert_same_model(eager, model)
    for name in ("made",):
        assert type(getattr(model, name)) is torch.Tensor
        assert torch.equal(getattr(model, name), getattr(eager, name))
    for got, expected in zip(model.rows, eager.rows):
        assert type(got) is torch.Tensor and torch.equal(got, expected)


def test_a_handed_out_fake_prints_as_a_fake_and_formats_as_eager():
    eager, model = eager_and_deferred()
    p = model[0].weight
    assert repr(p * 2) == "FakeTensor(fake Float[4, 5] on cpu, requires_grad=True)"
    assert repr(p) == str(p) == "Parameter containing:\nFakeTensor(fake Float[4, 5] on cpu, requires_grad=True)"
    assert f"{p.detach()}" == "FakeTensor(fake Float[4, 5] on cpu, requires_grad=False)"
    assert f"{p.sum():.5f}" == f"{eager[0].weight.sum():.5f}"
    print(model.state_dict())  # describes, never raises
    for make in (lambda m: m[0].weight, lambda m: m[0].weight * 2, lambda m: m[0].bias.sum().view(1)):
        for m in (eager, model):
            with pytest.raises(TypeError, match="unsupported format string"):
                f"{make(m):.2f}"
    torchdefer.materialize_module(model)
    assert repr(model[0].weight) == repr(eager[0].weight)


# --- deep copies of fakes held as plain attributes ---------------------------------------------


class Holding(nn.Module):
    """Fakes held as plain attributes, beside parameters and buffers: alone, in a list, a tuple and
    a dict, as a view of a buffer's storage and as a detached alias of a parameter."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("running", torch.randn(5))
        self.table = torch.randn(2, 3)
        self.inv_freq = 1.0 / (10000 ** (torch.arange(0, 6, 2).float() / 6))
        self.listed = [torch.rand(2), torch.arange(3)]
        self.keyed = {"scale": torch.randn(3), "shift": (torch.ones(2) * 3,)}
        self.window = self.running[1:4]
        self.alias = self.lin.weight.detach()


def init_after(model):
    nn.init.trunc_normal_(model.lin.weight, std=0.2)
    with torch.no_grad():
        model.running.mul_(2)


def storages(model):
    tensors = dict(model.state_dict(keep_vars=True))
    tensors.update(table=model.table, window=model.window, alias=model.alias, listed0=model.listed[0])
    groups = {}
    for name, t in tensors.items():
        groups.setdefault(t.untyped_storage().data_ptr(), []).append(name)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


def held(model):
    return [model.table, model.inv_freq, *model.listed, model.keyed["scale"], *model.keyed["shift"],
            model.window, model.alias]


@pytest.mark.parametrize("order", ["original first", "copy first"])
def test_a_deep_copy_after_return_copies_plain_attribute_fakes_as_deferred_copies(order):
    torch.manual_seed(4)
    eager = Holding()
    eager_copy = copy.deepcopy(eager)
    init_after(eager_copy)
    torch.manual_seed(4)
    model = torchdefer.deferred_init(Holding)
    copied = copy.deepcopy(model)
    init_after(copied)
    assert all(torchdefer.is_fake(t) for t in held(copied))
    assert all(c is not o for c, o in zip(held(copied), held(model)))
    for m in ((model, copied) if order == "original first" else (copied, model)):
        torchdefer.materialize_module(m)
    for e, d in ((eager, model), (eager_copy, copied)):
        assert_same_model(e, d)
        for x, y in zip(held(e), held(d)):
            assert type(y) is torch.Tensor and bitwise_equal(x, y)
        assert storages(e) == storages(d)


def test_a_deep_copy_of_a_submodule_and_of_a_list_of_models_after_return():
    def make():
        return nn.Sequential(nn.Linear(2, 2), Holding())

    torch.manual_seed(4)
    eager = make()
    expected = copy.deepcopy([eager[1], eager])
    torch.manual_seed(4)
    model = torchdefer.deferred_init(make)
    assert torchdefer.is_fake(model[1].table)
    copies = copy.deepcopy([model[1], model])
    assert copies[0] is copies[1][1]  # one copy, as in eager
    torchdefer.materialize_module(copies[1])
    assert_same_model(expected[1], copies[1])
    for x, y in zip(held(expected[0]), held(copies[0])):
        assert bitwise_equal(x, y)


# --- the generator after return, with exact_generator=True -------------------------------------


AFTER_RETURN_SAMPLERS = {
    "trunc_normal_(p)": lambda m: nn.init.trunc_normal_(m[0].weight, std=0.5),
    "trunc_normal_(p.data)": lambda m: nn.init.trunc_normal_(m[1].weight.data, std=0.1, a=-0.2, b=0.3),
    "trunc_normal_(p[0])": lambda m: nn.init.trunc_normal_(m[1].weight.detach()[0], std=0.5),
    "torchdefer::trunc_normal_": lambda m: torch.ops.torchdefer.trunc_normal_(m[1].bias.detach(), 0.0, 1.0, -2.0, 2.0),
    "torch.poisson(rates)": lambda m: m.register_buffer("counts", torch.poisson(m[1].bias.detach().abs() * 3)),
    "a deep copy's trunc_normal_": lambda m: nn.init.trunc_normal_(copy.deepcopy(m)[0].weight, std=0.5),
}


@pytest.mark.parametrize("name", list(AFTER_RETURN_SAMPLERS))
def test_a_sampler_after_return_leaves_eagers_generator_at_once_with_exact_generator(name):
    sample = AFTER_RETURN_SAMPLERS[name]
    torch.manual_seed(3)
    eager = build()
    with torch.no_grad():
        sample(eager)
    eager_state = torch.get_rng_state()
    torch.manual_seed(3)
    model = torchdefer.deferred_init(build, exact_generator=True)
    with torch.no_grad():
        sample(model)
    assert torch.equal(torch.get_rng_state(), eager_state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torchdefer warns when someone draws from an owed generator
        torch.rand(2)
        torchdefer.materialize_module(model)
    assert_same_model(eager, model)


def test_without_exact_generator_a_sampler_after_return_owes_the_generator_until_materialization():
    torch.manual_seed(3)
    eager = build()
    nn.init.trunc_normal_(eager[0].weight, std=0.5)
    eager_state = torch.get_rng_state()
    torch.manual_seed(3)
    model = torchdefer.deferred_init(build)
    nn.init.trunc_normal_(model[0].weight, std=0.5)
    assert not torch.equal(torch.get_rng_state(), eager_state)
    torchdefer.materialize_module(model)
    assert torch.equal(torch.get_rng_state(), eager_state)
    assert_same_model(eager, model)


def test_a_deferred_block_with_exact_generator_leaves_eagers_generator_after_init_code():
    torch.manual_seed(8)
    eager = build()
    nn.init.trunc_normal_(eager[1].weight, std=0.02)
    eager_state = torch.get_rng_state()
    torch.manual_seed(8)
    with torchdefer.deferred(exact_generator=True) as block:
        model = build()
    assert block.modules == [model]
    nn.init.trunc_normal_(model[1].weight, std=0.02)
    assert torch.equal(torch.get_rng_state(), eager_state)
    torchdefer.materialize_module(model)
    assert_same_model(eager, model)


# --- torch.tensor of lists holding fakes after return -------------------------------------------

FROM_LISTS = {
    "torch.tensor([p[0, 0] * 2, p[1, 1]], float64)":
        lambda p: torch.tensor([p[0, 0] * 2, p[1, 1]], dtype=torch.float64),
    "torch.as_tensor([p[0, 0], 1.0])": lambda p: torch.as_tensor([p[0, 0], 1.0]),
    "torch.tensor(nested)": lambda p: torch.tensor([[p[0, 0], p[0, 1]], (3.0, p[1, 0])]),
    "torch.tensor(ints)": lambda p: torch.tensor([(p[0, 0] * 100).to(torch.int64), 7]),
    "torch.tensor(bools)": lambda p: torch.tensor([True, p[0, 0] > 0]),
    "torch.tensor(complex64)": lambda p: torch.tensor([p[0, 1], 2.0], dtype=torch.complex64),
    "torch.tensor(bfloat16)": lambda p: torch.tensor([p[0, 1] * 3, 2.0], dtype=torch.bfloat16),
    "float(p[0, 0])": lambda p: float(p[0, 0]),
    "int index": lambda p: [10, 20, 30][(p[0, 0] * 0).to(torch.int64)],
}


@pytest.mark.parametrize("name", list(FROM_LISTS))
def test_torch_tensor_of_a_list_holding_fakes_after_return_is_eagers_real_tensor(name):
    """torch stores each element of a list through ``float()``/``int()``/``bool()``/``complex()``
    of it, which the handed-out class answers by reading values (Note [Handed-out fakes after
    deferred_init]); the result is a real tensor, as in eager and inside deferred_init."""
    eager, model = eager_and_deferred()
    expected, got = FROM_LISTS[name](eager[0].weight), FROM_LISTS[name](model[0].weight)
    if isinstance(expected, torch.Tensor):
        assert type(got) is torch.Tensor and not torchdefer.is_fake(got)
        assert got.dtype == expected.dtype and bitwise_equal(expected, got)
    else:
        assert got == expected
    with pytest.raises(TypeError, match="only integer tensors of a single element"):
        torch.tensor([model[0].weight[0, 0], 2.0], dtype=torch.int64)  # eager's error
    with pytest.raises(RuntimeError, match="more than one value is ambiguous"):
        bool(model[0].weight)  # refused by size, as in eager, before any value is read
    torchdefer.materialize_module(model)
    assert_same_model(eager, model)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is marked initialized only without it")
def test_new_tensor_after_return_leaves_cuda_marked_for_a_recording_on_another_thread():
    # A handed-out fake's new_tensor marks CUDA initialized for its call; it used to set the flag
    # back at its end although another thread's recording still needed it, so that recording's
    # fake CUDA factory then asked torch to initialize CUDA and failed.
    returned = torchdefer.deferred_init(nn.Linear, 2, 2)
    recording, made, seen = threading.Event(), threading.Event(), {}

    def build():
        recording.set()
        made.wait(timeout=60)
        seen["on_cuda"] = torch.empty(3, device="cuda")
        return nn.Linear(2, 2)

    thread = threading.Thread(target=lambda: torchdefer.deferred_init(build))
    thread.start()
    recording.wait(timeout=60)
    returned.weight.new_tensor([1.0])
    made.set()
    thread.join()
    assert torchdefer.is_fake(seen["on_cuda"]) and seen["on_cuda"].device.type == "cuda"
