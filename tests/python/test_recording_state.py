"""What construction reads and writes besides its fakes (issue 11, classes 1 and 11).

Ambient state (Note [Ambient state is part of the recording]): the default dtype, the default
device and grad mode as they were while each op ran. Real tensors written while recording (Note
[Real tensors written while recording]): they hold eager's values at once, and recorded ops that
read them before the write keep what they read. Every case against eager construction, bitwise.
"""

import pytest
import torch
import torchdefer
from test_torchdefer import eager_and_deferred


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.detach().contiguous().reshape(-1).view(torch.uint8), b.detach().contiguous().reshape(-1).view(torch.uint8))
    )


def assert_same_state(eager: torch.nn.Module, deferred: torch.nn.Module) -> None:
    eager_state, deferred_state = eager.state_dict(keep_vars=True), deferred.state_dict(keep_vars=True)
    assert eager_state.keys() == deferred_state.keys()
    for name, value in eager_state.items():
        assert not torchdefer.is_fake(deferred_state[name]), name
        assert bitwise_equal(value, deferred_state[name]), name
        assert value.requires_grad == deferred_state[name].requires_grad, name


def eager_and_materialized(make, seed=0, **materialize_options):
    eager, deferred = eager_and_deferred(make, seed)
    torchdefer.materialize_module(deferred, **materialize_options)
    return eager, deferred


class default_dtype:
    def __init__(self, dtype):
        self.dtype = dtype

    def __enter__(self):
        self.saved = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.saved)


class BuiltUnderADefaultDtype(torch.nn.Module):
    """Factories without a dtype, and type promotion that picks the default dtype."""

    def __init__(self, dtype):
        super().__init__()
        with default_dtype(dtype):
            self.linear = torch.nn.Linear(4, 4)
            self.register_buffer("ratio", torch.arange(5) / 3)
            self.register_buffer("root", torch.sqrt(torch.arange(6)) * 0.5)
            self.register_buffer("filled", torch.full((3,), 1.5) + torch.linspace(0, 1, 3))
            self.noise = torch.nn.Parameter(torch.randn(17, 2))
        self.after = torch.nn.Parameter(torch.randn(3))  # the default dtype back to float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64, torch.float16])
def test_a_default_dtype_set_during_construction_materializes_eagers_bits(dtype):
    eager, deferred = eager_and_materialized(lambda: BuiltUnderADefaultDtype(dtype))
    assert deferred.linear.weight.dtype == dtype and deferred.ratio.dtype == dtype
    assert deferred.after.dtype == torch.float32
    assert_same_state(eager, deferred)


@pytest.mark.parametrize("recorded, materialized", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)])
def test_materializing_under_another_default_dtype_gives_what_recording_saw(recorded, materialized):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 5)
            self.register_buffer("ratio", torch.arange(4) / 7)

    with default_dtype(recorded):
        torch.manual_seed(1)
        eager = Model()
        torch.manual_seed(1)
        deferred = torchdefer.deferred_init(Model)
    with default_dtype(materialized):
        torchdefer.materialize_module(deferred)
    assert torch.get_default_dtype() == torch.float32
    assert_same_state(eager, deferred)


def test_a_value_read_after_the_default_dtype_changed_is_eagers():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            with default_dtype(torch.bfloat16):
                steps = torch.arange(7) / 3
            self.register_buffer("count", torch.zeros(int(steps.sum().item() * 10)))

    eager, deferred = eager_and_materialized(Model)
    assert_same_state(eager, deferred)


class OnADefaultDevice(torch.nn.Module):
    def __init__(self, device):
        super().__init__()
        torch.set_default_device(device)
        try:
            self.a = torch.nn.Linear(3, 3)
        finally:
            torch.set_default_device(None)
        with torch.device(device):
            self.b = torch.nn.Parameter(torch.randn(4))
        self.c = torch.nn.Parameter(torch.randn(2))


def test_the_default_device_of_construction_is_recorded():
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(OnADefaultDevice, "cuda")  # a fake CUDA device: no GPU needed
    assert deferred.a.weight.device.type == "cuda" and deferred.b.device.type == "cuda"
    assert deferred.c.device.type == "cpu"
    torchdefer.materialize_module(deferred, device="cpu")  # torch mode follows the CPU generator
    torch.manual_seed(0)
    assert_same_state(OnADefaultDevice("cpu"), deferred)


@pytest.mark.parametrize("grad", [torch.no_grad, torch.enable_grad])
def test_grad_mode_of_construction_decides_requires_grad_as_in_eager(grad):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(5))
            with grad():
                self.register_buffer("twice", self.w * 2)

    eager, deferred = eager_and_materialized(Model)
    assert_same_state(eager, deferred)
    assert (deferred.twice.grad_fn is None) == (eager.twice.grad_fn is None)


