"""Failures the real-library suite (tests/reallibs/) found, each reproduced with plain torch code
so that it runs without that suite's venv."""

import copy

import pytest
import torch
import torchdefer


def _state(module):
    out = dict(module.named_parameters(remove_duplicate=False))
    out.update(module.named_buffers(remove_duplicate=False))
    return out


def _assert_bitwise_like_eager(build):
    torch.manual_seed(0)
    eager = build()
    eager_rng = torch.get_rng_state()
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build)
    torchdefer.materialize_module(deferred)
    assert torch.equal(torch.get_rng_state(), eager_rng)
    eager_state, deferred_state = _state(eager), _state(deferred)
    assert eager_state.keys() == deferred_state.keys()
    for name, value in eager_state.items():
        assert not torchdefer.is_fake(deferred_state[name]), name
        assert torch.equal(value, deferred_state[name]), name
    return eager, deferred


class _CopiesItsNorm(torch.nn.Module):
    """PyTorch Geometric's BasicGNN (GCN with norm="batch_norm"): one BatchNorm is built, its
    buffers written, and deep-copied for every layer while the model is being built."""

    def __init__(self):
        super().__init__()
        norm = torch.nn.BatchNorm1d(6)
        norm.running_mean.normal_()  # a recorded value, so that the copy carries it
        self.norms = torch.nn.ModuleList(copy.deepcopy(norm) for _ in range(3))
        self.lin = torch.nn.Linear(4, 6)


def test_deepcopy_of_a_module_with_fake_buffers_equals_eager():
    eager, deferred = _assert_bitwise_like_eager(_CopiesItsNorm)
    assert deferred.norms[0].running_mean.data_ptr() != deferred.norms[1].running_mean.data_ptr()


class _CopiesAliases(torch.nn.Module):
    """A deepcopy of buffers that share one storage (a view and a detached alias) keeps them
    sharing the copy's storage, as eager does; the original is not written by the copy's writes."""

    def __init__(self):
        super().__init__()
        table = torch.randn(4, 6)
        holder = torch.nn.Module()
        holder.register_buffer("table", table)
        holder.register_buffer("row", table[1])
        holder.register_buffer("alias", table.detach())
        self.first = holder
        self.second = copy.deepcopy(holder)
        self.second.row.fill_(7.0)


def test_deepcopy_keeps_storage_sharing_as_eager():
    eager, deferred = _assert_bitwise_like_eager(_CopiesAliases)
    for module in (eager, deferred):
        second = module.second
        assert second.row.data_ptr() == second.table.data_ptr() + 6 * 4
        assert second.alias.data_ptr() == second.table.data_ptr()
        assert second.table.data_ptr() != module.first.table.data_ptr()
        assert bool((second.alias[1] == 7.0).all())
        assert not bool((module.first.table[1] == 7.0).all())


def _assert_shards_like_the_full_counter_model(factory, world):
    """Every rank's tensors equal their box of the whole model materialized in counter mode."""
    torch.manual_seed(0)
    full = torchdefer.deferred_init(factory)
    torchdefer.materialize_module(full, rng="counter")
    for rank in range(world):
        torch.manual_seed(0)
        local = torchdefer.deferred_init(factory)
        torchdefer.materialize_module(local, shard=torchdefer.Shard(rank, world))
        for name, value in _state(local).items():
            info = torchdefer.shard_info(value)
            expected = _state(full)[name]
            if info is not None:
                starts, stops = info["box"]
                expected = expected[tuple(slice(a, b) for a, b in zip(starts, stops))]
            assert torch.equal(value, expected), name


def test_deepcopied_buffers_shard_like_the_full_counter_model():
    _assert_shards_like_the_full_counter_model(_CopiesItsNorm, world=2)


class _CopiesTwoDtypes(torch.nn.Module):
    """A storage seen as float32 and as int32 stays one storage in the copy, as in eager."""

    def __init__(self):
        super().__init__()
        holder = torch.nn.Module()
        holder.register_buffer("table", torch.randn(2, 4).t())
        holder.register_buffer("bits", holder.table.view(torch.int32))
        self.first = holder
        self.second = copy.deepcopy(holder)
        self.second.bits[0, 1] = 0


