"""The torchdefer Python package: deferred_init + materialize_module on real Python modules."""

import os
import subprocess
import sys

import pytest
import torch
import torchdefer


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))
    )


def assert_same_state(eager: torch.nn.Module, deferred: torch.nn.Module) -> None:
    eager_state, deferred_state = eager.state_dict(), deferred.state_dict()
    assert eager_state.keys() == deferred_state.keys()
    for name, value in eager_state.items():
        assert not torchdefer.is_fake(deferred_state[name]), name
        assert bitwise_equal(value, deferred_state[name]), name


def eager_and_deferred(make, seed=0):
    torch.manual_seed(seed)
    eager = make()
    eager_next = torch.rand(4)
    torch.manual_seed(seed)
    # exact_generator: the generator is checked right after recording, before any materialization
    # resolved a trunc_normal_ (Note [The generator after deferred_init]).
    deferred = torchdefer.deferred_init(make, exact_generator=True)
    assert bitwise_equal(torch.rand(4), eager_next), "recording left the generator elsewhere"
    return eager, deferred


class Gpt2Like(torch.nn.Module):
    """Tied embeddings, a causal-mask buffer, and GPT-2's apply(_init_weights) with .data writes."""

    def __init__(self, vocab=97, dim=32, context=16):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, dim)
        self.wpe = torch.nn.Embedding(context, dim)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(dim, 4, 64, batch_first=True) for _ in range(2)
        )
        self.ln_f = torch.nn.LayerNorm(dim)
        self.lm_head = torch.nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.register_buffer("mask", torch.tril(torch.ones(context, context)).view(1, 1, context, context))
        self.register_buffer("scale", torch.tensor([0.5, 1.5, 2.5]))
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, torch.nn.Linear):
            module.weight.data.normal_(mean=0.0, std=0.02)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, torch.nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=0.02)


def trunc_normal_(tensor, std, a, b):
    """trunc_normal_ by inverse-CDF sampling, as torch.nn.init did before 2.13 and timm still
    does: a chain of recordable ops (uniform_, erfinv_, mul_, clamp_) that shards slice by slice."""
    import math

    def cdf(x):
        return (1.0 + math.erf(x / std / math.sqrt(2.0))) / 2.0

    with torch.no_grad():
        tensor.uniform_(2 * cdf(a) - 1, 2 * cdf(b) - 1)
        tensor.erfinv_()
        tensor.mul_(std * math.sqrt(2.0))
        tensor.clamp_(min=a, max=b)
    return tensor


class LlamaLike(torch.nn.Module):
    """Depth-scaled truncated-normal init and RoPE buffers."""

    def __init__(self, dim=64, layers=3, vocab=128):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(dim, dim, bias=False) for _ in range(layers))
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        angles = torch.outer(torch.arange(32, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        for i, layer in enumerate(self.layers):
            std = 0.02 / (2 * (i + 1)) ** 0.5
            trunc_normal_(layer.weight, std, -2 * std, 2 * std)


class TorchtitanLike(torch.nn.Module):
    """torch.nn.init.trunc_normal_ itself: PyTorch 2.13's rejection sampler."""

    def __init__(self, dim=48, layers=2):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(dim, dim, bias=False) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim)
        for i, layer in enumerate(self.layers):
            torch.nn.init.trunc_normal_(layer.weight, mean=0.0, std=0.02 / (2 * (i + 1)) ** 0.5)


class DropPath(torch.nn.Module):
    def __init__(self, rate: float):
        super().__init__()
        assert isinstance(rate, float), "the rate must be a Python float, read from the tensor"
        self.rate = rate


class TimmLike(torch.nn.Module):
    """timm's stochastic-depth schedule read with .item() (or .tolist(), as pvt_v2 does), a
    constructor that branches on a random draw, and trunc_normal_ init after the reads."""

    def __init__(self, depth=4, dim=16, drop_path_rate=0.1, tolist=False):
        super().__init__()
        rates = torch.linspace(0, drop_path_rate, depth, device="cpu")
        dpr = rates.tolist() if tolist else [x.item() for x in rates]
        self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, dim))
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(dim, dim), DropPath(dpr[i])) for i in range(depth)
        )
        if torch.rand(1).item() > 0.5:
            self.head = torch.nn.Linear(dim, 3)
        else:
            self.head = torch.nn.Linear(dim, 5)
        torch.nn.init.trunc_normal_(self.cls_token, std=0.02)
        for block in self.blocks:
            torch.nn.init.trunc_normal_(block[0].weight, std=0.02)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.nn.Linear(40, 30),
        lambda: torch.nn.Conv2d(3, 8, 3),
        lambda: torch.nn.LSTM(16, 32, num_layers=2),
        lambda: torch.nn.TransformerEncoderLayer(32, 4, 64),
        lambda: torch.nn.MultiheadAttention(32, 4),
        Gpt2Like,
        LlamaLike,
        TorchtitanLike,
        TimmLike,
        lambda: TimmLike(tolist=True),
    ],
    ids=[
        "Linear",
        "Conv2d",
        "LSTM",
        "TransformerEncoderLayer",
        "MultiheadAttention",
        "Gpt2Like",
        "LlamaLike",
        "TorchtitanLike",
        "TimmLikeDropPathByItem",
        "TimmLikeDropPathByTolist",
    ],
)
def test_materializing_equals_eager_bitwise(make):
    eager, deferred = eager_and_deferred(make)
    torch.randn(7)  # the generator used in between must not matter
    torchdefer.materialize_module(deferred)
    assert not torchdefer.is_deferred(deferred)
    assert_same_state(eager, deferred)


