"""Counter-mode materialization against eager initialization, as a user sees it (issue 30): one
float32 parameter per init function, and a whole Llama with its own init, each built eagerly and
materialized with `materialize_module(m, rng="counter")` in this one process, at each thread count
(docs/benchmarks.md, its init-speed section).

    python3 -m bench.harness.init_speed --docs                        # the docs' run; rewrites that section
    python3 -m bench.harness.init_speed --mb 1 --repeats 1 --model tiny --json /tmp/init-speed.json

Per row and repetition, back to back (so that each sees the same load):
  eager    torch.manual_seed(0), then the module's constructor: `nn.Parameter(torch.empty(...))`
           and the init on it (for the Llama, its own `init_weights()`)
  counter  torch.manual_seed(0), `deferred_init` of the same constructor (its time kept apart),
           then `materialize_module(m, rng="counter")`, which is what is timed
  fresh    `torch.empty` of every tensor of the module + `fill_(0)` on them (fresh pages: the
           kernel zeroes and maps each 4 KiB page on its first write), then `fill_(0)` again
           (written pages): the difference is what first touching the memory costs
Every row reports its best repetition of each, and counter ÷ eager as eager's time over
counter's: the issue's target is 1.5× or more for every row at every thread count.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from bench.harness import models, report

# Every parameter has this many columns, so that the fan-based inits (kaiming, xavier) see the
# same fans at any --mb: a parameter of MB MiB has MB * 64 rows (128 MiB: 8192 x 4096).
COLUMNS = 4096
TARGET = 1.5
PAGE_BYTES = 4096
# glibc's mallopt parameter number for M_MMAP_THRESHOLD (malloc.h).
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 20

# The inits, as a model's own code calls them (the call is each row's label).
INITS: Dict[str, Tuple[Callable[[torch.Tensor], Any], str]] = {
    "uniform_": (nn.init.uniform_, "uniform_(w)"),
    # nn.Linear's own reset_parameters().
    "kaiming_uniform_": (lambda w: nn.init.kaiming_uniform_(w, a=math.sqrt(5)), "kaiming_uniform_(w, a=√5)"),
    "normal_": (nn.init.normal_, "normal_(w)"),
    # torchtitan's call for attention and feed-forward weights: the default bounds (±2) are 100
    # standard deviations out, so torch draws one normal_ and finds nothing to resample.
    "trunc_normal_": (lambda w: nn.init.trunc_normal_(w, std=0.02), "trunc_normal_(w, std=0.02)"),
    # Truncated at two standard deviations (bench/harness/models.py's Llama): torch redraws the
    # whole tensor for the ~4.6% it rejects until none is left, about log(n) / log(1 / 0.046) times.
    "trunc_normal_2sd": (lambda w: nn.init.trunc_normal_(w, std=0.02, a=-0.04, b=0.04),
                         "trunc_normal_(w, std=0.02, a=-0.04, b=0.04)"),
    "xavier_uniform_": (nn.init.xavier_uniform_, "xavier_uniform_(w)"),
    "xavier_normal_": (nn.init.xavier_normal_, "xavier_normal_(w)"),
    "kaiming_normal_": (nn.init.kaiming_normal_, "kaiming_normal_(w)"),
}
# This section's markers in docs/benchmarks.md; bench.harness.run keeps what they enclose.
BEGIN = report.OTHER_SECTIONS + "init_speed: begin -->"
END = report.OTHER_SECTIONS + "init_speed: end -->"


class OneParameter(nn.Module):
    """One float32 parameter, initialized in the constructor as a model's own code does."""

    def __init__(self, rows: int, init: str) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, COLUMNS))
        INITS[init][0](self.weight)


def tensor_shapes(build: Callable[[], nn.Module]) -> List[Tuple[int, ...]]:
    """The shapes of every parameter and buffer the constructor makes (built on the meta device)."""
    with torch.device("meta"):
        module = build()
    return [tuple(t.shape) for t in (*module.parameters(), *module.buffers())]


