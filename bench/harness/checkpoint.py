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


def cat_seconds(root: Path) -> float:
    start = time.perf_counter()
    subprocess.run(["cat", *map(str, safetensors_files(root))], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def preadv_seconds(root: Path, touched: bool) -> float:
    """Reads every safetensors file with one preadv into a torch.empty buffer of its size,
    first touched (written once) or fresh."""
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
    """Drops the safetensors files' pages from the page cache (POSIX_FADV_DONTNEED: these files
    only), so that the next read comes from the disk."""
    for path in safetensors_files(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_speed(root: Path, hidden: int, layers: int) -> None:
    """The reader against the ceilings, back to back in this process: cat, preadv into fresh and
    into touched memory, and the whole model's materialize_module(checkpoint=dir); then cat and
    materialize_module once each after evicting the files from the page cache."""
    import transformers

    import torchdefer

    cat_seconds(root)
    for _ in range(2):
        torch.manual_seed(0)
        model = torchdefer.deferred_init(
            transformers.AutoModelForCausalLM.from_config, llama_config(hidden, layers)
        )
        cat = cat_seconds(root)
        fresh = preadv_seconds(root, touched=False)
        touched = preadv_seconds(root, touched=True)
        start = time.perf_counter()
        torchdefer.materialize_module(model, checkpoint=root / "hf")
        materialize = time.perf_counter() - start
        print(f"warm: cat {cat:.2f} s, preadv into fresh memory {fresh:.2f} s, into touched memory "
              f"{touched:.2f} s, materialize_module(checkpoint=dir) {materialize:.2f} s", flush=True)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(
        transformers.AutoModelForCausalLM.from_config, llama_config(hidden, layers)
    )
    evict(root)
    cat = cat_seconds(root)
    evict(root)
    start = time.perf_counter()
    torchdefer.materialize_module(model, checkpoint=root / "hf")
    materialize = time.perf_counter() - start
    print(f"cold (evicted): cat {cat:.2f} s, materialize_module(checkpoint=dir) {materialize:.2f} s")


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--strategy", choices=STRATEGIES, help="run one strategy here and print its JSON")
    parser.add_argument("--read-speed", action="store_true", help="compare the reader with cat and preadv")
    parser.add_argument("--only", default=",".join(STRATEGIES), help="comma-separated strategies to run")
    args = parser.parse_args(argv)
    if args.strategy:
        print(json.dumps(measure(args.strategy, args.dir, args.hidden, args.layers)))
        return
    args.dir.mkdir(parents=True, exist_ok=True)
    prepare(args.dir, args.hidden, args.layers)
    if args.read_speed:
        read_speed(args.dir, args.hidden, args.layers)
        return
    file_bytes = sum(p.stat().st_size for p in safetensors_files(args.dir))
    cat_seconds(args.dir)  # warms the page cache
    ceiling = statistics.median(cat_seconds(args.dir) for _ in range(3))
    print(f"safetensors files: {file_bytes / 1e6:.0f} MB; cat (warm): {ceiling:.3f} s = "
          f"{file_bytes / ceiling / 1e9:.2f} GB/s")
    print(f"{'strategy':22} {'wall s':>8} {'mat. s':>8} {'peak RSS MB':>12} {'base MB':>8} {'kept MB':>8}")
    for strategy in args.only.split(","):
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


if __name__ == "__main__":
    main()