def test_constructors_read_the_values_eager_computed():
    def reads():
        x = torch.linspace(0, 0.3, 4)
        w = torch.nn.Parameter(torch.randn(5))
        return {
            "item": [v.item() for v in x],
            "tolist": w.tolist(),
            "float": float(w.detach()[1]),
            "int": int(x[3] * 10),
            "bool": bool(w.sum() > 0),
            "index": [10, 20, 30, 40][x.argmax()],
            "numpy": w.detach().numpy().tolist(),
            "asarray": numpy_asarray(x).tolist(),
            "nonzero": (w > 0).nonzero(),
        }

    for seed in range(4):
        torch.manual_seed(seed)
        eager = reads()
        torch.manual_seed(seed)
        deferred = torchdefer.deferred_init(reads)
        assert not torchdefer.is_fake(deferred["nonzero"])
        assert torch.equal(deferred.pop("nonzero"), eager.pop("nonzero"))
        assert deferred == eager


def numpy_asarray(t):
    import numpy

    return numpy.asarray(t)


def test_data_dependent_reads_of_fakes_that_record_nothing_are_refused():
    with torchdefer.fake_mode():
        x = torch.linspace(0, 1, 4)
        with pytest.raises(RuntimeError, match=r"item\(\).*needs the values of"):
            x[1].item()
        with pytest.raises(RuntimeError, match="made under a FakeMode, which records nothing"):
            x.tolist()
    deferred = torchdefer.deferred_init(torch.nn.Linear, 2, 2)
    # After deferred_init returned, tolist is torch's own on a fake that was never handed out (a
    # plain attribute's; the package changes nothing outside deferred_init and fake_mode), and the
    # fake refuses the memory read; the handed-out parameter, and fakes computed from it, read
    # their values (Note [Handed-out fakes after deferred_init]).
    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.ones(2, 2)

    held = torchdefer.deferred_init(Holder).table
    with pytest.raises(RuntimeError, match=r"Cannot access the data or storage of fake Float\[2, 2\]"):
        (held * 1).tolist()
    assert (deferred.weight * 1).tolist() == deferred.weight.tolist()
    # item() goes through the dispatcher, where the recorder reads a recorded fake's values even
    # after its deferred_init returned (issue 12 item 3).
    assert deferred.weight.sum().item() == torchdefer.materialize_tensor(deferred.weight).sum().item()


def test_parameters_stay_the_same_objects_with_their_attributes_and_hooks():
    eager, deferred = eager_and_deferred(lambda: torch.nn.Linear(8, 4))
    weight = deferred.weight
    weight.tag = "kept"
    calls = []
    weight.register_hook(lambda grad: calls.append(grad.shape))
    torchdefer.materialize_module(deferred)
    assert deferred.weight is weight and isinstance(weight, torch.nn.Parameter)
    assert weight.tag == "kept" and weight.requires_grad and weight.is_leaf
    deferred(torch.ones(2, 8)).sum().backward()
    assert calls == [torch.Size([4, 8])]
    assert bitwise_equal(weight, eager.weight)


