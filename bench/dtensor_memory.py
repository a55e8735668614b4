"""Peak host memory and time of one rank while a Llama is built under a DTensor layout, three ways.

    MALLOC_MMAP_THRESHOLD_=1048576 PYTHONPATH=build/python \
        python3 bench/dtensor_memory.py --world 4 --layout fsdp2_tp    # fsdp2 (--world 2 or 4)

W processes on Gloo (CPU, FileStore). Every rank lays out the Llama of examples/llama.py
(`--dim`, `--layers`, `--vocab`) with FSDP2 over all ranks (`fsdp2`) or FSDP2 x tensor
parallelism on a (W/2) x 2 mesh (`fsdp2_tp`), then initializes it:

  torchdefer   deferred_init, the layout, torchdefer.materialize_module (counter mode)
  meta         on the meta device, the layout, to_empty(), init_weights() on the DTensors
               (torchtitan's way; DTensor's random ops, so the weights depend on the layout)
  broadcast    rank 0 builds the whole model; the others on the meta device; the layout,
               to_empty(), set_model_state_dict(broadcast_from_rank0=True)

Per rank, after one small warm-up of each way: the growth of the peak resident set (VmHWM, reset
through /proc/self/clear_refs) over the resident set before (for torchdefer also split into the
recording's peak and the peak of the layout and materialization after it), the seconds from the
start of the build to initialized weights, and the bytes of this rank's local tensors.
"""

import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torchdefer

# Run as a script or imported as bench.dtensor_memory (by bench/harness/distributed.py).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from process_memory import reset_peak, status_kib  # noqa: E402
from llama import Config, Llama, fully_shard_llama, tensor_parallel  # noqa: E402

WAYS = ["torchdefer", "meta", "broadcast"]
RSS_BEFORE_KIB, RECORDING_PEAK_KIB = [0], [0]


def lay_out(model, layout, world):
    from torch.distributed.device_mesh import init_device_mesh

    if layout == "fsdp2":
        fully_shard_llama(model, init_device_mesh("cpu", (world,)))
        return
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    tensor_parallel(model, mesh["tp"])
    fully_shard_llama(model, mesh["dp"])


def end_recording():
    RECORDING_PEAK_KIB[0] = status_kib("VmHWM") - RSS_BEFORE_KIB[0]
    reset_peak()  # from here on: the layout and the materialization


def build(way, cfg, layout, world, after_recording=end_recording):
    """Builds the Llama of `cfg` laid out on `world` ranks, initialized `way`; for torchdefer,
    calls `after_recording()` between deferred_init and the layout."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    torch.manual_seed(0)
    if way == "torchdefer":
        model = torchdefer.deferred_init(Llama, cfg)
        after_recording()
        lay_out(model, layout, world)
        torchdefer.materialize_module(model)
        return model
    full = None
    if way == "broadcast" and dist.get_rank() == 0:
        full = Llama(cfg).state_dict()
    with torch.device("meta"):
        model = Llama(cfg)
    lay_out(model, layout, world)
    model.to_empty(device="cpu")
    if way == "meta":
        model.init_weights()
        return model
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full if full is not None else {}, options=options)
    model.init_buffers()  # non-persistent buffers are in no state dict: every rank computes them
    return model


def rank_main(rank, world, store, layout, cfg):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    small = Config(vocab=101, dim=48, layers=1, heads=4, hidden=100)
    for way in WAYS:
        build(way, small, layout, world)  # one-time costs (imports, first collectives) out of the way
    for way in WAYS:
        dist.barrier()
        reset_peak()
        before = RSS_BEFORE_KIB[0] = status_kib("VmRSS")
        start = time.perf_counter()
        model = build(way, cfg, layout, world)
        seconds = time.perf_counter() - start
        peak = (status_kib("VmHWM") - before) / 1024
        if way == "torchdefer":  # VmHWM was reset after recording: the peak is the larger of two
            after_recording = peak
            peak = max(peak, RECORDING_PEAK_KIB[0] / 1024)
        local_mib = sum(p.to_local().nbytes for p in model.parameters()) / 2**20
        whole_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
        phases = ""
        if way == "torchdefer":
            phases = f" (recording {RECORDING_PEAK_KIB[0] / 1024:.1f}, then {after_recording:.1f})"
        for r in range(world):
            if r == rank:
                print(
                    f"{layout} W={world} {way:10s} rank {rank}: peak RSS growth {peak:7.1f} MiB{phases}, "
                    f"{seconds:6.2f} s; local tensors {local_mib:6.1f} MiB of {whole_mib:6.1f} MiB",
                    flush=True,
                )
            dist.barrier()
        del model
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--layout", choices=["fsdp2", "fsdp2_tp"], default="fsdp2_tp")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=16000)
    args = parser.parse_args()
    cfg = Config(vocab=args.vocab, dim=args.dim, layers=args.layers, heads=16, hidden=4 * args.dim, max_seq=64)
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        mp.start_processes(
            rank_main, args=(args.world, store, args.layout, cfg), nprocs=args.world, start_method="fork"
        )


if __name__ == "__main__":
    main()
