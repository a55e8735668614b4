"""A Llama trained from deferred initialization under FSDP2 (fully_shard) on every rank.

    torchrun --nproc-per-node 4 examples/llama_fsdp2.py

Every rank records the model (no memory, no compute), applies fully_shard to each block and the
root as it would to a meta-device model, and computes only its shard of each weight. The weights
are those of the single-process model `torchdefer.materialize_module(model, rng="counter")`
gives, for any number of ranks: tests/python/test_examples.py checks it. Gloo on CPUs, NCCL on
GPUs, unchanged.
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import torchdefer
from _launch import arguments, finish, full_state, start, train
from llama import Config, Llama, fully_shard_llama


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    device = start()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    cfg = Config()

    torch.manual_seed(args.seed)  # the same on every rank
    with torch.device(device):
        model = torchdefer.deferred_init(Llama, cfg)
    fully_shard_llama(model, mesh)
    stats = torchdefer.materialize_module(model)  # this rank's shard of every weight, nothing more
    kept = sum(s["bytes_kept"] for s in stats)
    computed = sum(s["bytes_computed"] for s in stats)
    print(f"rank {dist.get_rank()}: computed {computed} B, kept {kept} B", flush=True)

    state = full_state(model)
    if args.save_initial and dist.get_rank() == 0:
        torch.save(state, args.save_initial)
    train(model, args.steps, device, batch_seed=dist.get_rank(), vocab=cfg.vocab)
    finish()


if __name__ == "__main__":
    main()
