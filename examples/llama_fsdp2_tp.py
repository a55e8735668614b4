"""A Llama trained from deferred initialization under FSDP2 × tensor parallelism on a 2 × 2 mesh.

    torchrun --nproc-per-node 4 examples/llama_fsdp2_tp.py

Every rank records the model (no memory, no compute), lays it out as torchtitan does (tensor
parallel within a pair of ranks, FSDP2 across pairs), and computes only its own part of each
weight. The weights are those of the single-process model `torchdefer.materialize_module(model,
rng="counter")` gives, whatever the mesh: tests/python/test_examples.py checks it. Gloo on CPUs,
NCCL on GPUs, unchanged.
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import torchdefer
from _launch import arguments, finish, full_state, start, train
from llama import Config, Llama, fully_shard_llama, tensor_parallel


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    device = start()
    mesh = init_device_mesh(device.type, (dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "tp"))
    cfg = Config()

    torch.manual_seed(args.seed)  # the same on every rank
    with torch.device(device):
        model = torchdefer.deferred_init(Llama, cfg)
    tensor_parallel(model, mesh["tp"])
    fully_shard_llama(model, mesh["dp"])
    stats = torchdefer.materialize_module(model)  # this rank's part of every weight, nothing more
    kept = sum(s["bytes_kept"] for s in stats)
    computed = sum(s["bytes_computed"] for s in stats)
    print(f"rank {dist.get_rank()}: computed {computed} B, kept {kept} B", flush=True)

    state = full_state(model)
    if args.save_initial and dist.get_rank() == 0:
        torch.save(state, args.save_initial)
    # Ranks of one tensor-parallel group read the same batch.
    train(model, args.steps, device, batch_seed=mesh["dp"].get_local_rank(), vocab=cfg.vocab)
    finish()


if __name__ == "__main__":
    main()
