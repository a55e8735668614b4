"""Peak host memory of one FSDP2 rank while a model is built and sharded, three ways.

    MALLOC_MMAP_THRESHOLD_=1048576 PYTHONPATH=build/python \
        python3 bench/fsdp2_memory.py --world 2 --layers 8 --dim 4096

(A fixed mmap threshold makes glibc return every freed block of 1 MiB or more to the system.
With its default, dynamic threshold, freed blocks of up to 32 MiB stay in the heap, resident,
and the peak measures the allocator's retention, not the program's peak.)

W processes on Gloo (CPU, 127.0.0.1, FileStore). Every rank builds the same model of `layers`
Linear(dim, dim) layers and applies fully_shard to each layer and to the root:

  eager     the model built eagerly, then fully_shard
  torchdefer  deferred_init, fully_shard, torchdefer.distributed.materialize_fully_sharded
              (counter mode, and torch mode)

Measured per rank, after one small warm-up build of each kind: the growth of the peak resident
set (VmHWM, reset through /proc/self/clear_refs before each build) over the resident set before
it, next to the bytes of this rank's local shards and of the whole model.
"""

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torchdefer
from process_memory import reset_peak, status_kib
import torchdefer.distributed


def build(how, layers, dim, mesh):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)

    def make():
        return torch.nn.Sequential(*(torch.nn.Linear(dim, dim) for _ in range(layers)))

    model = make() if how == "eager" else torchdefer.deferred_init(make)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if how != "eager":
        torchdefer.distributed.materialize_fully_sharded(model, rng=how.split("-")[1])
    return model


def rank_main(rank, world, store, layers, dim):
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    full_mib = layers * (dim * dim + dim) * 4 / 2**20
    for how in ["torchdefer-counter", "torchdefer-torch", "eager"]:
        build(how, 1, 64, mesh)  # one-time costs (imports, first collectives) out of the way
    for how in ["torchdefer-counter", "torchdefer-torch", "eager"]:
        reset_peak()
        before = status_kib("VmRSS")
        model = build(how, layers, dim, mesh)
        peak = (status_kib("VmHWM") - before) / 1024
        shard_mib = sum(p.to_local().nbytes for p in model.parameters()) / 2**20
        for r in range(world):
            if r == rank:
                print(
                    f"{how:19s} rank {rank}/{world}: peak RSS growth {peak:7.1f} MiB; "
                    f"local shards {shard_mib:6.1f} MiB; whole model {full_mib:6.1f} MiB",
                    flush=True,
                )
            dist.barrier()
        del model
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dim", type=int, default=4096)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        mp.start_processes(
            rank_main,
            args=(args.world, store, args.layers, args.dim),
            nprocs=args.world,
            start_method="fork",
        )


if __name__ == "__main__":
    main()
