"""One Python initialization strategy, measured in a process of its own (peak RSS is per process);
prints one JSON line with the same fields as the C++ runner (bench/strategy_main.cpp).

    python3 -m bench.harness.strategy --strategy py-eager --model llama-125m [--rank R --world W]

py-*  the torch.nn Llama of bench/harness/models.py (torchtitan-style init_weights);
hf-*  transformers' LlamaForCausalLM built from the same shape.

py-broadcast is one rank of a Gloo process group (MASTER_ADDR and MASTER_PORT in the
environment): rank 0 builds the model eagerly, the others on the meta device, and every tensor is
broadcast from rank 0 (what FSDP's sync_module_states does).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import torch

from bench.harness import models, plan

# The strategies this runner implements: plan.STRATEGIES is the one list of them.
STRATEGIES = [s.name for s in plan.STRATEGIES if s.runner == "py"]


def proc_status_bytes(field: str) -> int:
    """A field of /proc/self/status in bytes: VmHWM is the peak resident set, VmRSS the current."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def module_bytes(module: torch.nn.Module) -> int:
    return sum(t.nbytes for t in module.parameters()) + sum(t.nbytes for t in module.buffers())


class PhasePeak:
    """The peak resident growth of one phase (Note [Record phase on its own] in
    bench/strategy_main.cpp): VmHWM is reset to the current resident size when the phase starts
    (writing 5 to /proc/self/clear_refs), so VmHWM after it is the phase's own peak, or the
    resident size at its start if that is larger (Note [A reset VmHWM can read below the start]).

    The phase also starts with Python's garbage collected: a full collection costs tens of
    milliseconds in a process that imported torch and transformers, about what building a 70B
    model on the meta device costs, so one that the previous phase's garbage made due would land
    in whichever phase ran next. Collections the phase's own allocations cause stay in it."""

    # Note [A reset VmHWM can read below the start]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # /proc/self/status prints VmHWM as the larger of the kernel's high-water mark and the current
    # resident size. The reset sets that mark from per-CPU counters that lag the resident size
    # VmRSS prints: on Linux 6.18 here the mark sits about 350 kB below the VmRSS read right after
    # the reset, so a phase that frees more than it grows reads a VmHWM below the resident size
    # it started at (a negative growth, and a peak below the baseline). A small model's phases
    # reuse freed memory and often do not grow at all, so which way a run went depended on what
    # the heap held before it. The peak over a phase includes its start: peak() is the larger of
    # the two, read in the same units (tests/python/test_bench_harness.py frees memory held at a
    # phase's start).

    def __init__(self) -> None:
        gc.collect()
        try:
            with open("/proc/self/clear_refs", "w") as clear_refs:
                clear_refs.write("5")
            self.reset = True
        except OSError:
            self.reset = False
        self.start_rss = proc_status_bytes("VmRSS")

    def peak(self) -> int:
        """The peak resident size since the phase started (the process's, without a reset)."""
        return max(proc_status_bytes("VmHWM"), self.start_rss)

    def growth(self) -> Optional[int]:
        return self.peak() - self.start_rss if self.reset else None


def measure_meta(build: Callable[[], torch.nn.Module]) -> Dict[str, Any]:
    """Constructs the model on the meta device: the reference the record phase is compared with."""
    peak = PhasePeak()
    start = time.perf_counter()
    with torch.device("meta"):
        module = build()
    seconds = time.perf_counter() - start
    growth = peak.growth()
    del module
    return dict(meta_construct_s=seconds, meta_rss_bytes=growth)


def measure_meta_with_init(build: Callable[[], torch.nn.Module]) -> Dict[str, Any]:
    """Constructs a transformers model on the meta device and then runs the initialization that
    meta construction skips (Note [What meta construction skips in transformers])."""
    gc.collect()
    start = time.perf_counter()
    with torch.device("meta"):
        module = build()
        module.initialize_weights()
    seconds = time.perf_counter() - start
    del module
    return dict(meta_init_construct_s=seconds)


class Phases:
    """Wall time of the construction phase and of what turns the result into real weights."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {"construct_s": 0.0, "materialize_s": 0.0}
        self.construct_rss_bytes: Optional[int] = None

    def time(self, phase: str, fn: Callable[[], Any], peak: Optional[PhasePeak] = None) -> Any:
        """Times `fn` as (part of) `phase`; with `peak`, the construction phase's resident growth."""
        start = time.perf_counter()
        result = fn()
        self.seconds[phase] += time.perf_counter() - start
        if peak is not None:
            self.construct_rss_bytes = peak.growth()
        return result