def test_tied_weights_stay_tied():
    _, deferred = eager_and_deferred(Gpt2Like)
    torchdefer.materialize_module(deferred)
    assert deferred.lm_head.weight is deferred.wte.weight


def test_casts_after_deferred_init_are_recorded():
    eager, deferred = eager_and_deferred(lambda: torch.nn.Linear(16, 8))
    eager.half()
    deferred.half()
    assert deferred.weight.dtype == torch.float16 and torchdefer.is_fake(deferred.weight)
    torchdefer.materialize_module(deferred)
    assert_same_state(eager, deferred)


def test_children_first_then_the_rest_leaves_children_untouched():
    eager, deferred = eager_and_deferred(LlamaLike)
    torchdefer.materialize_module(deferred.layers[1])
    before = deferred.layers[1].weight.clone()
    pointer = deferred.layers[1].weight.data_ptr()
    torchdefer.materialize_module(deferred, check_fn=lambda m: not isinstance(m, torch.nn.Embedding))
    assert torchdefer.is_fake(deferred.embed.weight)
    torchdefer.materialize_module(deferred)
    assert deferred.layers[1].weight.data_ptr() == pointer
    assert bitwise_equal(deferred.layers[1].weight, before)
    assert_same_state(eager, deferred)


class ChildFirstAlias(torch.nn.Module):
    """#11 class 8: a buffer aliasing a child's weight, and a parameter computed from that weight
    before it was written again."""

    def __init__(self):
        super().__init__()
        self.c0 = torch.nn.Linear(3, 3)
        t0 = self.c0.weight.detach() * 2
        self.c0.weight.data.normal_()
        self.register_buffer("b0", self.c0.weight.detach())
        self.p0 = torch.nn.Parameter(t0.clone())


@pytest.mark.parametrize("child_first", [True, False])
def test_a_buffer_aliasing_a_childs_weight_stays_an_alias_in_either_order(child_first):
    eager, deferred = eager_and_deferred(ChildFirstAlias)
    if child_first:
        torchdefer.materialize_module(deferred.c0)
    torchdefer.materialize_module(deferred)
    assert deferred.b0.data_ptr() == deferred.c0.weight.data_ptr()
    assert_same_state(eager, deferred)


class WhereWithAScalar(torch.nn.Module):
    """#10's crash program: torch.where with a Python scalar on real tensors, then pow_."""

    def __init__(self):
        super().__init__()
        t = torch.tensor([1.0, -1.0, 2.0])
        t1 = torch.where(t > 0, t, 1.5)
        t1.pow_(2)
        self.register_buffer("x", t1)


def test_where_with_a_python_scalar_on_real_tensors_materializes_to_eager():
    eager, deferred = eager_and_deferred(WhereWithAScalar)
    torchdefer.materialize_module(deferred)
    assert_same_state(eager, deferred)


def test_where_with_a_python_scalar_on_real_tensors_is_real_not_an_unrecorded_fake():
    t = torch.tensor([1.0, -1.0, 2.0])
    result = torchdefer.deferred_init(lambda: torch.where(t > 0, t, 1.5))
    assert not torchdefer.is_fake(result)
    assert bitwise_equal(result, torch.where(t > 0, t, 1.5))


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7, 8, 16])
def test_shards_of_every_world_size_concatenate_to_the_full_counter_model(world):
    def record():
        torch.manual_seed(11)
        return torchdefer.deferred_init(LlamaLike)

    full = record()
    torchdefer.materialize_module(full, rng="counter")
    pieces = {name: [] for name, _ in full.named_parameters()}
    for rank in range(world):
        local = record()
        stats = torchdefer.materialize_module(local, shard=torchdefer.Shard(rank, world))
        assert all(s["sliced"] for s in stats if s["box"] is not None)
        for name, parameter in local.named_parameters():
            pieces[name].append(parameter)
    for name, parameter in full.named_parameters():
        assert bitwise_equal(torch.cat(pieces[name]), parameter), name


