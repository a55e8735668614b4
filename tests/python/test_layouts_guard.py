"""Forgetting to materialize fails at once: a forward on a deferred module, plain or under FSDP,
raises naming the module and the call to make (Note [Forgetting to materialize] in
bindings/torchdefer/_guard.py)."""

import gc
import re

import pytest
import torch
import torch.distributed as dist
import torchdefer
import torchdefer.distributed
from torch.nn.modules.module import _global_forward_pre_hooks

from test_distributed import Block, Tower, record, run_ranks
from test_torchdefer import bitwise_equal


class Attention(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.out(torch.softmax(q @ k.T, dim=-1) @ v)


class Layer(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.attn = Attention(dim)

    def forward(self, x):
        return x + self.attn(x)


class Stack(torch.nn.Module):
    def __init__(self, dim=8, layers=3):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer(dim) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def guard_hooks():
    return [hook for hook in _global_forward_pre_hooks.values() if hook.__module__ == "torchdefer._guard"]


def test_a_forward_before_materializing_names_the_module_and_the_call():
    model = record(Stack, 0)
    message = "module 'layers.0.attn.qkv' (Linear) still holds deferred tensors (weight, bias) (and 5 more modules)"
    with pytest.raises(RuntimeError, match=re.escape(message)) as error:
        model(torch.randn(4, 8))
    assert "call torchdefer.materialize_module(model) before forward" in str(error.value)
    assert "Stack.forward" in str(error.value)
    with pytest.raises(RuntimeError, match=re.escape("module 'layers.2.attn.out' (Linear)")):
        model.layers[2].attn.out(torch.randn(4, 8))
    assert torchdefer.is_deferred(model)


def test_a_materialized_model_runs_and_leaves_no_hook_behind():
    gc.collect()  # deferred models of earlier tests, held by their tracebacks' frames, go
    torch.nn.Identity()(torch.ones(1))  # and the next module call finds the table empty
    assert guard_hooks() == []
    torch.manual_seed(0)
    eager = Stack()
    model = record(Stack, 0)
    assert len(guard_hooks()) == 1
    torchdefer.materialize_module(model)
    assert guard_hooks() == []
    x = torch.randn(4, 8)
    assert bitwise_equal(model(x), eager(x))


def test_a_materialized_part_runs_while_the_rest_still_refuses():
    torch.manual_seed(0)
    eager = Stack()
    model = record(Stack, 0)
    gc.collect()
    torchdefer.materialize_module(model.layers[1])
    x = torch.randn(4, 8)
    assert bitwise_equal(model.layers[1](x), eager.layers[1](x))
    with pytest.raises(RuntimeError, match=re.escape("module 'layers.0.attn.qkv' (Linear)")):
        model(x)
    torchdefer.materialize_module(model, check_fn=lambda m: m is not model.layers[2])
    with pytest.raises(RuntimeError, match=re.escape("module 'layers.2.attn.qkv' (Linear)")):
        model(x)
    torchdefer.materialize_module(model.layers[2])
    assert bitwise_equal(model(x), eager(x))  # checked once, then forgotten: the hook is gone
    assert guard_hooks() == []


def test_buffers_and_tensor_attributes_count_and_the_root_has_its_own_label():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 3)
            self.register_buffer("mean", torch.zeros(3))
            self.scales = [torch.ones(3)]

        def forward(self, x):
            return self.linear(x - self.mean) * self.scales[0]

    model = torchdefer.deferred_init(Scaled)
    torchdefer.materialize_module(model.linear)
    with pytest.raises(RuntimeError, match=re.escape("the module deferred_init returned (Scaled) still holds deferred tensors (mean, scales)")):
        model(torch.ones(3))
    torchdefer.materialize_module(model)
    assert model(torch.ones(3)).shape == (3,)


def test_a_forward_on_fakes_on_purpose_runs_under_fake_mode():
    model = record(Stack, 0)
    with torchdefer.fake_mode():
        y = model(torch.randn(4, 8))
    assert torchdefer.is_fake(y) and y.shape == (4, 8)


def test_a_constructor_may_run_a_forward_of_a_deferred_child():
    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torchdefer.deferred_init(Stack)
            self.width = self.inner(torch.zeros(2, 8)).shape[-1]  # shape inference while recording

    model = torchdefer.deferred_init(Probe)
    assert model.width == 8


def test_results_that_are_not_modules_are_not_guarded():
    weight = torchdefer.deferred_init(torch.randn, 3, 3)
    assert torchdefer.is_fake(weight)
    layers = torchdefer.deferred_init(lambda: [torch.nn.Linear(2, 2)])
    assert torchdefer.is_fake(layers[0](torch.ones(2)))  # the caller's choice: recorded, not refused


# --- FSDP -------------------------------------------------------------------------------------


def fully_shard_worker(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    model = record(Tower, 0)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    tokens = torch.arange(8).remainder(41)
    # Before FSDP2's root lazy init (a pre-forward hook fully_shard prepends) reads a fake shard.
    call = "call torchdefer.materialize_module(model) before forward"
    held = "the module deferred_init returned (FSDPTower) still holds deferred tensors (position) (and 11 more"
    with pytest.raises(RuntimeError, match=re.escape(held)) as error:
        model(tokens)
    assert call in str(error.value)
    with pytest.raises(RuntimeError, match=re.escape("module 'blocks.1.up' (Linear)")):
        model.blocks[1](torch.zeros(8, 15))
    torchdefer.distributed.materialize_fully_sharded(model)
    reference = record(Tower, 0)
    torchdefer.materialize_module(reference, rng="counter")
    assert bitwise_equal(model(tokens), reference(tokens))
    assert guard_hooks() == []


def test_fully_shard_then_forward_before_materializing_names_the_module(tmp_path):
    run_ranks(tmp_path, 1, fully_shard_worker)


def fsdp1_worker(rank, world):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    # A param_init_fn that does nothing leaves the parameters fake (with or without
    # torchdefer.compat installed), so FSDP1 flattens fakes; its lazy init would read them.
    model = FSDP(
        record(Tower, 0),
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        device_id=torch.device("cpu"),
        param_init_fn=lambda module: None,
    )
    held = "deferred_init returned (FullyShardedDataParallel) still holds deferred tensors (params)"
    with pytest.raises(RuntimeError, match=re.escape(held)) as error:
        model(torch.arange(8).remainder(41))
    assert "call torchdefer.compat.install() before FSDP(model)" in str(error.value)


def test_fsdp1_forward_before_materializing_names_the_module(tmp_path):
    run_ranks(tmp_path, 1, fsdp1_worker)
