"""Loading a checkpoint: peak RSS and time of each way to get a model's weights from disk into a
module, each in a process of its own (docs/checkpoints.md#measured).

    python3 -m bench.harness.checkpoint --dir /tmp/ckpt-bench          # saves once, then measures
    python3 -m bench.harness.checkpoint --dir /tmp/ckpt-bench --reps 3 --hidden 1024 --layers 8
    python3 -m bench.harness.checkpoint --dir /tmp/ckpt-bench --read-speed  # vs cat and preadv

Strategies:
  hf-from-pretrained   transformers' from_pretrained of the save_pretrained directory
  meta-assign          the model built on the meta device, safetensors.torch.load_file of every
                       file, load_state_dict(assign=True)
  td-safetensors       deferred_init(from_config) + materialize_module(checkpoint=dir)
  td-safetensors-r0of8 the same as rank 0 of 8 (Shard(0, 8))
  td-dcp               deferred_init + materialize_module(checkpoint=the DCP directory)
  td-dcp-r0of8         the same as rank 0 of 8
  td-dcp-fsdp2         deferred_init + fully_shard (FSDP2, Gloo, every decoder layer and the root,
                       --world ranks, one process each) + materialize_module(checkpoint=dcp dir)
  meta-dcp-fsdp2       torchtitan's way: the model on the meta device + fully_shard + to_empty +
                       dcp.load(model.state_dict()) (non-persistent buffers, absent from the
                       checkpoint, are left as to_empty leaves them)

    python3 -m bench.harness.checkpoint --dir /tmp/ckpt-bench --only "" --world 2   # FSDP2 only
Peak RSS is taken after every value was read once (a tensor backed by the file's mapping is not
resident before). And `cat` of the safetensors files to /dev/null, the read ceiling (warm page cache: every
strategy runs after the files were read once, so all of them read from the page cache).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from bench.harness.strategy import proc_status_bytes

STRATEGIES = [
    "hf-from-pretrained",
    "meta-assign",
    "td-safetensors",
    "td-safetensors-r0of8",
    "td-dcp",
    "td-dcp-r0of8",
]


FSDP2_STRATEGIES = ["td-dcp-fsdp2", "meta-dcp-fsdp2"]


def llama_config(hidden: int, layers: int) -> Any:
    import transformers

    return transformers.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        vocab_size=32000,
        max_position_embeddings=2048,
    )


def prepare(root: Path, hidden: int, layers: int) -> None:
    """Saves a model once with save_pretrained (several files) and with DCP."""
    import torch.distributed.checkpoint as dcp
    import transformers

    if (root / "hf" / "config.json").exists() and (root / "dcp" / ".metadata").exists():
        return
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(llama_config(hidden, layers))
    model.save_pretrained(root / "hf", max_shard_size="200MB")
    dcp.save(model.state_dict(), checkpoint_id=str(root / "dcp"))


def safetensors_files(root: Path) -> List[Path]:
    return sorted((root / "hf").glob("*.safetensors"))


def measure(strategy: str, root: Path, hidden: int, layers: int) -> Dict[str, Any]:
    import transformers

    import torchdefer

    config = llama_config(hidden, layers)
    baseline = proc_status_bytes("VmRSS")
    start = time.perf_counter()
    stats: List[Dict[str, Any]] = []
    if strategy == "hf-from-pretrained":
        model = transformers.AutoModelForCausalLM.from_pretrained(root / "hf")
    elif strategy == "meta-assign":
        from safetensors.torch import load_file

        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        state: Dict[str, torch.Tensor] = {}
        for path in safetensors_files(root):
            state.update(load_file(path))
        model.load_state_dict(state, strict=False, assign=True)
        del state
    else:
        torch.manual_seed(0)
        model = torchdefer.deferred_init(transformers.AutoModelForCausalLM.from_config, config)
        source = root / ("dcp" if "dcp" in strategy else "hf")
        shard = torchdefer.Shard(0, 8) if strategy.endswith("r0of8") else None
        built = time.perf_counter()
        stats = torchdefer.materialize_module(model, checkpoint=source, shard=shard)
    wall = time.perf_counter() - start
    # Tensors backed by a file mapping (from_pretrained, load_file) are resident only once read;
    # reading every value once makes the peak comparable to tensors that own their memory.
    with torch.no_grad():
        for t in model.state_dict().values():
            if not t.is_meta:
                t.sum()
    kept = sum(t.numel() * t.element_size() for t in model.state_dict().values() if not t.is_meta)
    result = {
        "strategy": strategy,
        "wall_s": wall,
        "peak_rss_bytes": proc_status_bytes("VmHWM"),
        "baseline_rss_bytes": baseline,
        "bytes_kept": kept,
    }
    if stats:
        result["materialize_s"] = time.perf_counter() - built
        result["from_checkpoint"] = sum(s["source"] == "checkpoint" for s in stats)
        result["initialized"] = sum(s["source"] == "init" for s in stats)
    return result


def measure_fsdp2(strategy: str, root: Path, hidden: int, layers: int, rank: int, world: int,
                  store: str) -> Dict[str, Any]:
    """One rank of an FSDP2 model loaded from the DCP directory: peak RSS and time, the
    process group set up before the clock starts."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import torchdefer

    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    config = llama_config(hidden, layers)
    baseline = proc_status_bytes("VmRSS")
    start = time.perf_counter()
    if strategy == "td-dcp-fsdp2":
        torch.manual_seed(0)
        model = torchdefer.deferred_init(transformers.AutoModelForCausalLM.from_config, config)
    else:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    built = time.perf_counter()
    if strategy == "td-dcp-fsdp2":
        torchdefer.materialize_module(model, checkpoint=root / "dcp")
    else:
        model.to_empty(device="cpu")
        dcp.load(model.state_dict(), checkpoint_id=str(root / "dcp"))
    loaded = time.perf_counter()
    local = [t.to_local() if hasattr(t, "to_local") else t for t in model.state_dict().values()]
    with torch.no_grad():
        for t in local:
            t.sum()
    result = {
        "strategy": strategy,
        "rank": rank,
        "world": world,
        "wall_s": loaded - start,
        "load_s": loaded - built,
        "peak_rss_bytes": proc_status_bytes("VmHWM"),
        "baseline_rss_bytes": baseline,
        "bytes_kept": sum(t.numel() * t.element_size() for t in local),
    }
    dist.barrier()
    dist.destroy_process_group()
    return result