def timed(fn: Callable[[], Any]) -> Tuple[float, Any]:
    # A collection that the previous phase's garbage made due would land in this one. After
    # warm_up()'s gc.freeze() it scans only what the rows made, not torch's own objects (~0.1 s).
    gc.collect()
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def eager_s(build: Callable[[], nn.Module]) -> float:
    torch.manual_seed(0)
    return timed(build)[0]


def counter_s(build: Callable[[], nn.Module]) -> Tuple[float, float]:
    """deferred_init's time and counter-mode materialize_module's."""
    import torchdefer

    # Reseeding before each construction also makes moot the generator that a recorded
    # trunc_normal_ leaves owed (Note [The generator after deferred_init]), so the eager
    # construction after this one draws without a warning.
    torch.manual_seed(0)
    record, module = timed(lambda: torchdefer.deferred_init(build))
    materialize, _ = timed(lambda: torchdefer.materialize_module(module, rng="counter"))
    if any(torchdefer.is_fake(t) for t in (*module.parameters(), *module.buffers())):
        raise RuntimeError("materialize_module left a fake tensor")
    return record, materialize


def fresh_memory_s(shapes: List[Tuple[int, ...]]) -> Tuple[float, float]:
    """`torch.empty` + `fill_(0)` of every shape (fresh pages), then `fill_(0)` again (written pages)."""

    def allocate_and_fill() -> List[torch.Tensor]:
        tensors = [torch.empty(shape) for shape in shapes]
        for t in tensors:
            t.fill_(0)
        return tensors

    fresh, tensors = timed(allocate_and_fill)
    written, _ = timed(lambda: [t.fill_(0) for t in tensors])
    return fresh, written


def measure_row(name: str, kind: str, build: Callable[[], nn.Module], repeats: int) -> Dict[str, Any]:
    threads = torch.get_num_threads()
    shapes = tensor_shapes(build)
    load_start = os.getloadavg()[0]
    runs = []
    for _ in range(repeats):
        run: Dict[str, float] = {"eager_s": eager_s(build)}
        run["record_s"], run["counter_s"] = counter_s(build)
        run["fresh_s"], run["written_fill_s"] = fresh_memory_s(shapes)
        runs.append(run)
    best = {key: min(r[key] for r in runs) for key in runs[0]}
    row = dict(name=name, kind=kind, threads=threads, bytes=sum(math.prod(s) for s in shapes) * 4,
               tensors=len(shapes), runs=runs, best=best, speed_ratio=best["eager_s"] / best["counter_s"],
               load=[load_start, os.getloadavg()[0]])
    log(f"{name:18} {threads} thread(s): eager {best['eager_s']:.3f} s, counter {best['counter_s']:.3f} s "
        f"({row['speed_ratio']:.2f}x), fresh memory {best['fresh_s']:.3f} s")
    return row


def warm_up(model: Optional[models.LlamaConfig]) -> None:
    """Each path once on a small size, so that no row pays first-use costs (kernels, the thread
    pool, torchdefer's Python)."""
    for init in INITS:
        eager_s(lambda: OneParameter(64, init))
        counter_s(lambda: OneParameter(64, init))
    if model is not None:
        tiny = models.config("tiny")
        eager_s(lambda: models.Llama(tiny))
        counter_s(lambda: models.Llama(tiny))
    fresh_memory_s([(64, COLUMNS)])
    gc.collect()
    gc.freeze()


def every_large_block_fresh() -> None:
    """Makes glibc map every block of 1 MiB or more afresh and unmap it when freed, so that every
    repetition allocates fresh pages, as a process building its model once does. By default glibc
    raises its mmap threshold to the largest block freed so far (up to 32 MiB) and serves later
    blocks, of any size, from the heap's freed and already written memory where it can: after one
    Llama was built and freed, a 128 MiB tensor came back without a single page fault."""
    if ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1:
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed")


