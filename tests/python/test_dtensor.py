"""DTensor layouts of one deferred model give one set of weights (issue 14 §1, §2).

Four ranks on a Gloo process group (forked, meeting through a FileStore, as in
test_distributed.py) record the same small Llama (examples/llama.py), lay it out with FSDP2,
tensor parallelism and both, on 1-D, 2-D and 3-D meshes, and materialize it with
`torchdefer.materialize_module`. On every rank, every all-gathered parameter and every buffer is
bitwise the single-process counter-mode model, and no sharded tensor was computed whole.
"""

import os
import sys

import pytest
import torch
import torchdefer
import torchdefer.distributed
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from test_distributed import run_ranks
from test_torchdefer import bitwise_equal

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from llama import Config, Llama, fully_shard_llama, tensor_parallel  # noqa: E402

SEED = 7


def record():
    torch.manual_seed(SEED)
    return torchdefer.deferred_init(Llama, Config())


def single_process_model():
    model = record()
    torchdefer.materialize_module(model, rng="counter")
    return model


def fsdp2_w4(model):
    fully_shard_llama(model, init_device_mesh("cpu", (4,)))


def fsdp2_w2(model):  # HSDP: shards over 2 ranks, replicated over the other 2
    fully_shard_llama(model, init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard")))


def tp4(model):
    tensor_parallel(model, init_device_mesh("cpu", (4,)))


def tp2(model):
    tensor_parallel(model, init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))["tp"])


def fsdp2_tp_2x2(model):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tensor_parallel(model, mesh["tp"])
    fully_shard_llama(model, mesh["dp"])


def hsdp_tp_3d(model):  # a 3-D mesh: replicate × shard × tensor parallel
    mesh = init_device_mesh("cpu", (1, 2, 2), mesh_dim_names=("replicate", "shard", "tp"))
    tensor_parallel(model, mesh["tp"])
    fully_shard_llama(model, mesh["replicate", "shard"])


LAYOUTS = [fsdp2_w4, fsdp2_w2, tp4, tp2, fsdp2_tp_2x2, hsdp_tp_3d]


def check_same_weights(model, reference, layout):
    expected = dict(reference.named_parameters()) | dict(reference.named_buffers())
    seen = 0
    for name, value in list(model.named_parameters()) + list(model.named_buffers()):
        full = value.full_tensor() if isinstance(value, DTensor) else value
        assert bitwise_equal(full.detach(), expected[name].detach()), f"{layout}: {name}"
        seen += 1
    assert seen == len(expected), layout


def layouts_worker(rank, world):
    reference = single_process_model()
    tokens = torch.arange(16).remainder(101).view(2, 8)
    for layout in LAYOUTS:
        model = record()
        layout(model)
        assert torchdefer.is_deferred(model), layout.__name__
        stats = torchdefer.materialize_module(model)  # counter mode: the module holds DTensors
        assert not torchdefer.is_deferred(model), layout.__name__
        sharded = [s for s in stats if s["box"] is not None]
        assert sharded, layout.__name__
        for s in sharded:  # each computed alone: no whole tensor, no whole input
            assert s["sliced"] and not s["fallback"] and s["bytes_computed"] == s["bytes_kept"], s
        check_same_weights(model, reference, layout.__name__)
        if layout in (fsdp2_tp_2x2, hsdp_tp_3d):  # FSDP2 over tensor parallelism shards strided
            assert any("_StridedShard" in repr(p.placements) for p in model.parameters())
        logits = model(tokens)
        assert torch.allclose(logits, reference(tokens), atol=1e-5), layout.__name__


def test_every_layout_all_gathers_to_the_single_process_counter_model(tmp_path):
    run_ranks(tmp_path, 4, layouts_worker)


# --- distribute_tensor with any placements ----------------------------------------------------


class Blocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(7, 9, 5))
        torch.nn.init.normal_(self.weight)
        self.bias = torch.nn.Parameter(torch.rand(5) * 2 - 1)
        self.register_buffer("table", torch.linspace(0, 1, 6 * 11).view(6, 11).exp())


PLACEMENTS = {
    (4,): [(Shard(0),), (Shard(1),), (Shard(2),), (Replicate(),)],
    (2, 2): [(Shard(0), Shard(1)), (Shard(2), Shard(0)), (Shard(1), Shard(1)), (Replicate(), Shard(2))],
    (2, 1, 2): [(Shard(1), Replicate(), Shard(0)), (Shard(0), Shard(2), Shard(0)), (Shard(2), Shard(1), Shard(2))],
}