def run_fsdp2(root: Path, hidden: int, layers: int, world: int) -> List[Dict[str, Any]]:
    """Each FSDP2 strategy with ``world`` ranks, one process each; every rank's result."""
    import tempfile

    results = []
    for strategy in FSDP2_STRATEGIES:
        with tempfile.TemporaryDirectory() as tmp:
            ranks = [
                subprocess.Popen(
                    [sys.executable, "-m", "bench.harness.checkpoint", "--dir", str(root),
                     "--hidden", str(hidden), "--layers", str(layers), "--strategy", strategy,
                     "--world", str(world), "--rank", str(rank), "--store", os.path.join(tmp, "store")],
                    stdout=subprocess.PIPE, text=True, env=dict(os.environ),
                )
                for rank in range(world)
            ]
            outputs = [p.communicate()[0] for p in ranks]
            if any(p.returncode for p in ranks):
                raise RuntimeError(f"{strategy}: a rank failed")
            results += [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    return results


def cat_seconds(root: Path) -> float:
    start = time.perf_counter()
    subprocess.run(["cat", *map(str, safetensors_files(root))], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def first_touch_seconds(nbytes: int) -> float:
    """Maps ``nbytes`` of fresh anonymous memory with MAP_POPULATE: the kernel's cost of handing
    out (zeroing and mapping) as much new memory as the files hold, with no copy at all."""
    import mmap

    start = time.perf_counter()
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
    elapsed = time.perf_counter() - start
    region.close()
    return elapsed


def preadv_seconds(root: Path, touched: bool) -> float:
    """Reads every safetensors file with one preadv into a torch.empty buffer of its size,
    first touched (written once) or fresh: the latter is what the reader did before
    Note [The destination's first touch]."""
    files = safetensors_files(root)
    buffers = [torch.empty(p.stat().st_size, dtype=torch.uint8) for p in files]
    if touched:
        for b in buffers:
            b.zero_()
    start = time.perf_counter()
    for path, buffer in zip(files, buffers):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.preadv(fd, [buffer.numpy()], 0)
        finally:
            os.close(fd)
    return time.perf_counter() - start


def evict(root: Path) -> None:
    """Drops the safetensors files' pages from the page cache (POSIX_FADV_DONTNEED on these
    files only, which `fincore` confirms leaves none of them cached), so that the next read
    comes from the disk."""
    for path in safetensors_files(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def materialize_seconds(root: Path, hidden: int, layers: int, cold: bool) -> float:
    """The whole model's materialize_module(checkpoint=dir), recording excluded."""
    import transformers

    import torchdefer

    torch.manual_seed(0)
    model = torchdefer.deferred_init(
        transformers.AutoModelForCausalLM.from_config, llama_config(hidden, layers)
    )
    if cold:
        evict(root)
    start = time.perf_counter()
    torchdefer.materialize_module(model, checkpoint=root / "hf")
    return time.perf_counter() - start


def read_speed(root: Path, hidden: int, layers: int, reps: int) -> Dict[str, float]:
    """The reader against the ceilings, back to back in this process, ``reps`` times: warm, cat,
    preadv into fresh and into touched memory, the first touch of as much fresh memory alone,
    and materialize_module(checkpoint=dir); cold (the files evicted before each), cat and
    materialize_module. Prints each round and the medians; returns the medians."""
    nbytes = sum(p.stat().st_size for p in safetensors_files(root))
    cat_seconds(root)
    rounds: List[Dict[str, float]] = []
    for _ in range(reps):
        r: Dict[str, float] = {}
        r["warm_cat"] = cat_seconds(root)
        r["warm_preadv_fresh"] = preadv_seconds(root, touched=False)
        r["warm_preadv_touched"] = preadv_seconds(root, touched=True)
        r["first_touch"] = first_touch_seconds(nbytes)
        r["warm_materialize"] = materialize_seconds(root, hidden, layers, cold=False)
        evict(root)
        r["cold_cat"] = cat_seconds(root)
        r["cold_materialize"] = materialize_seconds(root, hidden, layers, cold=True)
        cat_seconds(root)  # warm again for the next round
        rounds.append(r)
        print("  ".join(f"{k} {v:.3f}" for k, v in r.items()), flush=True)
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(f"medians of {reps} ({nbytes / 1e6:.0f} MB): " + "  ".join(f"{k} {v:.3f} s" for k, v in med.items()))
    for kind in ("warm", "cold"):
        print(f"{kind}: materialize_module reads at {nbytes / med[kind + '_materialize'] / 1e6:.0f} MB/s, "
              f"cat at {nbytes / med[kind + '_cat'] / 1e6:.0f} MB/s: "
              f"{med[kind + '_cat'] / med[kind + '_materialize']:.0%} of cat")
    return med


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--strategy", choices=STRATEGIES + FSDP2_STRATEGIES,
                        help="run one strategy here (one rank with --rank) and print its JSON")
    parser.add_argument("--world", type=int, default=0, help="also run the FSDP2 strategies with this many ranks")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--read-speed", action="store_true", help="compare the reader with cat and preadv")
    parser.add_argument("--only", default=",".join(STRATEGIES), help="comma-separated strategies to run")
    args = parser.parse_args(argv)
    if args.strategy in FSDP2_STRATEGIES:
        print(json.dumps(measure_fsdp2(args.strategy, args.dir, args.hidden, args.layers, args.rank,
                                       args.world, args.store)))
        return
    if args.strategy:
        print(json.dumps(measure(args.strategy, args.dir, args.hidden, args.layers)))
        return
    args.dir.mkdir(parents=True, exist_ok=True)
    prepare(args.dir, args.hidden, args.layers)
    if args.read_speed:
        read_speed(args.dir, args.hidden, args.layers, args.reps)
        return
    file_bytes = sum(p.stat().st_size for p in safetensors_files(args.dir))
    cat_seconds(args.dir)  # warms the page cache
    ceiling = statistics.median(cat_seconds(args.dir) for _ in range(3))
    print(f"safetensors files: {file_bytes / 1e6:.0f} MB; cat (warm): {ceiling:.3f} s = "
          f"{file_bytes / ceiling / 1e9:.2f} GB/s")
    print(f"{'strategy':22} {'wall s':>8} {'mat. s':>8} {'peak RSS MB':>12} {'base MB':>8} {'kept MB':>8}")
    for strategy in filter(None, args.only.split(",")):
        runs = []
        for _ in range(args.reps):
            out = subprocess.run(
                [sys.executable, "-m", "bench.harness.checkpoint", "--dir", str(args.dir),
                 "--hidden", str(args.hidden), "--layers", str(args.layers), "--strategy", strategy],
                capture_output=True, text=True, check=True, env=dict(os.environ),
            )
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], (int, float))}
        print(f"{strategy:22} {med['wall_s']:8.2f} {med.get('materialize_s', float('nan')):8.2f} "
              f"{med['peak_rss_bytes'] / 1e6:12.0f} {med['baseline_rss_bytes'] / 1e6:8.0f} "
              f"{med['bytes_kept'] / 1e6:8.0f}", flush=True)

    if args.world:
        print(f"{'FSDP2 strategy':22} {'rank':>6} {'wall s':>8} {'load s':>8} {'peak RSS MB':>12} "
              f"{'base MB':>8} {'kept MB':>8}")
        for r in run_fsdp2(args.dir, args.hidden, args.layers, args.world):
            print(f"{r['strategy']:22} {r['rank']:>3}/{r['world']:<2} {r['wall_s']:8.2f} {r['load_s']:8.2f} "
                  f"{r['peak_rss_bytes'] / 1e6:12.0f} {r['baseline_rss_bytes'] / 1e6:8.0f} "
                  f"{r['bytes_kept'] / 1e6:8.0f}", flush=True)


if __name__ == "__main__":
    main()