def test_trunc_normal_is_one_recorded_op_replayed_in_any_order():
    # PyTorch 2.13's trunc_normal_ draws a value-dependent number of times; it is recorded as one
    # operator (bindings/src/trunc_normal.cpp) and materializes bitwise in any order.
    eager, deferred = eager_and_deferred(TorchtitanLike)
    assert "trunc_normal_(" in torchdefer.explain(deferred.layers[1].weight)
    torchdefer.materialize_module(deferred.layers[1])
    torchdefer.materialize_module(deferred)
    assert_same_state(eager, deferred)
    assert torch.nn.init._no_grad_trunc_normal_.__module__ == "torch.nn.init", "the patch leaked"


def test_trunc_normal_shards_are_computed_alone_in_counter_mode_and_agree():
    # Counter mode samples trunc_normal_ by inverse CDF, element by element (Note [Counter-mode
    # truncated normal]): each rank computes only its slice, and the slices agree.
    def record():
        torch.manual_seed(5)
        return torchdefer.deferred_init(TorchtitanLike)

    full = record()
    torchdefer.materialize_module(full, rng="counter")
    for world in (2, 3, 7):
        parts = []
        for rank in range(world):
            local = record()
            stats = torchdefer.materialize_module(local, shard=torchdefer.Shard(rank, world))
            weight = next(s for s in stats if s["name"] == "layers.0.weight")
            assert weight["sliced"] and weight["fallback"] == "", weight
            assert weight["bytes_computed"] == weight["bytes_kept"], weight
            parts.append(local.layers[0].weight)
        assert bitwise_equal(torch.cat(parts), full.layers[0].weight), world


def test_stats_name_the_counter_scheme_of_each_tensor_computed_in_counter_mode():
    # Note [Counter scheme versions]: the version names the bits a counter-mode tensor has.
    version = torchdefer._C.counter_scheme_version()
    assert version >= 2
    counter = torchdefer.materialize_module(torchdefer.deferred_init(torch.nn.Linear, 4, 3),
                                            rng="counter")
    assert [s["counter_scheme"] for s in counter] == [version, version]
    sharded = torchdefer.materialize_module(torchdefer.deferred_init(torch.nn.Linear, 4, 3),
                                            shard=torchdefer.Shard(0, 2))
    assert all(s["counter_scheme"] == version for s in sharded), sharded
    eager_bits = torchdefer.materialize_module(torchdefer.deferred_init(torch.nn.Linear, 4, 3))
    assert [s["counter_scheme"] for s in eager_bits] == [0, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_counter_mode_trunc_normal_has_the_truncated_normal_distribution(dtype):
    class Truncated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(400, 500, dtype=dtype))
            torch.nn.init.trunc_normal_(self.weight, mean=0.5, std=1.0, a=-0.5, b=1.5)

    model = torchdefer.deferred_init(Truncated)
    torchdefer.materialize_module(model, rng="counter")
    values = model.weight.detach().double()
    assert values.min() >= -0.5 and values.max() <= 1.5
    # N(0.5, 1) truncated to mean -+ 1 std: mean 0.5, std sqrt(1 - 2 phi(1) / (2 Phi(1) - 1)).
    assert abs(values.mean().item() - 0.5) < 0.01
    assert abs(values.std().item() - 0.5396) < 0.01


def test_new_tensor_on_a_fake_builds_the_same_tensor():
    with torchdefer.fake_mode():
        base = torch.empty(3, dtype=torch.float64)
        made = base.new_tensor([1.0, 2.0])
    assert torchdefer.is_fake(made) and made.dtype == torch.float64 and made.shape == (2,)


def test_fake_mode_and_repr_never_touch_data():
    with torchdefer.fake_mode():
        layer = torch.nn.Linear(8192, 8192)
        out = layer(torch.ones(2, 8192))
        assert "fake Float[8192, 8192] on cpu" in repr(layer.weight)
        assert "FakeTensor" in str(out) and "FakeTensor" in f"{out}"
    assert torchdefer.is_fake(layer.weight) and layer.weight.nbytes == 8192 * 8192 * 4
    assert out.shape == (2, 8192) and torchdefer.is_fake(out)
    assert torchdefer.describe(layer.weight) == "fake Float[8192, 8192] on cpu"
    # Outside fake_mode and deferred_init, repr is torch's own, which reads values; the refusal
    # says how to print a fake.
    with pytest.raises(RuntimeError, match=r"print describe\(t\) instead"):
        repr(layer.weight)