def test_deepcopy_of_one_storage_seen_with_two_dtypes_equals_eager():
    eager, deferred = _assert_bitwise_like_eager(_CopiesTwoDtypes)
    assert deferred.second.table.stride() == eager.second.table.stride() == (1, 4)
    assert deferred.second.bits.data_ptr() == deferred.second.table.data_ptr()
    assert float(deferred.second.table[0, 1]) == 0.0


def test_deepcopy_of_a_real_conjugate_view_is_refused_while_recording():
    def build():
        holder = torch.nn.Module()
        holder.register_buffer("phases", torch.tensor([1 + 2j, 3 - 1j]).conj())
        return copy.deepcopy(holder)

    with pytest.raises(RuntimeError, match=r"deepcopy of ComplexFloat\[2\].*conjugate"):
        torchdefer.deferred_init(build)


@pytest.mark.parametrize("view", [
    lambda t: t.conj(), lambda t: torch.conj(t), lambda t: t.mH, lambda t: t.H,
    lambda t: t.adjoint(), lambda t: torch.adjoint(t),
])
def test_conjugate_views_of_complex_fakes_are_refused_while_recording(view):
    # Fakes keep no conjugate bit: recorded, the view would materialize the plain values.
    with pytest.raises(RuntimeError, match=r"fake ComplexFloat\[2, 2\].*conjugate"):
        torchdefer.deferred_init(lambda: view(torch.randn(2, 2, dtype=torch.complex64)))


def test_negative_views_of_fakes_are_refused_and_real_conjugates_are_not():
    with pytest.raises(RuntimeError, match=r"_neg_view of fake Float\[2\]"):
        torchdefer.deferred_init(lambda: torch._neg_view(torch.randn(2)))

    def build():  # conj() and .mH of real tensors are views; conj_physical() of fakes is recorded
        module = torch.nn.Module()
        module.register_buffer("physical", torch.randn(2, 2, dtype=torch.complex64).conj_physical())
        module.register_buffer("plain", torch.randn(2, 2).mH)
        module.register_buffer("real", torch.tensor([1 + 2j]).conj().resolve_conj())
        return module

    _assert_bitwise_like_eager(build)


class _BatchNormForwardWhileBuilding(torch.nn.Module):
    """Lazy modules (torch's LazyBatchNorm, PyTorch Geometric's and MONAI's lazy layers) run a
    forward during construction to learn their shapes: in train mode, native_batch_norm updates
    the running statistics in place although its schema marks no write."""

    def __init__(self):
        super().__init__()
        self.lazy = torch.nn.Sequential(torch.nn.LazyConv2d(4, 3), torch.nn.LazyBatchNorm2d())
        self.lazy(torch.randn(2, 3, 6, 6))
        self.norm = torch.nn.BatchNorm1d(5, momentum=None)  # cumulative average
        self.norm(torch.randn(7, 5))
        self.norm(torch.randn(7, 5))
        self.instance = torch.nn.InstanceNorm1d(5, track_running_stats=True, affine=True)
        self.instance(torch.randn(3, 5, 4))
        self.frozen = torch.nn.BatchNorm1d(5).eval()
        self.frozen(torch.randn(7, 5))


def test_running_statistics_updated_while_building_equal_eager():
    eager, deferred = _assert_bitwise_like_eager(_BatchNormForwardWhileBuilding)
    assert not torch.equal(eager.norm.running_mean, torch.zeros(5))  # the update happened


def test_running_statistics_updated_while_building_shard_like_the_full_counter_model():
    _assert_shards_like_the_full_counter_model(_BatchNormForwardWhileBuilding, world=3)


class _UnsqueezedParameters(torch.nn.Module):
    """normflows' ActNorm and AffineConstFlow hold `nn.Parameter(torch.zeros(shape)[None])`: a
    view that inserts a size-1 dimension, which torch.chunk over more than one rank leaves empty
    on every rank but the first."""

    def __init__(self):
        super().__init__()
        self.shift = torch.nn.Parameter(torch.zeros(4)[None])
        self.scale = torch.nn.Parameter(torch.randn(3, 4).unsqueeze(0))
        self.flat = torch.nn.Parameter(torch.randn(4).view(1, 4))


