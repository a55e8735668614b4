"""Per-rank peak memory and time of initializing a Llama under DTensor layouts (FSDP2 with W = 2
and 4, FSDP2 x tensor parallelism on a 2 x 2 mesh), Gloo on the CPU, three ways; and whether each
way gives the same weights under every layout (docs/benchmarks.md, its last section).

    python3 -m bench.harness.distributed --reference --docs   # the docs' shape; rewrites that section
    python3 -m bench.harness.distributed --dim 48 --layers 1 --heads 4 --hidden 100 --vocab 101 \\
        --layouts fsdp2-w2 --out /tmp/dist-bench                    # a tiny run, in seconds

Ways (bench/dtensor_memory.py builds each; the model is examples/llama.py's, torchtitan's init):
  torchdefer  deferred_init, the layout, torchdefer.materialize_module (counter mode)
  meta        the meta device, the layout, to_empty(), init_weights() on the DTensors (torchtitan)
  broadcast   rank 0 builds the model whole, the others on the meta device; the layout, to_empty(),
              set_model_state_dict(broadcast_from_rank0=True)

Each (layout, way) cell runs in a fresh process that forks its W ranks (one torch thread each,
MALLOC_MMAP_THRESHOLD_=1048576 so that glibc returns freed blocks of 1 MiB or more); every rank
first builds a small model the same way (first-use costs out of the way), then the measured one.
After measuring, every parameter and buffer is all-gathered one at a time and rank 0 hashes them:
equal digests are bitwise equal weights. With --reference, two more processes give the digests of
the single-process counter-mode model and of eager construction.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from bench.harness import plan, report

REPO = Path(__file__).resolve().parents[2]
LAYOUTS = {"fsdp2-w2": ("fsdp2", 2), "fsdp2-w4": ("fsdp2", 4), "fsdp2-tp-2x2": ("fsdp2_tp", 4)}
LAYOUT_TITLES = {"fsdp2-w2": "FSDP2, W = 2", "fsdp2-w4": "FSDP2, W = 4", "fsdp2-tp-2x2": "FSDP2 × TP, 2 × 2"}
WAYS = ["torchdefer", "meta", "broadcast"]
WAY_DESCRIPTIONS = {
    "torchdefer": "`deferred_init`, the layout, `torchdefer.materialize_module` (counter mode)",
    "meta": "the meta device, the layout, `to_empty()`, `init_weights()` on the DTensors (torchtitan's way)",
    "broadcast": "rank 0 builds the model whole, the others on the meta device; the layout, `to_empty()`, "
    "`set_model_state_dict(..., broadcast_from_rank0=True)` sends each rank its part",
}
# What a rank holds besides the model (Python, torch, Gloo), for the estimate that decides what runs.
RANK_BASELINE_BYTES = 400 * 2**20
# This section's markers in docs/benchmarks.md; bench.harness.run keeps what they enclose.
BEGIN = report.OTHER_SECTIONS + "distributed: begin -->"
END = report.OTHER_SECTIONS + "distributed: end -->"


@dataclasses.dataclass(frozen=True)
class Shape:
    dim: int = 2048
    layers: int = 16
    heads: int = 16
    hidden: int = 8192
    vocab: int = 32000

    def config(self):
        from bench.dtensor_memory import Config

        return Config(vocab=self.vocab, dim=self.dim, layers=self.layers, heads=self.heads, hidden=self.hidden,
                      max_seq=64)

    def parameters(self) -> int:
        block = 4 * self.dim * self.dim + 3 * self.dim * self.hidden + 2 * self.dim
        return 2 * self.vocab * self.dim + self.layers * block + self.dim


WARM_UP = Shape(dim=48, layers=1, heads=4, hidden=100, vocab=101)

# --- In a rank --------------------------------------------------------------------------------------


def weights_digest(module: torch.nn.Module) -> Optional[str]:
    """SHA-256 over every parameter and buffer, whole, by name: equal digests, bitwise equal weights.
    A DTensor is all-gathered first, one at a time, so every rank of its mesh must call this; only
    rank 0 of the process group (or a process without one) hashes and returns the digest."""
    from torch.distributed.tensor import DTensor

    hashing = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    digest = hashlib.sha256()
    tensors = dict(module.named_parameters())
    tensors.update(module.named_buffers())
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        if hashing:
            digest.update(f"{name} {tuple(tensor.shape)} {tensor.dtype}\n".encode())
            digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest() if hashing else None


def local_bytes(tensors) -> int:
    from torch.distributed.tensor import DTensor

    return sum((t.to_local() if isinstance(t, DTensor) else t).nbytes for t in tensors)


def rank_main(rank: int, world: int, folder: str, kind: str, way: str, shape: Shape) -> None:
    import torch.distributed as dist

    from bench.dtensor_memory import build
    from bench.process_memory import reset_peak, status_kib

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world)
    # First-use costs (imports, the first collectives) out of the way; the small model is dropped.
    build(way, WARM_UP.config(), kind, world, after_recording=lambda: None)
    recording: Dict[str, float] = {}

    def after_recording() -> None:  # the recording's own peak; then the peak of what follows
        recording.update(s=time.perf_counter() - start, hwm_kib=max(status_kib("VmHWM"), before_kib))
        reset_peak()

    dist.barrier()
    reset_peak()
    before_kib = status_kib("VmRSS")
    start = time.perf_counter()
    model = build(way, shape.config(), kind, world, after_recording=after_recording)
    wall = time.perf_counter() - start
    # A reset VmHWM can read below the resident size it was reset at (Note [A reset VmHWM can read
    # below the start] in bench/harness/strategy.py): the peak includes the build's start.
    peak_kib = max(status_kib("VmHWM"), recording.get("hwm_kib", 0), before_kib)
    result = dict(
        rank=rank, wall_s=wall, baseline_rss_bytes=before_kib * 1024, peak_rss_bytes=peak_kib * 1024,
        local_parameter_bytes=local_bytes(model.parameters()), local_buffer_bytes=local_bytes(model.buffers()),
    )
    if recording:
        result.update(record_s=recording["s"], record_peak_rss_bytes=recording["hwm_kib"] * 1024)
    result["digest"] = weights_digest(model)
    Path(folder, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def run_cell(layout: str, way: str, shape: Shape) -> List[Dict[str, Any]]:
    """Forks the layout's ranks, builds the model `way` in each; returns each rank's result."""
    import torch.multiprocessing as mp

    kind, world = LAYOUTS[layout]
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(rank_main, args=(world, folder, kind, way, shape), nprocs=world, start_method="fork")
        return [json.loads(Path(folder, f"rank{r}.json").read_text()) for r in range(world)]


def run_reference(rng: str, shape: Shape) -> Dict[str, Any]:
    """The single-process model: counter-mode materialization, or eager construction (`torch`)."""
    import torchdefer
    from bench.dtensor_memory import Llama

    torch.set_num_threads(1)
    torch.manual_seed(0)
    start = time.perf_counter()
    if rng == "counter":
        model = torchdefer.deferred_init(Llama, shape.config())
        torchdefer.materialize_module(model, rng="counter")
    else:
        model = Llama(shape.config())
    return dict(rng=rng, wall_s=time.perf_counter() - start, digest=weights_digest(model))


# --- The driver ----------------------------------------------------------------------------------


def estimate_total_bytes(way: str, world: int, shape: Shape) -> int:
    """What a cell needs at once: every rank's baseline, the model's bytes spread over the ranks,
    and for broadcast the whole model on rank 0 besides."""
    model = shape.parameters() * 4
    return world * RANK_BASELINE_BYTES + model * (2 if way == "broadcast" else 1)


def subprocess_json(arguments: List[str], timeout: float) -> Any:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="1048576",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    # A session of its own, so that a cell that runs out of time is ended with the ranks it forked.
    process = subprocess.Popen([sys.executable, "-m", "bench.harness.distributed", *arguments], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise RuntimeError(f"timed out after {timeout:.0f} s")
    lines = out.strip().splitlines()
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"exit status {process.returncode}: {err.strip()[-800:]}")
    return json.loads(lines[-1])


def shape_arguments(shape: Shape) -> List[str]:
    return [f"--{k}={v}" for k, v in dataclasses.asdict(shape).items()]


def measure(args: argparse.Namespace, shape: Shape) -> Dict[str, Any]:
    cells = []
    for layout in args.layouts:
        for way in args.ways:
            world = LAYOUTS[layout][1]
            cell = dict(layout=layout, way=way, world=world, estimate_total_bytes=estimate_total_bytes(way, world, shape),
                        mem_available_bytes=plan.mem_available_bytes(), load_average=os.getloadavg()[0])
            if cell["estimate_total_bytes"] > plan.HEADROOM * cell["mem_available_bytes"]:
                cell["status"] = "needs"
                log(f"{layout} {way}: not run, needs {cell['estimate_total_bytes'] / 2**30:.1f} GiB")
            else:
                started = time.perf_counter()
                try:
                    cell["ranks"] = subprocess_json(["--cell", layout, way, *shape_arguments(shape)], args.timeout)
                    cell["status"] = "measured"
                except RuntimeError as e:
                    cell.update(status="failed", error=str(e))
                cell["load_average_end"] = os.getloadavg()[0]
                log(f"{layout} {way}: {cell['status']} ({time.perf_counter() - started:.0f} s with start-up)")
            cells.append(cell)
    reference = {}
    if args.reference:
        for rng in ("counter", "torch"):
            try:
                reference[rng] = subprocess_json(["--reference-run", rng, *shape_arguments(shape)], args.timeout)
            except RuntimeError as e:
                reference[rng] = dict(rng=rng, error=str(e))
                log(f"single process, {rng} mode: FAILED {e}")
                continue
            log(f"single process, {rng} mode: {reference[rng]['wall_s']:.0f} s")
    return dict(cells=cells, reference=reference)


def log(message: str) -> None:
    print(f"[bench.distributed] {message}", file=sys.stderr, flush=True)


# --- The report -----------------------------------------------------------------------------------


def per_rank(ranks: List[Dict[str, Any]], key: str, fmt) -> str:
    return " / ".join(fmt(r[key]) for r in ranks)


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f}"


def cell_row(cell: Dict[str, Any], labels: Dict[str, str]) -> str:
    title = LAYOUT_TITLES[cell["layout"]]
    if cell["status"] != "measured":
        what = (f"not run: needs {cell['estimate_total_bytes'] / 2**30:.1f} GiB" if cell["status"] == "needs"
                else f"failed: {cell['error'].splitlines()[-1][:120]}")
        return f"| {title} | {cell['way']} | {what} | | | | | | | | |"
    ranks = cell["ranks"]
    growth = [dict(g=r["peak_rss_bytes"] - r["baseline_rss_bytes"]) for r in ranks]
    above_local = [dict(g=g["g"] - r["local_parameter_bytes"]) for g, r in zip(growth, ranks)]
    peaks_gib = sum(r["peak_rss_bytes"] for r in ranks) / 2**30
    recording = "—"
    if "record_s" in ranks[0]:
        recording = (per_rank([dict(g=r["record_peak_rss_bytes"] - r["baseline_rss_bytes"]) for r in ranks], "g", mib)
                     + f"; {max(r['record_s'] for r in ranks):.2f} s")
    load = f"{cell['load_average']:.1f}–{cell['load_average_end']:.1f}"
    return (f"| {title} | {cell['way']} | {per_rank(ranks, 'local_parameter_bytes', mib)} | "
            f"{per_rank(ranks, 'peak_rss_bytes', mib)} | {peaks_gib:.1f} | {per_rank(growth, 'g', mib)} | "
            f"{per_rank(above_local, 'g', mib)} | {recording} | "
            f"{per_rank(ranks, 'wall_s', lambda s: f'{s:.1f}')} | {load} | {labels.get(ranks[0]['digest'], '—')} |")


def digest_labels(results: Dict[str, Any]) -> Dict[str, str]:
    """A letter for each distinct set of weights, in the order they first appear."""
    labels: Dict[str, str] = {}
    digests = [c["ranks"][0]["digest"] for c in results["cells"] if c["status"] == "measured"]
    digests += [r["digest"] for r in results["reference"].values() if "digest" in r]
    for d in digests:
        labels.setdefault(d, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[len(labels) % 26])
    return labels


def weights_findings(results: Dict[str, Any], labels: Dict[str, str]) -> List[str]:
    lines = []
    reference = {r["rng"]: r["digest"] for r in results["reference"].values() if "digest" in r}
    names = {"counter": "the single-process counter-mode model's", "torch": "eager construction's"}
    expected = {"torchdefer": "counter", "broadcast": "torch"}
    for way in dict.fromkeys(c["way"] for c in results["cells"]):
        cells = [c for c in results["cells"] if c["way"] == way and c["status"] == "measured"]
        if not cells:
            continue
        digests = [c["ranks"][0]["digest"] for c in cells]
        layouts = ", ".join(f"{LAYOUT_TITLES[c['layout']]}: {labels[d]}" for c, d in zip(cells, digests))
        if len(set(digests)) == 1:
            line = f"- **{way}**: the same weights under every layout measured ({layouts})"
        else:
            line = f"- **{way}**: {len(set(digests))} different sets of weights for {len(cells)} layouts ({layouts})"
        rng = expected.get(way)
        if rng in reference:
            same = all(d == reference[rng] for d in digests)
            line += f"; {'equal to' if same else 'not equal to'} {names[rng]} ({labels[reference[rng]]})"
        lines.append(line + ".")
    return lines


def section(results: Dict[str, Any]) -> str:
    shape = Shape(**results["shape"])
    parameters = shape.parameters()
    labels = digest_labels(results)
    reference = results["reference"]
    parts = [
        BEGIN,
        "## Distributed initialization: per-rank peak memory and time (FSDP2, FSDP2 × TP; Gloo, CPU)",
        "",
        "Generated by `bench/harness/distributed.py`; do not edit by hand (the sections above are "
        "generated by `bench.harness.run` and left as they are).",
        "",
        f"- **Command**: `{results['command']}`",
        f"- **Machine**: {report.describe_machine(results['machine'])}",
        f"- **Model**: the Llama of `examples/llama.py` with torchtitan's `init_weights` (`trunc_normal_`, "
        f"`normal_`): dim {shape.dim}, {shape.layers} layers, {shape.heads} heads, feed-forward {shape.hidden}, "
        f"vocabulary {shape.vocab}: {report.human_count(parameters)} parameters, "
        f"{parameters * 4 / 2**30:.2f} GiB in fp32.",
        f"- **Run**: {results['started']}, {results['duration_s'] / 60:.1f} min, one run of each cell; 1-minute "
        f"load average {results['machine']['load_average']:.1f} at the start and {results['load_average_end']:.1f} "
        "at the end (each cell's own in the table; the machine has "
        f"{results['machine']['cores']} cores, so W ranks share them and other work).",
        "",
        "Ways:",
        "",
        *[f"- `{w}`: {WAY_DESCRIPTIONS[w]}" for w in WAYS],
        "",
        "Each cell (layout, way) runs in a fresh process that forks its ranks (one torch thread each, "
        "Gloo over a FileStore, `MALLOC_MMAP_THRESHOLD_=1048576` so that glibc returns freed blocks of "
        "1 MiB or more); each rank first builds a small model the same way, then the measured one. Values "
        "are per rank, rank 0 first, in MiB: *peak RSS* is the rank's `VmHWM` over the build (reset "
        "through `/proc/self/clear_refs` when it starts), libraries and the forked parent's pages included; "
        "*all ranks* is the sum of the ranks' peaks, in GiB; *growth* is a rank's peak above its RSS just "
        "before the build, and *over local* that growth less the rank's local parameters (what the way "
        "holds beyond what it keeps); *recording* is torchdefer's "
        "`deferred_init` on its own (its peak growth, and its time, slowest rank). *Time* runs from the start of "
        "the build to initialized weights. *Weights*: a letter per distinct SHA-256 of all parameters and "
        "buffers, all-gathered after the measurement: one letter, bitwise the same weights.",
        "",
        "| layout | way | local parameters | peak RSS (VmHWM) | all ranks | growth | over local | recording | time (s) "
        "| load | weights |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *[cell_row(c, labels) for c in results["cells"]],
        "",
    ]
    if reference:
        parts += [
            "Single-process references (`--reference`, each in a process of its own): "
            + "; ".join(f"{'counter-mode `materialize_module`' if r['rng'] == 'counter' else 'eager construction'} "
                        + (f"{labels[r['digest']]} ({r['wall_s']:.0f} s)" if "digest" in r
                           else f"failed: {r['error'].splitlines()[-1][:120]}") for r in reference.values()) + ".",
            "",
        ]
    parts += ["Weights:", "", *weights_findings(results, labels), END]
    return "\n".join(parts) + "\n"


def write_section(page: Path, text: str) -> None:
    """Replaces the text between this harness's markers, or appends it at the end of the page."""
    report.write_other_section(page, BEGIN, END, text)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for field in dataclasses.fields(Shape):
        parser.add_argument(f"--{field.name}", type=int, default=field.default)
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {', '.join(LAYOUTS)}")
    parser.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {', '.join(WAYS)}")
    parser.add_argument("--reference", action="store_true",
                        help="also the single-process counter-mode and eager models' digests")
    parser.add_argument("--out", type=Path, help="results folder (results.json, results.md)")
    parser.add_argument("--docs", action="store_true",
                        help="write docs/benchmarks-distributed.json and docs/benchmarks.md's section")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one cell may take")
    parser.add_argument("--render", type=Path, metavar="RESULTS_JSON", help="run nothing: write the report again")
    parser.add_argument("--cell", nargs=2, metavar=("LAYOUT", "WAY"), help=argparse.SUPPRESS)
    parser.add_argument("--reference-run", choices=["counter", "torch"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    shape = Shape(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Shape)})
    if args.cell:
        print(json.dumps(run_cell(*args.cell, shape)))
        return 0
    if args.reference_run:
        print(json.dumps(run_reference(args.reference_run, shape)))
        return 0
    args.layouts, args.ways = args.layouts.split(","), args.ways.split(",")
    unknown = [x for x in args.layouts if x not in LAYOUTS] + [x for x in args.ways if x not in WAYS]
    if unknown:
        parser.error(f"unknown layout or way {', '.join(unknown)}; layouts: {', '.join(LAYOUTS)}; ways: {', '.join(WAYS)}")
    if not (args.docs or args.out or args.render):
        parser.error("say where the report goes: --out DIR or --docs")

    if args.render:
        results = json.loads(args.render.read_text())
    else:
        started = time.time()
        machine = report.machine()
        results = dict(command="python3 -m bench.harness.distributed " + shlex.join(argv), machine=machine,
                       shape=dataclasses.asdict(shape), started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)))
        results.update(measure(args, shape))
        results.update(duration_s=time.time() - started, load_average_end=os.getloadavg()[0])
    text = section(results)
    if args.docs:
        (REPO / "docs" / "benchmarks-distributed.json").write_text(json.dumps(results, indent=1) + "\n")
        write_section(REPO / "docs" / "benchmarks.md", text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        (args.out / "results.md").write_text(text)
    print(text)
    failed = any(c["status"] == "failed" for c in results["cells"]) or any("error" in r for r in results["reference"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