def placements_worker(rank, world):
    torch.manual_seed(SEED)
    reference = torchdefer.deferred_init(Blocks)
    torchdefer.materialize_module(reference, rng="counter")
    for shape, cases in PLACEMENTS.items():
        mesh = init_device_mesh("cpu", shape)
        for placements in cases:
            torch.manual_seed(SEED)
            model = torchdefer.deferred_init(Blocks)
            model.weight = torch.nn.Parameter(distribute_tensor(model.weight, mesh, placements))
            on_2d = tuple(Shard(p.dim % 2) if isinstance(p, Shard) else p for p in placements)
            table = distribute_tensor(model.table, mesh, on_2d)
            model.register_buffer("table", table)
            stats = torchdefer.distributed.materialize_fully_sharded(model)
            assert {s["name"] for s in stats} == {"weight", "bias", "table"}
            for name, expected in list(reference.named_parameters()) + list(reference.named_buffers()):
                value = getattr(model, name)
                full = value.full_tensor() if isinstance(value, DTensor) else value
                assert bitwise_equal(full.detach(), expected.detach()), (shape, placements, name)


def test_distribute_tensor_with_any_placements_on_1d_2d_and_3d_meshes(tmp_path):
    run_ranks(tmp_path, 4, placements_worker)


def test_a_dtensor_whose_recorded_tensor_is_unknown_is_refused(tmp_path):
    run_ranks(tmp_path, 2, unknown_worker)


def unknown_worker(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    model = torch.nn.Linear(4, 4)
    torch.manual_seed(SEED)
    stray = torchdefer.deferred_init(torch.nn.Linear, 4, 6)
    model.weight = torch.nn.Parameter(distribute_tensor(stray.weight, mesh, [Shard(0)]))
    with pytest.raises(RuntimeError, match="weight is a DTensor whose local tensor is fake, but no fake"):
        torchdefer.materialize_module(model)
    with pytest.raises(ValueError, match="shard does not apply to a module holding DTensors"):
        torchdefer.materialize_module(model, shard=torchdefer.Shard(rank, world))


# --- The box of each placement, against PyTorch's own arithmetic --------------------------------


def torch_local_shape_and_offset(shape, mesh_shape, coordinate, placements):
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    return _compute_local_shape_and_global_offset(shape, mesh_shape, list(coordinate), placements)


def placement_cases():
    from torch.distributed.tensor.placement_types import _StridedShard

    for mesh_shape in [(2,), (3,), (4,), (2, 2), (2, 3), (3, 2), (2, 1, 2)]:
        choices = [Replicate(), Shard(0), Shard(1)]
        combos = [[]]
        for _ in mesh_shape:
            combos = [c + [p] for c in combos for p in choices]
        for placements in combos:
            yield mesh_shape, tuple(placements)
        if len(mesh_shape) == 2:  # FSDP2 over tensor parallelism: dim 0 split right to left
            yield mesh_shape, (_StridedShard(0, split_factor=mesh_shape[1]), Shard(0))


def test_a_dtensors_box_is_its_local_shape_and_offset_as_pytorch_computes_them():
    """Every placement on 1-D to 3-D meshes, uneven and empty shards included; a strided shard
    whose indices are not one range (uneven sizes that FSDP2 over tensor parallelism can meet) is
    refused with a message rather than computed as something else."""
    import itertools

    from torchdefer._dtensor import local_box

    checked = refused = 0
    for mesh_shape, placements in placement_cases():
        for shape in [(0, 3), (1, 5), (5, 7), (7, 2), (8, 9), (13, 6)]:
            for coordinate in itertools.product(*(range(n) for n in mesh_shape)):
                expected_shape, expected_offset = torch_local_shape_and_offset(shape, mesh_shape, coordinate, placements)
                try:
                    box = local_box("t", shape, mesh_shape, coordinate, placements)
                except ValueError as error:  # strided and uneven: PyTorch's indices are not one range
                    assert "not one range" in str(error) and "_StridedShard" in repr(placements)
                    refused += 1
                    continue
                if box is None:
                    assert all(isinstance(p, Replicate) for p in placements)
                    assert tuple(expected_shape) == shape
                    continue
                start, stop = box
                assert tuple(b - a for a, b in zip(start, stop)) == tuple(expected_shape), (shape, placements, coordinate)
                for dim, size in enumerate(expected_shape):
                    if size > 0:  # PyTorch puts an empty shard at the end, as torchdefer does
                        assert start[dim] == expected_offset[dim], (shape, placements, coordinate, box)
                checked += 1
    assert checked > 1000 and refused < checked / 100
