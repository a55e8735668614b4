"""DTensor layouts of tensors a deferred model gained after deferred_init returned: refused with
a message that names the tensor, says it was set after deferred_init returned and where to set
it instead (Note [DTensor parameters of a deferred model] in bindings/torchdefer/_dtensor.py).
"""

import pytest
import torch
import torchdefer
import torchdefer.distributed
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard, distribute_tensor

from test_distributed import run_ranks

SET_AFTER_RETURN = r"was set after deferred_init returned.*Set it inside the function deferred_init runs"


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 10)
        self.b = nn.Linear(10, 6)


def set_after_return(model):
    model.c = nn.Parameter(model.b.weight.detach().t().contiguous() + 1)
    model.register_buffer("computed", model.a.weight.detach() * 2)
    return model


def set_after_return_worker(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    sharded = set_after_return(torchdefer.deferred_init(Pair))
    fully_shard(sharded, mesh=mesh)
    with pytest.raises(RuntimeError, match=r"^torchdefer: c is a DTensor.*" + SET_AFTER_RETURN):
        torchdefer.distributed.materialize_fully_sharded(sharded)
    distributed = set_after_return(torchdefer.deferred_init(Pair))
    distributed.register_buffer("computed", distribute_tensor(distributed.computed, mesh, [Shard(0)]))
    with pytest.raises(RuntimeError, match=r"^torchdefer: computed is a DTensor.*" + SET_AFTER_RETURN):
        torchdefer.materialize_module(distributed)
    # Set inside the function deferred_init runs, the same tensors are remembered and materialize.
    inside = torchdefer.deferred_init(lambda: set_after_return(Pair()))
    fully_shard(inside, mesh=mesh)
    torchdefer.distributed.materialize_fully_sharded(inside)
    assert not torchdefer.is_deferred(inside)


def test_a_dtensor_of_a_tensor_set_after_return_is_refused_saying_where_to_set_it(tmp_path):
    run_ranks(tmp_path, 2, set_after_return_worker)