def measure(args: argparse.Namespace) -> List[Dict[str, Any]]:
    every_large_block_fresh()
    rows = []
    model = None if args.model == "none" else models.config(args.model)
    for threads in args.threads:
        torch.set_num_threads(threads)
        warm_up(model)
        for init in args.inits:
            rows.append(measure_row(init, "parameter", lambda init=init: OneParameter(args.mb * 64, init),
                                    args.repeats))
        if model is not None:
            rows.append(measure_row(model.name, "model", lambda: models.Llama(model), args.repeats))
    return rows


def log(message: str) -> None:
    print(f"[bench.init_speed] {message}", file=sys.stderr, flush=True)


# --- The report -----------------------------------------------------------------------------------


def rate(seconds: float, nbytes: int) -> str:
    return f"{seconds:.3f} s ({nbytes / seconds / 1e9:.2f} GB/s)"


def row_line(row: Dict[str, Any]) -> str:
    best, nbytes = row["best"], row["bytes"]
    touch = max(best["fresh_s"] - best["written_fill_s"], 0.0)
    per_page_us = touch / (nbytes / PAGE_BYTES) * 1e6
    label = f"`{INITS[row['name']][1]}`" if row["kind"] == "parameter" else f"Llama `{row['name']}`"
    met = "pass" if row["speed_ratio"] >= TARGET else "**fail**"
    return (f"| {label} | {row['threads']} | {rate(best['eager_s'], nbytes)} | {rate(best['counter_s'], nbytes)} | "
            f"{row['speed_ratio']:.2f}× | {met} | {best['record_s'] * 1e3:.1f} | {rate(best['fresh_s'], nbytes)} | "
            f"{touch:.3f} s ({per_page_us:.2f} µs) | {row['load'][0]:.1f}–{row['load'][1]:.1f} |")


HEADER = ("| init | threads | eager | counter | counter ÷ eager | ≥ 1.5× | `deferred_init` (ms) | fresh memory: "
          "`empty` + `fill_(0)` | of which first touch (per 4 KiB page) | load |")


def table(rows: List[Dict[str, Any]]) -> str:
    """One row per init (and the model) and thread count, the thread counts of one init together."""
    order = {name: i for i, name in enumerate(dict.fromkeys(r["name"] for r in rows))}
    ordered = sorted(rows, key=lambda r: (order[r["name"]], r["threads"]))
    return "\n".join([HEADER, "|" + "---|" * HEADER.count(" | ") + "---|", *map(row_line, ordered)])


