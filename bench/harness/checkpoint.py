"""Loading a checkpoint: peak RSS and time of each way to get a model's weights from disk into a
module, each in a process of its own (docs/checkpoints.md#measured, docs/benchmarks.md's
checkpoint section).

    python3 -m bench.harness.checkpoint --dir /tmp/ckpt-bench          # saves once, then measures
    python3 -m bench.harness.checkpoint --dir /tmp/ckpt-bench --reps 3 --hidden 1024 --layers 8
    python3 -m bench.harness.checkpoint --dir /tmp/ckpt-bench --only "" --read-speed  # vs cat and preadv
    python3 -m bench.harness.checkpoint --dir /tmp/ckpt-bench --only "" --world 2     # FSDP2 only
    python3 -m bench.harness.checkpoint --dir /tmp/ckpt-bench --reps 2 --world 2 --read-speed --docs

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

Peak RSS is taken after every value was read once (a tensor backed by the file's mapping is not
resident before). `cat` of the safetensors files to /dev/null is the read ceiling (warm page
cache: every strategy runs after the files were read once, so all of them read from the page
cache). --docs writes docs/benchmarks-checkpoint.json and the section of docs/benchmarks.md
between this harness's markers (bench.harness.run keeps it when it rewrites the page).
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


def dcp_files(root: Path) -> List[Path]:
    return sorted((root / "dcp").glob("*.distcp"))


def cat_seconds(root: Path, files: Optional[List[Path]] = None) -> float:
    """`cat` of ``files`` (the safetensors files unless given) to /dev/null."""
    start = time.perf_counter()
    subprocess.run(["cat", *map(str, files or safetensors_files(root))], stdout=subprocess.DEVNULL, check=True)
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


def copy_seconds(nbytes: int) -> float:
    """One memcpy (numpy.copyto, one thread) of ``nbytes`` between two buffers both already
    written: what putting the bytes into memory of the process costs with no file, no kernel
    and no first touch, the ceiling of any reader that fills a destination of its own."""
    import numpy

    source = numpy.full(nbytes, 1, dtype=numpy.uint8)
    target = numpy.full(nbytes, 2, dtype=numpy.uint8)
    start = time.perf_counter()
    numpy.copyto(target, source)
    return time.perf_counter() - start


def preadv_seconds(root: Path, touched: bool) -> float:
    """Reads every safetensors file with one preadv into a torch.empty buffer of its size,
    first touched (written once) or fresh: the reader's destinations are fresh, allocated for
    the call (Note [One read for every tensor of a call] in api/src/materialization.cpp)."""
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
    """Drops the safetensors and DCP files' pages from the page cache (POSIX_FADV_DONTNEED on
    these files only, which `fincore` confirms leaves none of them cached), so that the next
    read comes from the disk."""
    for path in safetensors_files(root) + dcp_files(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def materialize_seconds(root: Path, hidden: int, layers: int, cold: bool, source: str = "hf") -> float:
    """The whole model's materialize_module(checkpoint=root / source): the save_pretrained
    directory ("hf") or the DCP one ("dcp"), recording excluded."""
    import transformers

    import torchdefer

    torch.manual_seed(0)
    model = torchdefer.deferred_init(
        transformers.AutoModelForCausalLM.from_config, llama_config(hidden, layers)
    )
    if cold:
        evict(root)
    start = time.perf_counter()
    torchdefer.materialize_module(model, checkpoint=root / source)
    return time.perf_counter() - start


def read_speed(root: Path, hidden: int, layers: int, reps: int) -> Dict[str, float]:
    """The reader against the ceilings, back to back in this process, ``reps`` times: warm, cat,
    preadv into fresh and into touched memory, the first touch of as much fresh memory alone,
    a copy between written buffers, and materialize_module(checkpoint=dir); cold (the files
    evicted before each), cat and materialize_module; then the same cat and materialize_module
    pairs for the DCP directory. Prints each round and the medians; returns the medians."""
    nbytes = sum(p.stat().st_size for p in safetensors_files(root))
    dcp = dcp_files(root)
    cat_seconds(root)
    rounds: List[Dict[str, float]] = []
    for _ in range(reps):
        r: Dict[str, float] = {}
        r["warm_cat"] = cat_seconds(root)
        r["warm_preadv_fresh"] = preadv_seconds(root, touched=False)
        r["warm_preadv_touched"] = preadv_seconds(root, touched=True)
        r["first_touch"] = first_touch_seconds(nbytes)
        r["copy"] = copy_seconds(nbytes)
        r["warm_materialize"] = materialize_seconds(root, hidden, layers, cold=False)
        evict(root)
        r["cold_cat"] = cat_seconds(root)
        r["cold_materialize"] = materialize_seconds(root, hidden, layers, cold=True)
        cat_seconds(root, dcp)  # warm
        r["warm_dcp_cat"] = cat_seconds(root, dcp)
        r["warm_dcp_materialize"] = materialize_seconds(root, hidden, layers, cold=False, source="dcp")
        evict(root)
        r["cold_dcp_cat"] = cat_seconds(root, dcp)
        r["cold_dcp_materialize"] = materialize_seconds(root, hidden, layers, cold=True, source="dcp")
        cat_seconds(root)  # warm again for the next round
        rounds.append(r)
        print("  ".join(f"{k} {v:.3f}" for k, v in r.items()), flush=True)
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(f"medians of {reps} ({nbytes / 1e6:.0f} MB): " + "  ".join(f"{k} {v:.3f} s" for k, v in med.items()))
    med["dcp_bytes"] = sum(p.stat().st_size for p in dcp)
    for kind in ("warm", "cold", "warm_dcp", "cold_dcp"):
        n = med["dcp_bytes"] if kind.endswith("dcp") else nbytes
        print(f"{kind}: materialize_module reads at {n / med[kind + '_materialize'] / 1e6:.0f} MB/s, "
              f"cat at {n / med[kind + '_cat'] / 1e6:.0f} MB/s: "
              f"{med[kind + '_cat'] / med[kind + '_materialize']:.0%} of cat")
    return med


STRATEGY_DESCRIPTIONS = {
    "hf-from-pretrained": "`AutoModelForCausalLM.from_pretrained(dir)`",
    "meta-assign": "the model built on the meta device, `safetensors.torch.load_file` of every file, "
    "`load_state_dict(assign=True)`",
    "td-safetensors": "`deferred_init(from_config)` + `materialize_module(checkpoint=dir)`",
    "td-safetensors-r0of8": "the same, rank 0 of 8 (`shard=Shard(0, 8)`)",
    "td-dcp": "`deferred_init(from_config)` + `materialize_module(checkpoint=dcp_dir)`",
    "td-dcp-r0of8": "the same, rank 0 of 8",
    "td-dcp-fsdp2": "`deferred_init(from_config)` + `fully_shard` + `materialize_module(checkpoint=dcp_dir)`",
    "meta-dcp-fsdp2": "the meta device + `fully_shard` + `to_empty` + `dcp.load(model.state_dict())` "
    "(torchtitan's way)",
}
# This section's markers in docs/benchmarks.md; bench.harness.run keeps what they enclose.
BEGIN = "<!-- bench.harness.checkpoint: begin -->"
END = "<!-- bench.harness.checkpoint: end -->"
REPO = Path(__file__).resolve().parents[2]


def run_strategies(args: argparse.Namespace) -> List[Dict[str, Any]]:
    """Each strategy of --only, --reps times in a process of its own; one row of medians each."""
    rows = []
    print(f"{'strategy':22} {'wall s':>8} {'mat. s':>8} {'peak RSS MB':>12} {'base MB':>8} {'kept MB':>8}")
    for strategy in filter(None, args.only.split(",")):
        runs = []
        load = os.getloadavg()[0]
        for _ in range(args.reps):
            out = subprocess.run(
                [sys.executable, "-m", "bench.harness.checkpoint", "--dir", str(args.dir),
                 "--hidden", str(args.hidden), "--layers", str(args.layers), "--strategy", strategy],
                capture_output=True, text=True, check=True, env=dict(os.environ),
            )
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], (int, float))}
        med.update(strategy=strategy, wall_runs=[r["wall_s"] for r in runs], load=[load, os.getloadavg()[0]])
        rows.append(med)
        print(f"{strategy:22} {med['wall_s']:8.2f} {med.get('materialize_s', float('nan')):8.2f} "
              f"{med['peak_rss_bytes'] / 1e6:12.0f} {med['baseline_rss_bytes'] / 1e6:8.0f} "
              f"{med['bytes_kept'] / 1e6:8.0f}", flush=True)
    return rows


def print_fsdp2(rows: List[Dict[str, Any]]) -> None:
    print(f"{'FSDP2 strategy':22} {'rank':>6} {'wall s':>8} {'load s':>8} {'peak RSS MB':>12} "
          f"{'base MB':>8} {'kept MB':>8}")
    for r in rows:
        print(f"{r['strategy']:22} {r['rank']:>3}/{r['world']:<2} {r['wall_s']:8.2f} {r['load_s']:8.2f} "
              f"{r['peak_rss_bytes'] / 1e6:12.0f} {r['baseline_rss_bytes'] / 1e6:8.0f} "
              f"{r['bytes_kept'] / 1e6:8.0f}", flush=True)


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f}"


def _load(pair: List[float]) -> str:
    return f"{pair[0]:.1f}–{pair[1]:.1f}"


def section(results: Dict[str, Any]) -> str:
    """docs/benchmarks.md's section for issue 16's item 5, between this harness's markers."""
    from bench.harness import report

    reps = results["reps"]
    parts = [
        BEGIN,
        "## Loading a checkpoint: peak memory and time (issue 16)",
        "",
        "Generated by `bench/harness/checkpoint.py`; do not edit by hand (the sections above are "
        "generated by other harnesses and left as they are). docs/checkpoints.md says how the reader works.",
        "",
        f"- **Command**: `{results['command']}`",
        f"- **Machine**: {report.describe_machine(results['machine'])}",
        f"- **Model**: a Hugging Face Llama of hidden size {results['hidden']}, {results['layers']} layers, "
        f"vocabulary 32000, in float32: {_mb(results['file_bytes'])} MB in "
        f"{results['files']} safetensors file{'s' if results['files'] > 1 else ''} written by `save_pretrained(max_shard_size=\"200MB\")`, and the "
        "same state dict written by `torch.distributed.checkpoint.save` from one process.",
        f"- **Run**: {results['started']}, {results['duration_s'] / 60:.1f} min; 1-minute load average "
        f"{results['machine']['load_average']:.1f} at the start and {results['load_average_end']:.1f} at the end "
        f"(each row's own in the table; the machine has {results['machine']['cores']} cores and was shared with "
        "other work, so times vary between runs by up to a factor of two; peaks do not).",
        f"- **Ceiling**: `cat` of the safetensors files to `/dev/null`, warm page cache: "
        f"{results['cat_s']:.3f} s ({results['file_bytes'] / results['cat_s'] / 1e9:.2f} GB/s).",
        "",
        "Each row runs in a fresh process, the files in the page cache (read once before). *Peak RSS* is "
        "the process's `VmHWM` after every value was read once (a tensor backed by the file's mapping, as "
        "`from_pretrained`'s and `load_file`'s are, is resident only once read); *baseline* its RSS before "
        "the strategy started (Python, torch, transformers); *kept* the bytes of the model's tensors. "
        "*Time* is from the start of the strategy (the recording included for torchdefer) to a loaded "
        f"model; *load* is `materialize_module` alone. {'Medians of ' + str(reps) + ' runs, each run in parentheses.' if reps > 1 else 'One run.'}",
        "",
        "| strategy | what it does | time (s) | load (s) | peak RSS (MB) | baseline (MB) | kept (MB) | over baseline + kept (MB) | load avg |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["strategies"]:
        walls = " / ".join(f"{w:.2f}" for w in r["wall_runs"])
        time_cell = f"{r['wall_s']:.2f}" + (f" ({walls})" if reps > 1 else "")
        load_cell = f"{r['materialize_s']:.2f}" if "materialize_s" in r else "—"
        over = r["peak_rss_bytes"] - r["baseline_rss_bytes"] - r["bytes_kept"]
        parts.append(f"| `{r['strategy']}` | {STRATEGY_DESCRIPTIONS[r['strategy']]} | {time_cell} | {load_cell} | "
                     f"{_mb(r['peak_rss_bytes'])} | {_mb(r['baseline_rss_bytes'])} | {_mb(r['bytes_kept'])} | "
                     f"{_mb(over)} | {_load(r['load'])} |")
    if results["fsdp2"]:
        world = results["fsdp2"][0]["world"]
        parts += [
            "",
            f"Into FSDP2 ({world} ranks, one process each, Gloo over a FileStore; every decoder layer and the root "
            "`fully_shard`ed; the process group is set up before the clock starts), from the DCP directory. "
            "Per rank, rank 0 first; *load* is from the sharded model to loaded weights. 1-minute load average "
            f"{_load(results['fsdp2_load'])}.",
            "",
            "| strategy | what it does | time (s) | load (s) | peak RSS (MB) | baseline (MB) | kept (MB) | over baseline + kept (MB) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for strategy in FSDP2_STRATEGIES:
            ranks = sorted((r for r in results["fsdp2"] if r["strategy"] == strategy), key=lambda r: r["rank"])
            if not ranks:
                continue

            def cell(key: str, fmt: Any) -> str:
                return " / ".join(fmt(key(r) if callable(key) else r[key]) for r in ranks)

            def secs(x: float) -> str:
                return f"{x:.2f}"

            def over(r: Dict[str, Any]) -> float:
                return r["peak_rss_bytes"] - r["baseline_rss_bytes"] - r["bytes_kept"]

            parts.append(
                f"| `{strategy}` | {STRATEGY_DESCRIPTIONS[strategy]} | {cell('wall_s', secs)} | "
                f"{cell('load_s', secs)} | {cell('peak_rss_bytes', _mb)} | {cell('baseline_rss_bytes', _mb)} | "
                f"{cell('bytes_kept', _mb)} | {cell(over, _mb)} |")
    speed = results.get("read_speed")
    if speed:
        nbytes = results["file_bytes"]

        def rate(key: str) -> str:  # empty for a result written before the harness measured it
            if key not in speed:
                return ""
            n = speed["dcp_bytes"] if "dcp" in key else nbytes
            return f"{speed[key]:.3f} s ({n / speed[key] / 1e6:,.0f} MB/s)"

        parts += [
            "",
            f"Read speed (`--read-speed`, medians of {speed['reps']} round{'s' if speed['reps'] > 1 else ''} in one process, each round: warm `cat`, "
            "one `preadv` per file into fresh and into already written memory, mapping as much fresh memory "
            "with `MAP_POPULATE` alone, one memcpy of as many bytes between two written buffers, the whole "
            "model's `materialize_module(checkpoint=dir)`; then, the files evicted (`POSIX_FADV_DONTNEED`), "
            "`cat` and `materialize_module` cold"
            + ("; then the same two pairs for the DCP directory and its `.distcp` files" if "warm_dcp_cat" in speed else "")
            + f"; 1-minute load average {_load(speed['load'])}):",
            "",
            "| | `cat` | `preadv`, fresh memory | `preadv`, written memory | fresh memory alone | "
            "memcpy, written memory | `materialize_module` | reader / `cat` |",
            "|---|---|---|---|---|---|---|---|",
            f"| warm | {rate('warm_cat')} | {rate('warm_preadv_fresh')} | {rate('warm_preadv_touched')} | "
            f"{speed['first_touch']:.3f} s | {rate('copy')} | {rate('warm_materialize')} | "
            f"{speed['warm_cat'] / speed['warm_materialize']:.0%} |",
            f"| cold | {rate('cold_cat')} | | | | | {rate('cold_materialize')} | "
            f"{speed['cold_cat'] / speed['cold_materialize']:.0%} |",
        ]
        if "warm_dcp_cat" in speed:
            parts += [
                f"| warm, DCP | {rate('warm_dcp_cat')} | | | | | {rate('warm_dcp_materialize')} | "
                f"{speed['warm_dcp_cat'] / speed['warm_dcp_materialize']:.0%} |",
                f"| cold, DCP | {rate('cold_dcp_cat')} | | | | | {rate('cold_dcp_materialize')} | "
                f"{speed['cold_dcp_cat'] / speed['cold_dcp_materialize']:.0%} |",
            ]
    parts.append(END)
    return "\n".join(parts) + "\n"


def write_section(page: Path, text: str) -> None:
    """Replaces the text between this harness's markers, or appends it at the end of the page."""
    from bench.harness import report

    report.write_other_section(page, BEGIN, END, text)


def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
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
    parser.add_argument("--read-speed", action="store_true", help="also compare the reader with cat and preadv")
    parser.add_argument("--only", default=",".join(STRATEGIES), help="comma-separated strategies to run")
    parser.add_argument("--docs", action="store_true",
                        help="write docs/benchmarks-checkpoint.json and docs/benchmarks.md's checkpoint section")
    args = parser.parse_args(argv)
    if args.strategy in FSDP2_STRATEGIES:
        print(json.dumps(measure_fsdp2(args.strategy, args.dir, args.hidden, args.layers, args.rank,
                                       args.world, args.store)))
        return
    if args.strategy:
        print(json.dumps(measure(args.strategy, args.dir, args.hidden, args.layers)))
        return
    from bench.harness import report

    args.dir.mkdir(parents=True, exist_ok=True)
    prepare(args.dir, args.hidden, args.layers)
    started = time.time()
    files = safetensors_files(args.dir)
    results: Dict[str, Any] = dict(
        command="python3 -m bench.harness.checkpoint " + " ".join(argv), machine=report.machine(),
        started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)), reps=args.reps,
        hidden=args.hidden, layers=args.layers, files=len(files),
        file_bytes=sum(p.stat().st_size for p in files),
    )
    cat_seconds(args.dir)  # warms the page cache
    results["cat_s"] = statistics.median(cat_seconds(args.dir) for _ in range(3))
    print(f"safetensors files: {results['file_bytes'] / 1e6:.0f} MB; cat (warm): {results['cat_s']:.3f} s = "
          f"{results['file_bytes'] / results['cat_s'] / 1e9:.2f} GB/s")
    results["strategies"] = run_strategies(args)
    fsdp2_load = os.getloadavg()[0]
    results["fsdp2"] = run_fsdp2(args.dir, args.hidden, args.layers, args.world) if args.world else []
    results["fsdp2_load"] = [fsdp2_load, os.getloadavg()[0]]
    print_fsdp2(results["fsdp2"])
    if args.read_speed:
        speed_load = os.getloadavg()[0]
        results["read_speed"] = dict(read_speed(args.dir, args.hidden, args.layers, args.reps), reps=args.reps)
        results["read_speed"]["load"] = [speed_load, os.getloadavg()[0]]
    results.update(duration_s=time.time() - started, load_average_end=os.getloadavg()[0])
    if args.docs:
        (REPO / "docs" / "benchmarks-checkpoint.json").write_text(json.dumps(results, indent=1) + "\n")
        write_section(REPO / "docs" / "benchmarks.md", section(results))


if __name__ == "__main__":
    main()