def slice_rank(module: torch.nn.Module, rank: int, world: int) -> Dict[str, int]:
    """Keeps only rank's chunk (dim 0, torch.chunk semantics, as torchdefer.Shard) of each
    parameter: what a rank without deferred init does after building the whole model."""
    counts = {"tensors_sliced": 0, "elements_sliced": 0}
    with torch.no_grad():
        for p in module.parameters():
            chunk = (p.shape[0] + world - 1) // world
            start = min(rank * chunk, p.shape[0])
            counts["tensors_sliced"] += 1
            counts["elements_sliced"] += p.numel()
            p.data = p.narrow(0, start, min(chunk, p.shape[0] - start)).clone()
    return counts


def stats_counts(stats: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Sums torchdefer.materialize_module's per-tensor stats the way the C++ runner does."""
    counts: Dict[str, Any] = dict(bytes_kept=0, bytes_computed=0, tensors_sliced=0, tensors_fallback=0,
                                  tensors_whole=0, elements_sliced=0, elements_fallback=0, fallback_ops={})
    for t in stats:
        counts["bytes_kept"] += t["bytes_kept"]
        counts["bytes_computed"] += t["bytes_computed"]
        elements = 1
        for size in t["global_shape"]:
            elements *= size
        if t["box"] is None:
            counts["tensors_whole"] += 1
        elif t["sliced"]:
            counts["tensors_sliced"] += 1
            counts["elements_sliced"] += elements
        else:
            counts["tensors_fallback"] += 1
            counts["elements_fallback"] += elements
            counts["fallback_ops"][t["fallback"]] = counts["fallback_ops"].get(t["fallback"], 0) + 1
    return counts


def trainer_flow(config: models.LlamaConfig, device: str = "cpu", seeded: bool = False) -> torch.nn.Module:
    """What a trainer runs (torchtitan's order): build on the meta device, allocate with to_empty,
    then the model's own init_weights, from a torch.Generator seeded from the trainer's init seed
    when `seeded`. With device="meta", the same calls on meta tensors: the flow's meta cost, which
    its recording is compared with."""
    with torch.device("meta"):
        module = models.Llama(config)
    module.to_empty(device=device)
    module.init_weights(generator=torch.Generator().manual_seed(42) if seeded else None)
    return module


def builder(strategy: str, config: models.LlamaConfig) -> Callable[[], torch.nn.Module]:
    if strategy.startswith("py-flow-"):
        return lambda: trainer_flow(config, seeded=strategy.startswith("py-flow-seeded-"))
    if strategy.startswith("hf-"):
        import transformers

        hf_config = models.hf_config(config)
        return lambda: transformers.AutoModelForCausalLM.from_config(hf_config)
    return lambda: models.Llama(config)


def reinitialize(strategy: str, module: torch.nn.Module) -> None:
    """The model's own initialization, run again on storage to_empty() allocated."""
    if strategy.startswith("hf-"):
        module.apply(module._init_weights)
    else:
        module.init_weights()


def broadcast_from_rank0(module: torch.nn.Module) -> None:
    import torch.distributed as dist

    for tensor in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(tensor.data, src=0)


def run(strategy: str, config: models.LlamaConfig, rank: int, world: int, device: torch.device) -> Dict[str, Any]:
    """Builds `config` with `strategy` and measures it (Note [Warm-up run])."""
    build = builder(strategy, config)
    # A trainer's flow allocates in to_empty: its reference is the same flow kept on meta.
    seeded = strategy.startswith("py-flow-seeded-")
    meta = measure_meta((lambda: trainer_flow(config, "meta", seeded)) if strategy.startswith("py-flow-") else build)
    # Note [What meta construction skips in transformers]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # transformers' PreTrainedModel.init_weights (modeling_utils.py, run by post_init at the end
    # of every model's __init__) calls initialize_weights() only when
    # get_torch_context_manager_or_global_device() is not the meta device: on the meta device the
    # walk of every module through _init_weights and its torch.nn.init calls is skipped, while
    # eager construction, and so deferred_init, which records eager's, run it. The HF deferred
    # strategies also measure meta construction followed by that walk (on meta tensors, so its
    # fills run torch's meta kernels), as a second reference next to the issue's.
    meta["meta_init_construct_s"] = None
    if strategy.startswith("hf-deferred"):
        meta.update(measure_meta_with_init(build))
    phases = Phases()
    deferred = strategy.endswith(("deferred-full", "deferred-shard", "deferred-record"))
    if deferred:
        import torchdefer
    if strategy == "hf-init-empty":
        import accelerate
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    construct_peak = PhasePeak()
    baseline_rss = construct_peak.start_rss  # after the collection, as the reset peak starts
    counts: Dict[str, Any] = {}

    if strategy in ("py-eager", "hf-from-config") or (strategy == "py-broadcast" and rank == 0):
        with torch.device(device):
            module = phases.time("construct_s", build, construct_peak)
        counts["bytes_computed"] = module_bytes(module)
        if strategy == "py-broadcast":
            phases.time("materialize_s", lambda: broadcast_from_rank0(module))
        elif world > 1:
            counts.update(phases.time("materialize_s", lambda: slice_rank(module, rank, world)))
    elif strategy in ("py-meta-reset", "hf-init-empty", "py-broadcast"):
        with accelerate.init_empty_weights() if strategy == "hf-init-empty" else torch.device("meta"):
            module = phases.time("construct_s", build, construct_peak)
        phases.time("materialize_s", lambda: module.to_empty(device=device))
        if strategy == "py-broadcast":
            phases.time("materialize_s", lambda: broadcast_from_rank0(module))
        else:
            phases.time("materialize_s", lambda: reinitialize(strategy, module))
    elif deferred:
        module = phases.time("construct_s", lambda: torchdefer.deferred_init(build), construct_peak)
        if strategy.endswith("record"):
            # Only the recording: what the record-phase targets are about, for models whose
            # materialization does not fit this machine. Its fakes hold no bytes.
            counts = dict(bytes_kept=0, bytes_computed=0)
        else:
            shard = torchdefer.Shard(rank, world) if strategy.endswith("shard") else None
            stats = phases.time("materialize_s",
                                lambda: torchdefer.materialize_module(module, device=device, shard=shard))
            counts = stats_counts(stats)
    else:
        raise ValueError(f"unknown strategy '{strategy}'; known: {', '.join(STRATEGIES)}")
    kept = module_bytes(module)
    result: Dict[str, Any] = dict(
        strategy=strategy, model=config.name, rank=rank, world=world, device=str(device),
        parameters=models.parameter_count(config), threads=torch.get_num_threads(), **phases.seconds,
        wall_s=phases.seconds["construct_s"] + phases.seconds["materialize_s"],
        baseline_rss_bytes=baseline_rss, peak_rss_bytes=construct_peak.peak(),
        bytes_kept=kept, bytes_computed=kept, tensors_sliced=0, tensors_fallback=0, tensors_whole=0,
        elements_sliced=0, elements_fallback=0, fallback_ops={},
        peak_cuda_bytes=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        construct_rss_bytes=phases.construct_rss_bytes, **meta,
    )
    result.update(counts)
    return result


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategy", required=True, choices=STRATEGIES)
    parser.add_argument("--model", required=True, choices=list(models.CONFIGS))
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where real tensors are made (cpu, cuda)")
    args = parser.parse_args(argv)
    if not 0 <= args.rank < args.world:
        parser.error("--rank must be below --world")
    device = torch.device(args.device)
    if args.strategy == "py-broadcast":
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
    # Note [Warm-up run]
    # ~~~~~~~~~~~~~~~~~~
    # The first use of a strategy in a process pays one-off costs that do not
    # depend on the model (torch's lazily imported meta kernels take seconds under
    # torch.device("meta"), transformers' first from_config, the first MT19937 jump). The tiny
    # shape is built once with the same strategy first, so the measured run shows what scales
    # with the model; the warm-up's few hundred KB are part of the baseline RSS.
    torch.manual_seed(args.seed)
    run(args.strategy, models.config("tiny"), args.rank, args.world, device)
    torch.manual_seed(args.seed)
    result = run(args.strategy, models.config(args.model), args.rank, args.world, device)
    print(json.dumps(result), flush=True)
    if args.strategy == "py-broadcast":
        # Tearing Gloo down can abort a rank ("terminate called without an active exception"),
        # even after a barrier, in destroy_process_group or at interpreter exit (about one run
        # in ten here). The result is printed: all ranks meet, then leave without a teardown.
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
