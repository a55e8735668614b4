"""The recipes of docs/integrations.md: `with torchdefer.deferred():` where Lightning Fabric's
`init_module()` or accelerate's `init_empty_weights()` would go, on 2 CPU ranks over Gloo.

Each test also checks the framework's own empty initialization on the same model, the behaviour
the recipe replaces: if a framework release starts giving eager's weights itself, that assertion
fails and the docs' comparison must be updated.
"""

import os

import pytest
import torch
import torchdefer
import torchdefer.compat
import torchdefer.distributed
import transformers
import lightning  # noqa: F401  installed by scripts/dev.sh; a missing one must fail, not skip

from test_distributed import run_ranks
from test_hf_zoo import SMALL
from test_torchdefer import bitwise_equal


class Encoder(torch.nn.Module):
    """A small transformer: attention without reset_parameters(), a custom init in __init__, and a
    buffer, the three things Fabric's empty initialization cannot restore."""

    def __init__(self, dim=16, layers=2, vocab=37):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        torch.nn.init.normal_(self.embed.weight, std=0.02)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(dim, 2, 2 * dim, dropout=0.0, batch_first=True) for _ in range(layers)
        )
        self.head = torch.nn.Linear(dim, vocab)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, dim))

    def forward(self, tokens):
        x = self.embed(tokens) * self.scale
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _fabric_environment(rank, world):
    # The ranks are forked with their process group already initialized (run_ranks); Fabric reads
    # who it is from the environment and reuses that group.
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), NODE_RANK="0",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT="1")


def _unequal(expected, actual):
    return sorted(name for name, value in expected.items() if not bitwise_equal(value, actual[name]))


def _report(rank, what, unequal, expected):
    """One line for docs/integrations.md (`pytest -s` shows it)."""
    if rank == 0:
        print(f"\n{what}: {len(expected) - len(unequal)} of {len(expected)} tensors equal to eager",
              flush=True)


def _fully_shard_then_materialize(model, mesh):
    """The parallelize_fn of the FSDP2 recipe: fully_shard as for a meta-device model, then
    materialize each rank's shards in torch RNG mode (eager's values)."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if torchdefer.is_deferred(model):
        torchdefer.distributed.materialize_fully_sharded(model, rng="torch")
    return model


def _full_state_fsdp2(model):
    from torch.distributed.tensor import DTensor

    return {
        name: (value.full_tensor() if isinstance(value, DTensor) else value).detach()
        for name, value in model.state_dict().items()
    }


def _fabric_fsdp2_ranks(rank, world):
    from lightning.fabric import Fabric
    from lightning.fabric.strategies import ModelParallelStrategy

    _fabric_environment(rank, world)
    strategy = ModelParallelStrategy(_fully_shard_then_materialize, data_parallel_size=world,
                                     tensor_parallel_size=1)
    fabric = Fabric(accelerator="cpu", devices=world, strategy=strategy)
    fabric.launch()
    torch.manual_seed(0)
    eager = Encoder()
    tokens = torch.randint(0, 37, (2, 5))
    expected = eager.state_dict()

    torch.manual_seed(0)
    with torchdefer.deferred(), fabric.init_module(empty_init=False):
        model = Encoder()
    assert torchdefer.is_deferred(model)
    model = fabric.setup_module(model)
    assert not torchdefer.is_deferred(model.module)
    assert _unequal(expected, _full_state_fsdp2(model.module)) == []
    assert bitwise_equal(model(tokens), eager(tokens))

    torch.manual_seed(0)
    with fabric.init_module(empty_init=True):
        empty = Encoder()
    empty = fabric.setup_module(empty)
    unequal = _unequal(expected, _full_state_fsdp2(empty.module))
    _report(rank, "Fabric ModelParallelStrategy, init_module(empty_init=True)", unequal, expected)
    assert len(unequal) > 0


def test_fabric_fsdp2_deferred_block_gives_eager_weights(tmp_path):
    run_ranks(tmp_path, 2, _fabric_fsdp2_ranks)


def _cpu_fsdp1_strategy(world, **kwargs):
    """Fabric's FSDPStrategy, on CPU. Fabric refuses FSDP without a GPU, a check that accepts a
    subclass, and passes FSDP `device_id=root_device.index`, which is None on CPU, where FSDP1
    needs the device itself; wrapping is the only step this subclass does differently."""
    from lightning.fabric.strategies import FSDPStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel

    class CpuFSDPStrategy(FSDPStrategy):
        def setup_module(self, module):
            return FullyShardedDataParallel(module, device_id=self.root_device,
                                            sharding_strategy=self.sharding_strategy,
                                            **self._fsdp_kwargs)

    return CpuFSDPStrategy(parallel_devices=[torch.device("cpu")] * world, **kwargs)


def _fabric_fsdp1_ranks(rank, world):
    from lightning.fabric import Fabric
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    _fabric_environment(rank, world)
    torchdefer.compat.install()
    policy = ModuleWrapPolicy({torch.nn.TransformerEncoderLayer})
    fabric = Fabric(accelerator="cpu", devices=world,
                    strategy=_cpu_fsdp1_strategy(world, auto_wrap_policy=policy))
    fabric.launch()
    torch.manual_seed(0)
    eager = Encoder()
    tokens = torch.randint(0, 37, (2, 5))

    torch.manual_seed(0)
    with torchdefer.deferred(), fabric.init_module(empty_init=False):
        model = Encoder()
    assert torchdefer.is_deferred(model)
    model = fabric.setup_module(model)  # FSDP1 materializes each unit through the compat hook
    root = next(m for m in model.modules() if isinstance(m, FullyShardedDataParallel))
    with FullyShardedDataParallel.summon_full_params(root):
        actual = {name.replace("_fsdp_wrapped_module.", ""): value.detach().clone()
                  for name, value in root.named_parameters()}
        actual.update((name.replace("_fsdp_wrapped_module.", ""), value)
                      for name, value in root.named_buffers())
    assert _unequal(eager.state_dict(), actual) == []
    assert bitwise_equal(model(tokens), eager(tokens))

    torch.manual_seed(0)
    with pytest.raises(AttributeError, match="has no attribute 'reset_parameters'"):
        with fabric.init_module(empty_init=True):
            empty = Encoder()
        fabric.setup_module(empty)


def test_fabric_fsdp1_deferred_block_gives_eager_weights_through_the_compat_hook(tmp_path):
    run_ranks(tmp_path, 2, _fabric_fsdp1_ranks)


def _accelerate_ranks(rank, world):
    from accelerate import Accelerator, init_empty_weights

    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == world
    config = transformers.LlamaConfig(**SMALL)
    torch.manual_seed(0)
    expected = transformers.AutoModelForCausalLM.from_config(config).state_dict()

    torch.manual_seed(0)
    with torchdefer.deferred():
        model = transformers.AutoModelForCausalLM.from_config(config)
    torchdefer.materialize_module(model)
    model = accelerator.prepare(model)
    assert _unequal(expected, accelerator.unwrap_model(model).state_dict()) == []

    torch.manual_seed(0)
    with init_empty_weights():
        empty = transformers.AutoModelForCausalLM.from_config(config)
    empty.to_empty(device="cpu")
    empty.init_weights()
    empty = accelerator.prepare(empty)
    unequal = _unequal(expected, accelerator.unwrap_model(empty).state_dict())
    _report(rank, "accelerate, init_empty_weights() + to_empty + init_weights()", unequal, expected)
    assert len(unequal) > 0


def test_accelerate_deferred_block_gives_eager_weights_of_a_hugging_face_model(tmp_path):
    run_ranks(tmp_path, 2, _accelerate_ranks)