def thp_mode() -> Optional[str]:
    """The kernel's transparent huge page mode (the bracketed word), which decides how many pages
    a fresh allocation faults in."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")] if "[" in text else None


def section(results: Dict[str, Any]) -> str:
    rows, settings = results["rows"], results["settings"]
    met = sum(r["speed_ratio"] >= TARGET for r in rows)
    model_rows = [r for r in rows if r["kind"] == "model"]
    parts = [
        BEGIN,
        "## Counter mode against eager initialization, as a user sees it (issue 30)",
        "",
        "Generated by `bench/harness/init_speed.py`; do not edit by hand (the sections above are generated by "
        "other harnesses and left as they are).",
        "",
        f"- **Machine**: {report.describe_machine(results['machine'])}; transparent huge pages "
        f"`{results['thp']}`, `THP_MEM_ALLOC_ENABLE` {results['thp_mem_alloc_enable'] or 'unset'}",
        f"- **Run**: {results['started']}, {results['duration_s'] / 60:.1f} min, one process; 1-minute load "
        f"average {results['machine']['load_average']:.1f} at the start and {results['load_average_end']:.1f} at "
        f"the end (each row's own in the table; the machine has {results['machine']['cores']} cores, shared with "
        "other work when the load is above that).",
        f"- **Parameter**: one float32 `nn.Parameter(torch.empty({settings['mb'] * 64}, {COLUMNS}))` "
        f"({settings['mb']} MiB) initialized in the module's constructor by the row's call.",
    ]
    if model_rows:
        parts.append(
            f"- **Model**: the Llama of `bench/harness/models.py`, `{model_rows[0]['name']}`: "
            f"{model_rows[0]['tensors']} tensors, {report.human_bytes(model_rows[0]['bytes'])} in float32; each "
            "module's own init (`nn.Linear`'s `kaiming_uniform_`, `nn.Embedding`'s `normal_`), then the model's "
            "torchtitan-style `init_weights()`: `normal_` for the embedding, `trunc_normal_` truncated at two "
            "standard deviations for the blocks' linear layers and at three for the output, the rotary tables "
            "computed.")
    parts += [
        "",
        "Each row in the same process, one after another; per repetition, back to back: *eager* is the "
        "constructor (`torch.empty` and the init on it); *counter* is `materialize_module(m, rng=\"counter\")` "
        "of `m = deferred_init(...)` of the same constructor, whose own time is the *`deferred_init`* column; "
        "both allocate fresh memory. *Fresh memory* is `torch.empty` of the same tensors and `fill_(0)` on "
        "them, and *first touch* that less a second `fill_(0)` of the written memory: the kernel's cost of "
        "zeroing and mapping fresh pages, which eager and counter both pay (glibc maps every block of "
        f"{MMAP_THRESHOLD_BYTES >> 20} MiB or more afresh here, `mallopt(M_MMAP_THRESHOLD)`, so that no repetition "
        "reuses memory an earlier one wrote). GB/s are the tensors' bytes over "
        f"the time. Each cell is the best of {settings['repeats']} repetition(s); *counter ÷ eager* is eager's "
        f"time over counter's, the target {TARGET}× or more.",
        "",
        f"*`{results['command']}`: {met} of {len(rows)} rows meet the target.*",
        "",
        table(rows),
        END,
    ]
    return "\n".join(parts) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=128, help="MiB of the one parameter (default 128)")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions of each row; the best is shown")
    parser.add_argument("--threads", default="1,2", help="comma-separated torch thread counts (default 1,2)")
    parser.add_argument("--inits", default=",".join(INITS), help=f"comma-separated, of {', '.join(INITS)}")
    parser.add_argument("--model", default="llama-125m",
                        help=f"the whole Llama's size, or none (default llama-125m); of {', '.join(models.CONFIGS)}")
    parser.add_argument("--json", type=Path, help="also write the results, every repetition, to this file")
    parser.add_argument("--docs", action="store_true",
                        help="write docs/benchmarks-init-speed.json and docs/benchmarks.md's section")
    parser.add_argument("--render", type=Path, metavar="RESULTS_JSON", help="run nothing: write the report again")
    args = parser.parse_args(argv)
    args.inits = args.inits.split(",")
    unknown = [name for name in args.inits if name not in INITS]
    if unknown:
        parser.error(f"unknown init {', '.join(unknown)}; known: {', '.join(INITS)}")
    if args.model != "none" and args.model not in models.CONFIGS:
        parser.error(f"unknown model {args.model}; known: none, {', '.join(models.CONFIGS)}")
    args.threads = [int(t) for t in args.threads.split(",")]
    if args.mb < 1 or args.repeats < 1 or min(args.threads) < 1:
        parser.error("--mb, --repeats and every --threads must be at least 1")

    if args.render:
        results = json.loads(args.render.read_text())
    else:
        started = time.time()
        machine = report.machine()  # before the runs: its load average is the one at the start
        results = dict(command="python3 -m bench.harness.init_speed " + shlex.join(argv), machine=machine,
                       thp=thp_mode(), thp_mem_alloc_enable=os.environ.get("THP_MEM_ALLOC_ENABLE"),
                       settings=dict(mb=args.mb, repeats=args.repeats, threads=args.threads, inits=args.inits,
                                     model=args.model),
                       started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)))
        results["rows"] = measure(args)
        results.update(duration_s=time.time() - started, load_average_end=os.getloadavg()[0])
    text = section(results)
    if args.json:
        report.write_json(args.json, results)
    if args.docs:
        report.write_docs_section("benchmarks-init-speed.json", results, BEGIN, END, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