@pytest.mark.parametrize("world", [2, 3, 7])
def test_parameters_viewed_with_an_inserted_dimension_shard_like_the_full_counter_model(world):
    _assert_shards_like_the_full_counter_model(_UnsqueezedParameters, world=world)


def _saves_and_restores_by_hand():
    module = torch.nn.Module()
    state = torch.get_rng_state()
    module.first = torch.nn.Linear(4, 4)
    torch.set_rng_state(state)  # the same draws again
    module.again = torch.nn.Linear(4, 4)
    return module


def _forks_without_reseeding():
    module = torch.nn.Module()
    module.before = torch.nn.Linear(4, 4)
    with torch.random.fork_rng():
        module.inside = torch.nn.Linear(4, 4)
    module.after = torch.nn.Linear(4, 4)  # from where `inside` started
    return module


def _isolates_a_seeded_build():
    """NequIP's model builder: Lightning's isolate_rng() saves the generator, the model is built
    from its own seed, and the caller's generator is restored afterwards."""
    module = torch.nn.Module()
    module.caller = torch.nn.Linear(4, 4)
    state = torch.random.get_rng_state()
    torch.manual_seed(123)
    module.seeded = torch.nn.Linear(4, 4)
    torch.random.set_rng_state(state)
    module.after = torch.nn.Linear(4, 4)
    return module


def _reseeds_with_the_first_seed():
    module = torch.nn.Module()
    module.first = torch.nn.Linear(4, 4)
    torch.manual_seed(0)  # the seed the test starts from: the same weights again
    module.again = torch.nn.Linear(4, 4)
    return module


def _keeps_the_generator_state():
    module = torch.nn.Linear(4, 4)
    module.register_buffer("rng_state", torch.get_rng_state())
    return module


@pytest.mark.parametrize("build", [_saves_and_restores_by_hand, _forks_without_reseeding,
                                   _isolates_a_seeded_build, _reseeds_with_the_first_seed,
                                   _keeps_the_generator_state])
def test_the_generator_state_read_or_set_while_recording_is_eagers(build):
    _assert_bitwise_like_eager(build)  # the values, and the generator after materializing
    torch.manual_seed(0)
    build()
    eager_rng = torch.get_rng_state()
    torch.manual_seed(0)
    torchdefer.deferred_init(build, exact_generator=True)
    assert torch.equal(torch.get_rng_state(), eager_rng)


def test_the_generator_state_functions_are_torchs_own_outside_recording():
    functions = [getattr(m, n) for m in (torch, torch.random)
                 for n in ("get_rng_state", "set_rng_state", "manual_seed", "seed")]
    torchdefer.deferred_init(torch.nn.Linear, 2, 2)
    with torchdefer.deferred():
        torch.nn.Linear(2, 2)
    assert functions == [getattr(m, n) for m in (torch, torch.random)
                         for n in ("get_rng_state", "set_rng_state", "manual_seed", "seed")]
    assert torch.get_rng_state.__module__ == "torch.random"


def _reseeds_after_a_truncated_normal():
    """A value-dependent sampler leaves the generator owed; the reseed to the starting seed after
    it must still be seen as a reseed (Note [The owed generator's mark])."""
    module = torch.nn.Module()
    module.truncated = torch.nn.Parameter(torch.empty(8, 8))
    torch.nn.init.trunc_normal_(module.truncated, std=0.02)
    torch.manual_seed(0)
    module.after = torch.nn.Linear(4, 4)
    return module


def _draws_from_the_default_generator_by_name():
    module = torch.nn.Module()
    module.first = torch.nn.Linear(4, 4)
    module.register_buffer("noise", torch.randn(32, generator=torch.default_generator))
    module.second = torch.nn.Linear(4, 4)
    return module


@pytest.mark.parametrize("build", [_reseeds_after_a_truncated_normal,
                                   _draws_from_the_default_generator_by_name])