def test_hugging_face_from_config_with_a_bfloat16_dtype_materializes_eagers_bits():
    import transformers  # installed by scripts/dev.sh; a missing one must fail, not skip

    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32,
    )
    make = lambda: transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # noqa: E731
    eager, deferred = eager_and_materialized(make)
    assert deferred.model.embed_tokens.weight.dtype == torch.bfloat16
    assert torch.get_default_dtype() == torch.float32
    assert_same_state(eager, deferred)


# Real tensors written while recording.


class CopiesIntoARealTensor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        t = torch.tensor([1.0, 2.0, 3.0])
        t.copy_(torch.randn(3))
        self.register_buffer("copied", t)
        self.after = torch.nn.Parameter(torch.randn(4))


def test_a_real_tensor_written_with_recorded_values_holds_eagers_values():
    eager, deferred = eager_and_materialized(CopiesIntoARealTensor)
    assert_same_state(eager, deferred)


def test_a_real_tensor_written_while_recording_is_real_at_once():
    torch.manual_seed(0)
    eager = CopiesIntoARealTensor()
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(CopiesIntoARealTensor)
    assert not torchdefer.is_fake(deferred.copied)
    assert bitwise_equal(deferred.copied, eager.copied)


def test_sparse_init_of_a_real_weight_matches_eager():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            w = torch.tensor([[0.0] * 5] * 6)
            torch.nn.init.sparse_(w, 0.5)  # indexes w with a recorded randperm
            self.w = torch.nn.Parameter(w)
            self.v = torch.nn.Parameter(torch.randn(3, 3))

    eager, deferred = eager_and_materialized(Model)
    assert_same_state(eager, deferred)


def test_a_random_write_into_a_real_tensor_draws_where_eager_draws():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            t = torch.tensor([0.0] * 20)
            t.bernoulli_(torch.rand(20))  # probabilities recorded, the draw real
            self.register_buffer("mask", t)
            self.w = torch.nn.Parameter(torch.randn(40))

    eager, deferred = eager_and_materialized(Model)
    assert_same_state(eager, deferred)


def test_batchnorm_num_batches_tracked_incremented_after_a_recorded_read():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm1d(3)
            self.register_buffer("seen", self.norm.num_batches_tracked + torch.randint(0, 3, ()))
            self.norm.num_batches_tracked += 1

    eager, deferred = eager_and_materialized(Model)
    assert_same_state(eager, deferred)
    assert deferred.norm.num_batches_tracked.item() == 1


@pytest.mark.parametrize("write", ["inplace", "data", "view", "recorded"])
def test_recorded_reads_of_a_real_tensor_keep_what_they_read_before_a_write(write):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            t = torch.tensor([0.5, 1.5, -2.0, 4.0])
            self.register_buffer("before", torch.randn(4) * t)
            if write == "inplace":
                t.mul_(3)
            elif write == "data":
                t.data.add_(1)  # a new version counter: found by storage
            elif write == "view":
                t[1:].zero_()
            else:
                t.copy_(torch.rand(4))
            self.register_buffer("after", t + torch.zeros(4))

    eager, deferred = eager_and_materialized(Model)
    assert_same_state(eager, deferred)


def test_a_real_tensor_written_while_recording_shards_like_the_full_counter_model():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            t = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
            t.add_(torch.rand(3, 2))
            self.register_buffer("real", t)
            self.w = torch.nn.Parameter(torch.randn(5, 2) * t.sum())

    torch.manual_seed(3)
    full = torchdefer.deferred_init(Model)
    torchdefer.materialize_module(full, rng="counter")
    parts = []
    for rank in range(3):
        torch.manual_seed(3)
        part = torchdefer.deferred_init(Model)
        torchdefer.materialize_module(part, shard=torchdefer.Shard(rank, 3))
        assert bitwise_equal(part.real, full.real)
        parts.append(part.w.detach())
    assert bitwise_equal(torch.cat(parts), full.w)


def test_writing_recorded_values_into_a_real_tensor_after_deferred_init_is_refused():
    real = torch.ones(3)
    fake = torchdefer.deferred_init(torch.randn, 3)
    with pytest.raises(RuntimeError, match="would write into the real tensor"):
        real.copy_(fake)
    assert bitwise_equal(real, torch.ones(3))


def test_writing_values_of_a_plain_fake_mode_into_a_real_tensor_is_refused_while_recording():
    with torchdefer.fake_mode():
        unrecorded = torch.empty(3)

    def build():
        real = torch.tensor([1.0, 2.0, 3.0])
        real.copy_(unrecorded)
        return real

    with pytest.raises(RuntimeError, match="would write into the real tensor"):
        torchdefer.deferred_init(build)
