"""cuda_draws (Note [Torch-mode draws on CUDA] in recorder/internal/torchdefer/cuda_draws.h) on any
machine: a recording whose CUDA random ops draw from CUDA's generator leaves the CPU generator
where eager construction on the GPU does, gives counter mode the same values as one on the CPU
generator, and, with no CUDA device to read that generator, refuses torch mode for those ops with
an error that says what to do. tests/python/test_cuda.py checks the values on a GPU."""

import pytest
import torch
import torchdefer

from test_torchdefer import bitwise_equal


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(16, 32)
        torch.nn.init.trunc_normal_(self.first.weight, std=0.02)
        self.second = torch.nn.Linear(32, 8)
        self.register_buffer("mask", torch.nn.functional.dropout(torch.ones(64), 0.5))


def on_fake_cuda(cuda_draws, seed=3):
    torch.manual_seed(seed)
    with torch.device("cuda"):
        return torchdefer.deferred_init(TwoLayers, cuda_draws=cuda_draws)


def test_recording_on_cudas_generator_leaves_the_cpu_generator_alone():
    torch.manual_seed(3)
    before = torch.get_rng_state()
    on_fake_cuda("cuda")
    assert torch.equal(torch.get_rng_state(), before)
    on_fake_cuda("cpu")
    assert not torch.equal(torch.get_rng_state(), before)


def test_counter_mode_gives_the_same_values_whichever_generator_the_recording_followed():
    from_cuda, from_cpu = on_fake_cuda("cuda"), on_fake_cuda("cpu")
    for model in (from_cuda, from_cpu):
        torchdefer.materialize_module(model, rng="counter", device="cpu")
    cpu_state = dict(from_cpu.state_dict())
    for name, value in from_cuda.state_dict().items():
        assert bitwise_equal(value, cpu_state[name]), name


def test_a_cpu_random_op_in_a_recording_on_cudas_generator_draws_as_in_eager():
    def build():
        on_gpu = torch.randn(5, device="cuda")
        on_cpu = torch.randn(4, device="cpu")
        return on_gpu, on_cpu

    torch.manual_seed(9)
    expected = torch.randn(4)  # eager on the GPU: the CUDA draw leaves the CPU generator alone
    torch.manual_seed(9)
    _, on_cpu = torchdefer.deferred_init(build, cuda_draws="cuda")
    assert bitwise_equal(torchdefer.materialize_tensor(on_cpu), expected)


@pytest.mark.skipif(torch.cuda.is_available(), reason="test_cuda.py checks torch mode with a GPU")
def test_torch_mode_without_a_cuda_device_names_the_op_and_loses_nothing():
    model = on_fake_cuda("cuda")
    with pytest.raises(RuntimeError, match=r"no CUDA device was present.*cuda_draws=\"cpu\""):
        torchdefer.materialize_module(model, device="cpu")
    assert all(torchdefer.is_fake(t) for t in model.parameters())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the default is \"cuda\" with a GPU")
def test_without_a_cuda_device_the_default_draws_from_the_cpu_generator():
    default, from_cpu = on_fake_cuda(None), on_fake_cuda("cpu")
    torchdefer.materialize_module(default, device="cpu")
    torchdefer.materialize_module(from_cpu, device="cpu")
    for name, value in from_cpu.state_dict().items():
        assert bitwise_equal(default.state_dict()[name], value), name


def test_the_deferred_block_takes_cuda_draws_too():
    torch.manual_seed(3)
    before = torch.get_rng_state()
    with torch.device("cuda"), torchdefer.deferred(cuda_draws="cuda"):
        torch.nn.Linear(4, 4)
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("entry", ["deferred_init", "deferred"])
def test_an_unknown_cuda_draws_names_the_choices(entry):
    with pytest.raises(ValueError, match=r"cuda_draws must be \"cuda\".*\"cpu\".*got 'gpu'"):
        if entry == "deferred_init":
            torchdefer.deferred_init(torch.nn.Linear, 2, 2, cuda_draws="gpu")
        else:
            with torchdefer.deferred(cuda_draws="gpu"):
                pass


def test_reading_cudas_generator_state_while_recording_pays_what_recordings_owe_first():
    """Note [The generator's state read while recording]: torch.cuda.get_rng_state and
    get_rng_state_all are wrapped while a recording is open (fork_rng reads them), and restored
    after."""
    originals = torch.cuda.get_rng_state, torch.cuda.get_rng_state_all
    with torchdefer.deferred():
        wrapped = torch.cuda.get_rng_state, torch.cuda.get_rng_state_all
    assert all(w is not o and w.__wrapped__ is o for w, o in zip(wrapped, originals))
    assert (torch.cuda.get_rng_state, torch.cuda.get_rng_state_all) == originals