def test_reseeds_after_samplers_and_the_default_generator_by_name_give_eagers_values(build):
    _assert_bitwise_like_eager(build)
    torch.manual_seed(0)
    build()
    eager_rng = torch.get_rng_state()
    torch.manual_seed(0)
    torchdefer.deferred_init(build)
    assert torch.equal(torch.get_rng_state(), eager_rng)


def test_a_reseed_while_recording_does_not_resolve_the_samplers_it_makes_moot():
    """Resolving a value-dependent sampler costs a scratch tensor of its size: this one could not
    be allocated, so reseeding after it must leave it recorded, as the reseed makes it moot."""
    def build():
        module = torch.nn.Module()
        module.huge = torch.nn.Parameter(torch.empty(1 << 22, 1 << 20))  # 16 TiB in float32
        torch.nn.init.trunc_normal_(module.huge, std=0.02)
        torch.manual_seed(1)
        module.small = torch.nn.Linear(4, 4)
        return module

    torch.manual_seed(0)
    model = torchdefer.deferred_init(build)
    torchdefer.materialize_module(model.small)
    torch.manual_seed(1)
    expected = torch.nn.Linear(4, 4)
    assert torch.equal(model.small.weight, expected.weight)
    assert torch.equal(model.small.bias, expected.bias)


# Class 21: Kornia's MKD descriptor computes its polar embedding from a transposed grid with
# inserted size-1 dimensions times a column of frequencies. torch's Python meta kernels lay out
# such a product unlike the CPU kernels, and replay read the real result through the fake's
# strides: the values came out scrambled.
def _broadcast_over_a_transposed_grid(op):
    def build():
        grid = torch.linspace(-3, 3, 16 * 16).reshape(16, 16).t()[None, None]  # size-1 ties
        column = torch.arange(1, 3).reshape(-1, 1, 1).float()
        module = torch.nn.Module()
        module.register_buffer("product", op(column, grid))
        module.register_buffer("cosine", torch.cos(op(column, grid)))
        return module
    return build


@pytest.mark.parametrize("op", [torch.mul, torch.add, torch.atan2,
                                lambda a, b: torch.where(b > 0, a, b),
                                lambda a, b: torch.addcmul(b, a, b),
                                lambda a, b: torch.masked_fill(b, a > 1, 0.0)],
                         ids=["mul", "add", "atan2", "where", "addcmul", "masked_fill"])
def test_pointwise_results_of_unevenly_strided_inputs_equal_eager(op):
    eager, deferred = _assert_bitwise_like_eager(_broadcast_over_a_transposed_grid(op))
    assert deferred.product.stride() == eager.product.stride()


def test_pointwise_results_of_unevenly_strided_inputs_have_the_cpu_kernels_strides_while_recording():
    strides = []

    def build():
        grid = torch.ones(4, 4).t()[None, None]
        strides.append((torch.ones(2, 1, 1) * grid).stride())
        return torch.nn.Module()

    build()
    torchdefer.deferred_init(build)
    assert strides[0] == strides[1] == (4, 4, 1, 8)



_LAYOUT_LIB = torch.library.Library("torchdefer_test_layout", "DEF")
_LAYOUT_LIB.define("transposed_on_meta(Tensor x) -> Tensor")
_LAYOUT_LIB.impl("transposed_on_meta", lambda x: x.clone(memory_format=torch.contiguous_format),
                 "CPU")
_LAYOUT_LIB.impl("transposed_on_meta",
                 lambda x: torch.empty_strided(x.shape, (1, x.shape[0]), dtype=x.dtype,
                                               device="meta"), "Meta")


def test_a_result_laid_out_unlike_the_real_kernel_is_refused_at_materialization():
    def build():
        module = torch.nn.Module()
        module.register_buffer(
            "b", torch.ops.torchdefer_test_layout.transposed_on_meta(torch.randn(3, 4)))
        return module

    deferred = torchdefer.deferred_init(build)
    with pytest.raises(RuntimeError, match="transposed_on_meta.*laid it out unlike the real"):
        torchdefer.materialize_module(deferred)