def test_repr_of_fakes_while_recording():
    outside = torch.ones(2)

    def build():
        layer = torch.nn.Linear(3, 4)
        return repr(layer.weight), str(layer.bias), f"{layer.weight}", repr(outside)

    weight, bias, formatted, real = torchdefer.deferred_init(build)
    assert weight == "Parameter containing:\nFakeTensor(fake Float[4, 3] on cpu, requires_grad=True)"
    assert formatted == weight
    assert "fake Float[4] on cpu" in bias and "Parameter containing" in bias
    assert real == repr(outside) == "tensor([1., 1.])"


def test_fake_cuda_works_without_a_gpu_and_materializes_on_the_cpu():
    with torchdefer.fake_mode("cuda"):
        layer = torch.nn.Linear(64, 32)
        out = layer(torch.ones(2, 64))
    assert layer.weight.device == torch.device("cuda", 0) and out.device == torch.device("cuda", 0)

    def on_cuda():
        with torch.device("cuda"):
            return torch.nn.Linear(16, 8)

    torch.manual_seed(4)
    eager = torch.nn.Linear(16, 8)
    torch.manual_seed(4)
    deferred = torchdefer.deferred_init(on_cuda)
    assert deferred.weight.is_cuda
    torchdefer.materialize_module(deferred, device="cpu")
    assert deferred.weight.device == torch.device("cpu")
    assert_same_state(eager, deferred)
    if not torch.cuda.is_available():
        assert not torch.cuda.is_initialized()


def test_python_and_numpy_scalars_promote_like_python_numbers():
    # They arrive as 0-dim "wrapped number" tensors; int64 * np.float64 must stay float32 (the
    # sinusoidal position table of Whisper depends on it).
    import numpy as np

    def program():
        steps = torch.arange(6)
        return torch.exp(-np.log(10000.0) / 5 * steps), steps * 2.5, steps * np.float64(0.5)

    eager = program()
    deferred = torchdefer.deferred_init(program)
    assert [t.dtype for t in deferred] == [t.dtype for t in eager] == [torch.float32] * 3
    for t in deferred:
        torchdefer.materialize_tensor(t)
    for a, b in zip(eager, deferred):
        assert bitwise_equal(a, b)


def test_explain_shows_the_recorded_ops():
    deferred = torchdefer.deferred_init(torch.nn.Linear, 8, 4)
    assert "uniform_" in torchdefer.explain(deferred.weight)


def test_bad_input_gets_clear_errors_and_loses_nothing():
    with pytest.raises(TypeError, match="nn.Module class or a callable"):
        torchdefer.deferred_init(42)
    with pytest.raises(TypeError, match="expects an nn.Module"):
        torchdefer.materialize_module("not a module")
    with pytest.raises(ValueError, match="rng must be"):
        torchdefer.materialize_module(torchdefer.deferred_init(torch.nn.Linear, 2, 2), rng="fast")

    def broken():
        torch.nn.Linear(4, 4)
        raise ValueError("constructor failed")

    with pytest.raises(ValueError, match="constructor failed"):
        torchdefer.deferred_init(broken)
    assert not torchdefer.is_fake(torch.empty(2)), "a failed deferred_init left recording on"

    deferred = torchdefer.deferred_init(torch.nn.Linear, 4, 4)
    with pytest.raises(RuntimeError, match="cannot materialize"):
        torchdefer.materialize_module(deferred, device="cuda:99")
    assert torchdefer.is_deferred(deferred)
    torchdefer.materialize_module(deferred)
    assert not torchdefer.is_deferred(deferred)

    class DataDependent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3))
            if self.w.sum() > 0:
                self.w.data.zero_()

    with torchdefer.fake_mode(), pytest.raises(RuntimeError, match=r"item\(\).*needs the values of"):
        DataDependent()
    for seed in range(4):
        eager, deferred = eager_and_deferred(DataDependent, seed)
        torchdefer.materialize_module(deferred)
        assert_same_state(eager, deferred)


def test_imports_from_any_directory():
    result = subprocess.run(
        [sys.executable, "-c", "import torchdefer; print(torchdefer.Shard(0, 2))"],
        cwd=os.path.abspath(os.sep),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "Shard(rank=0, world_size=2" in result.stdout
