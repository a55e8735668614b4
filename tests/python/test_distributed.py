"""torchdefer on a real torch.distributed process group: Gloo on the CPU, W processes on one host.

Each test forks W ranks (fork: the children inherit the imported torch, which keeps these tests
fast) that meet through a FileStore; a failed assertion on any rank fails the test with that
rank's traceback.
"""

import datetime
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchdefer
import torchdefer.compat
import torchdefer.distributed
from torch.distributed.tensor import DTensor

from test_hf_zoo import zoo  # imports transformers once, before the ranks fork
from test_torchdefer import Gpt2Like, LlamaLike, bitwise_equal


TIMEOUT = datetime.timedelta(seconds=120)  # a hung collective fails the test, never CI


def _rank_main(rank, world, store, worker, args):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=TIMEOUT
    )
    try:
        worker(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(tmp_path, world, worker, *args):
    ranks = mp.start_processes(
        _rank_main,
        args=(world, str(tmp_path / "store"), worker, args),
        nprocs=world,
        join=False,
        start_method="fork",
    )
    deadline = time.monotonic() + TIMEOUT.total_seconds()
    while not ranks.join(timeout=1):
        if time.monotonic() > deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail(f"{world} ranks running {worker.__name__} did not finish in {TIMEOUT}")


class Block(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.up = torch.nn.Linear(dim, 2 * dim)
        self.down = torch.nn.Linear(2 * dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        torch.nn.init.normal_(self.norm.weight, 1.0, 0.1)

    def forward(self, x):
        return self.norm(x + self.down(torch.relu(self.up(x))))


class Tower(torch.nn.Module):
    """Sizes that do not divide by 2 or 4, so FSDP shards are uneven and padded."""

    def __init__(self, dim=15, blocks=3, vocab=41):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(blocks))
        self.head = torch.nn.Linear(dim, 7)
        self.register_buffer("position", torch.arange(8, dtype=torch.float32).div(8).view(8, 1))

    def forward(self, tokens):
        x = self.embed(tokens) + self.position
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def record(make, seed):
    torch.manual_seed(seed)
    return torchdefer.deferred_init(make)


# --- FSDP1 (FullyShardedDataParallel) through torchdefer.compat --------------------------------


def fsdp1_worker(rank, world, use_orig_params):
    torchdefer.compat.install()
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import _init_utils
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    torch.manual_seed(0)
    eager = Tower()
    deferred = record(Tower, 0)
    units = []
    materialize = _init_utils.deferred_init.materialize_module

    def spy(module, **kwargs):
        units.append(type(module).__name__)
        return materialize(module, **kwargs)

    _init_utils.deferred_init.materialize_module = spy
    model = FSDP(
        deferred,
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        device_id=torch.device("cpu"),
        use_orig_params=use_orig_params,
    )
    assert units == ["Block", "Block", "Block", "Tower"], units  # bottom-up, one call per unit
    tokens = torch.arange(8).remainder(41)
    with FSDP.summon_full_params(model):
        params = dict(model.named_parameters())
        assert params.keys() == dict(eager.named_parameters()).keys()
        for name, value in eager.named_parameters():
            assert bitwise_equal(params[name].detach(), value.detach()), name
        for name, value in model.named_buffers():
            assert bitwise_equal(value, eager.get_buffer(name)), name
    assert torch.equal(model(tokens), eager(tokens))


@pytest.mark.parametrize("use_orig_params", [True, False])
def test_fsdp1_materializes_a_deferred_model_unit_by_unit_with_eager_values(tmp_path, use_orig_params):
    run_ranks(tmp_path, 2, fsdp1_worker, use_orig_params)


def fsdp1_frees_originals_worker(rank, world):
    import gc
    import weakref

    torchdefer.compat.install()
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    deferred = record(Tower, 0)
    originals = [weakref.ref(p) for p in deferred.parameters()]
    model = FSDP(deferred, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))
    del deferred
    gc.collect()
    # FSDP1 flattens each unit and lets its parameters go: nothing of torchdefer's may keep them
    # (this is what keeps the per-rank peak at eager's, bench/fsdp1_memory.py).
    alive = [ref() for ref in originals if ref() is not None]
    assert not alive, [tuple(t.shape) for t in alive]
    assert model is not None


def test_fsdp1_lets_each_units_original_parameters_go(tmp_path):
    run_ranks(tmp_path, 2, fsdp1_frees_originals_worker)


# --- FSDP2 (fully_shard) ---------------------------------------------------------------------


def fsdp2_worker(rank, world, rng):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    if rng == "counter":
        reference = record(Tower, 3)
        torchdefer.materialize_module(reference, rng="counter")
    else:
        torch.manual_seed(3)
        reference = Tower()
    model = record(Tower, 3)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert torchdefer.is_deferred(model), "fully_shard's DTensors still hold fakes"
    stats = torchdefer.distributed.materialize_fully_sharded(model, rng=rng)
    assert not torchdefer.is_deferred(model)

    expected = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        assert isinstance(param, DTensor) and not torchdefer.is_fake(param.to_local()), name
        chunks = torch.chunk(expected[name].detach(), world)
        mine = chunks[rank] if rank < len(chunks) else expected[name][:0]
        assert bitwise_equal(param.to_local(), mine), name
        assert bitwise_equal(param.full_tensor(), expected[name].detach()), name  # all-gather
    for name, buffer in model.named_buffers():
        assert bitwise_equal(buffer, reference.get_buffer(name)), name

    # In counter mode each rank computed its shards, never a whole parameter: the padded local
    # buffer it keeps plus, transiently, its chunk of the parameter. In torch mode, parameters
    # with random values are computed whole (torch's generator draws in sequence), then sliced,
    # and the stats name the random op.
    sharded = [s for s in stats if s["box"] is not None]
    assert len(sharded) == len(expected)
    for s in sharded:
        if rng == "counter":
            assert s["sliced"] and s["bytes_computed"] <= 2 * s["bytes_kept"], s
        elif s["fallback"]:
            assert "normal_" in s["fallback"] or "uniform_" in s["fallback"], s
    assert rng == "counter" or any(s["fallback"] for s in sharded)

    assert torchdefer.distributed.materialize_fully_sharded(model) == []  # nothing left to do

    tokens = torch.arange(8).remainder(41)
    assert torch.equal(model(tokens), reference(tokens))
    model(tokens).square().mean().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_fsdp2_materializes_only_local_shards_equal_to_the_full_counter_model(tmp_path):
    run_ranks(tmp_path, 2, fsdp2_worker, "counter")


def test_fsdp2_in_torch_mode_gives_eager_values(tmp_path):
    run_ranks(tmp_path, 2, fsdp2_worker, "torch")


def hf_fsdp2_worker(rank, world, name, blocks):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    config, auto = zoo()[name]
    reference = record(lambda: auto.from_config(config), 5)
    torchdefer.materialize_module(reference, rng="counter")
    model = record(lambda: auto.from_config(config), 5)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.get_submodule(blocks):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    stats = torchdefer.distributed.materialize_fully_sharded(model)
    assert all(s["sliced"] for s in stats if s["box"] is not None)
    expected = dict(reference.named_parameters())
    for key, param in model.named_parameters():
        assert bitwise_equal(param.full_tensor(), expected[key].detach()), key
    if name == "gpt2-tied":
        assert model.lm_head.weight is model.transformer.wte.weight
    tokens = torch.arange(10).view(1, 10)
    assert torch.equal(model.eval()(tokens).logits, reference.eval()(tokens).logits)


@pytest.mark.parametrize("name, blocks", [("llama", "model.layers"), ("gpt2-tied", "transformer.h")])
def test_fsdp2_on_hugging_face_models(tmp_path, name, blocks):
    run_ranks(tmp_path, 2, hf_fsdp2_worker, name, blocks)


def test_materialize_fully_sharded_names_bad_input():
    with pytest.raises(TypeError, match="expects an nn.Module, got str"):
        torchdefer.distributed.materialize_fully_sharded("model")


# --- Shard(rank, W) on every rank, all-gathered (issue 4 §3) ----------------------------------


def all_gather_rows(local, global_rows, world):
    """The full tensor from every rank's torch.chunk shard (uneven, maybe empty)."""
    chunk = -(-global_rows // world)
    padded = local.new_zeros((chunk, *local.shape[1:]))
    padded[: local.shape[0]] = local
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    sizes = [max(0, min(chunk, global_rows - r * chunk)) for r in range(world)]
    return torch.cat([g[:n] for g, n in zip(gathered, sizes)])


def shards_worker(rank, world):
    for make, seed in [(LlamaLike, 11), (Gpt2Like, 12)]:
        full = record(make, seed)
        torchdefer.materialize_module(full, rng="counter")
        local = record(make, seed)
        stats = torchdefer.materialize_module(local, shard=torchdefer.Shard(rank, world))
        assert any(s["box"] is not None for s in stats)
        for name, param in full.named_parameters():
            mine = local.get_parameter(name)
            assert torchdefer.shard_info(mine)["global_shape"] == list(param.shape), name
            gathered = all_gather_rows(mine.detach(), param.shape[0], world)
            assert bitwise_equal(gathered, param.detach()), name
        for name, buffer in full.named_buffers():
            assert bitwise_equal(local.get_buffer(name), buffer), name


def test_shards_of_2_ranks_all_gather_to_the_full_counter_model(tmp_path):
    run_ranks(tmp_path, 2, shards_worker)


def test_shards_of_4_ranks_all_gather_to_the_full_counter_model(tmp_path):
    run_ranks(tmp_path, 4, shards_worker)
