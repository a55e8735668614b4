"""Peak host memory of one FSDP1 rank while a deferred model is wrapped, next to eager.

    PYTHONPATH=build/python python3 bench/fsdp1_memory.py --world 2
    MALLOC_MMAP_THRESHOLD_=1048576 PYTHONPATH=build/python python3 bench/fsdp1_memory.py --world 2

W processes on Gloo (CPU, FileStore). Every rank builds the same Llama-shaped model (an
embedding, `layers` blocks of four Linear(dim, dim) and a norm, an output Linear(dim, vocab)) and
wraps it in FullyShardedDataParallel with ModuleWrapPolicy({Block}), so each block is a unit and
the root unit holds the embedding, the final norm and the output layer:

  eager       the model built eagerly, then FSDP(...)
  torchdefer  deferred_init, torchdefer.compat.install(), FSDP(...): FSDP materializes each unit
              whole through the torchdistX hook as it wraps it (torch RNG mode)

`--root-units` also wraps the embedding and the output layer as units of their own (the policy
also names Embedding and the output layer's class), which shrinks the root unit.
Measured per rank, after one small warm-up build of each kind: the growth of the peak resident
set (VmHWM, reset through /proc/self/clear_refs before each build) over the resident set before
it, next to the largest unit and the whole model.
"""

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torchdefer
from process_memory import reset_peak, status_kib
import torchdefer.compat


class Block(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.norm = torch.nn.LayerNorm(dim)


class Output(torch.nn.Linear):
    pass


class Model(torch.nn.Module):
    def __init__(self, layers, dim, vocab):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.layers = torch.nn.ModuleList(Block(dim) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim)
        self.output = Output(dim, vocab, bias=False)


def build(how, layers, dim, vocab, root_units):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    torch.manual_seed(0)
    if how == "eager":
        model = Model(layers, dim, vocab)
    else:
        model = torchdefer.deferred_init(Model, layers, dim, vocab)
    classes = {Block, torch.nn.Embedding, Output} if root_units else {Block}
    return FSDP(model, auto_wrap_policy=ModuleWrapPolicy(classes), device_id=torch.device("cpu"))


def rank_main(rank, world, store, layers, dim, vocab, root_units):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torchdefer.compat.install()
    block_mib = (4 * dim * dim + 2 * dim) * 4 / 2**20
    table_mib = vocab * dim * 4 / 2**20
    full_mib = layers * block_mib + 2 * table_mib + 2 * dim * 4 / 2**20
    root_mib = 2 * dim * 4 / 2**20 + (0 if root_units else 2 * table_mib)
    largest_mib = max(block_mib, table_mib if root_units else root_mib)
    for how in ["torchdefer", "eager"]:
        build(how, 1, 64, 128, root_units)  # one-time costs (imports, first collectives)
    for how in ["torchdefer", "eager"]:
        reset_peak()
        before = status_kib("VmRSS")
        model = build(how, layers, dim, vocab, root_units)
        peak = (status_kib("VmHWM") - before) / 1024
        shard_mib = sum(p.nbytes for p in model.parameters()) / 2**20
        for r in range(world):
            if r == rank:
                print(
                    f"{how:10s} rank {rank}/{world}: peak RSS growth {peak:7.1f} MiB; "
                    f"local shards {shard_mib:6.1f} MiB; largest unit {largest_mib:6.1f} MiB; "
                    f"root unit {root_mib:6.1f} MiB; whole model {full_mib:6.1f} MiB",
                    flush=True,
                )
            dist.barrier()
        del model
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--root-units", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        mp.start_processes(
            rank_main,
            args=(args.world, store, args.layers, args.dim, args.vocab, args.root_units),
            nprocs=args.world,
            start_method="fork",
        )


if __name__ == "__main__":
    main()
