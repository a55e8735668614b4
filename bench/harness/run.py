"""The peak-memory and time benchmark: every initialization strategy, each run in a process of
its own, several repetitions; reports median and range as JSON, a Markdown table and a plot.

    python3 -m bench.harness.run                       # the default comparison (the README demo)
    python3 -m bench.harness.run --reps 3 --world 64 \\
        --run 'cpp-*=llama-125m,llama3.2-1b,llama3-8b,llama3-70b,llama3-405b' \\
        --run 'py-*,hf-*=llama-125m,llama3.2-1b' --docs  # regenerates docs/benchmarks.md

Run from the repository root after building (`cmake --build build`). A strategy whose computed
memory estimate does not fit this machine is reported as "needs N GB" instead of being run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from bench.harness import models, plan, report

REPO = Path(__file__).resolve().parents[2]
# The README demo's comparison, about 30 s. The py-* strategies are left to the docs run: their
# torchtitan-style init uses torch.nn.init.trunc_normal_, whose rejection sampling (PyTorch 2.13)
# makes them about ten times slower than the same shape with transformers' normal_ init.
DEFAULT_RUN = "cpp-*,hf-*=llama-125m"
SUMMARIZED = ["wall_s", "construct_s", "materialize_s", "peak_rss_bytes", "baseline_rss_bytes", "peak_cuda_bytes",
              "construct_rss_bytes", "meta_construct_s", "meta_rss_bytes", "meta_init_construct_s"]


class RunFailed(RuntimeError):
    pass


def split_spec(spec: str) -> Tuple[str, str, Optional[int]]:
    """'STRATEGIES=MODELS[:REPS]' as its three parts (REPS None where the spec names none)."""
    if "=" not in spec:
        raise ValueError(f"--run needs STRATEGIES=MODELS, e.g. 'cpp-*=llama-125m,llama3-70b'; got '{spec}'")
    strategies, names = spec.split("=", 1)
    reps = None
    if ":" in names:
        names, count = names.rsplit(":", 1)
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"--run '{spec}': the repetitions after ':' must be a positive integer")
        reps = int(count)
    return strategies, names, reps


def parse_matrix(specs: List[str]) -> List[Tuple[plan.Strategy, models.LlamaConfig]]:
    """'STRATEGIES=MODELS[:REPS]' specs, without repeats, by model size."""
    cells: List[Tuple[plan.Strategy, models.LlamaConfig]] = []
    for spec in specs:
        strategies, names, _ = split_spec(spec)
        for name in names.split(","):
            config = models.config(name.strip())
            cells += [(s, config) for s in plan.select(strategies) if (s, config) not in cells]
    return sorted(cells, key=lambda cell: models.parameter_count(cell[1]))  # stable: keeps strategy order


def cell_reps(specs: List[str], default: int) -> Dict[Tuple[str, str], int]:
    """The repetitions of each (strategy, model) cell: its first spec's ':REPS', else `default`.
    A spec's own count lets the largest models run fewer times than the rest of a matrix."""
    reps: Dict[Tuple[str, str], int] = {}
    for spec in specs:
        strategies, names, count = split_spec(spec)
        for name in names.split(","):
            for s in plan.select(strategies):
                reps.setdefault((s.name, name.strip()), count or default)
    return reps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def commands(strategy: plan.Strategy, config: models.LlamaConfig, args: argparse.Namespace) -> List[List[str]]:
    """One command line per process of one run."""
    common = ["--model", config.name, "--seed", str(args.seed)]
    if strategy.runner == "cpp":
        binary = str(args.build_dir / "bench" / "torchdefer_bench_strategy")
        name = strategy.name[len("cpp-"):]
        return [[binary, "--strategy", name, "--rank", "0", "--world", str(args.world), *common]]
    python = [sys.executable, "-m", "bench.harness.strategy", "--strategy", strategy.name, "--device", args.device]
    if strategy.name == "py-broadcast":
        w = args.broadcast_world
        return [python + ["--rank", str(r), "--world", str(w), *common] for r in range(w)]
    return [python + ["--rank", "0", "--world", str(args.world), *common]]


# free_port() lets its port go before rank 0's store binds it, so another process can take it in
# between; a run that failed only for that is run again on another port.
PORT_ATTEMPTS = 3


def run_once(strategy: plan.Strategy, config: models.LlamaConfig, args: argparse.Namespace) -> List[Dict[str, Any]]:
    """Runs the strategy's processes together; returns each one's JSON line."""
    attempt = 1
    while True:
        try:
            return run_on_port(strategy, config, args, free_port())
        except RunFailed as failure:
            if attempt == PORT_ATTEMPTS or "address already in use" not in str(failure).lower():
                raise
            attempt += 1


def run_on_port(strategy: plan.Strategy, config: models.LlamaConfig, args: argparse.Namespace,
                port: int) -> List[Dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(args.build_dir / "python"), str(REPO)]),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd in commands(strategy, config, args)]
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RunFailed(f"timed out after {args.timeout} s")
        lines = out.strip().splitlines()
        if proc.returncode != 0 or not lines:
            for p in procs:
                p.kill()
            raise RunFailed(f"exit status {proc.returncode}: {err.strip()[-600:]}")
        results.append(json.loads(lines[-1]))
    return results


def roles(strategy: plan.Strategy, processes: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """The table rows one run gives: one, or for py-broadcast rank 0 and the worst other rank."""
    if len(processes) == 1:
        return {"": processes[0]}
    others = processes[1:]
    worst = dict(max(others, key=lambda r: r["peak_rss_bytes"]))
    worst["wall_s"] = max(r["wall_s"] for r in others)
    label = "rank 1" if len(others) == 1 else f"ranks 1-{len(others)}"
    return {"rank 0": processes[0], label: worst}


def spread(values: List[Optional[float]]) -> Optional[Dict[str, float]]:
    if any(v is None for v in values):
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    # .get: the C++ runner and results files of earlier harnesses lack the newer fields.
    return {key: spread([r.get(key) for r in runs]) for key in SUMMARIZED}


def measure(cells, args: argparse.Namespace) -> List[Dict[str, Any]]:
    """Runs every cell that fits, repetition by repetition, so that each repetition compares the
    strategies under the same machine load; the others get their estimate."""
    entries: List[Dict[str, Any]] = []
    runs: Dict[Tuple[int, str], List[Dict[str, Any]]] = {}
    for strategy, config in cells:
        estimate = plan.estimate_bytes(strategy, config, args.world, args.broadcast_world)
        available = plan.mem_available_bytes()
        entries.append(dict(
            strategy=strategy.name, description=strategy.description, model=config.name,
            parameters=models.parameter_count(config), parameter_bytes=models.parameter_count(config) * 4,
            world=args.broadcast_world if strategy.name == "py-broadcast" else args.world,
            estimate_bytes=estimate["per_process"], estimate_total_bytes=estimate["total"],
            mem_available_bytes=available, status="measured" if plan.fits(estimate, available) else "needs",
            reps=args.cell_reps.get((strategy.name, config.name), args.reps),
        ))
    for rep in range(max(entry["reps"] for entry in entries)):
        for index, (strategy, config) in enumerate(cells):
            entry = entries[index]
            if entry["status"] != "measured" or rep >= entry["reps"]:
                continue
            start = time.perf_counter()
            try:
                processes = run_once(strategy, config, args)
            except RunFailed as e:
                entry.update(status="failed", error=str(e))
                log(f"{config.name} {strategy.name} rep {rep + 1}: FAILED {e}")
                continue
            for role, record in roles(strategy, processes).items():
                runs.setdefault((index, role), []).append(record)
            log(f"{config.name:12} {strategy.name:19} rep {rep + 1}/{entry['reps']}: "
                f"{processes[0]['wall_s']:.2f} s, peak {processes[0]['peak_rss_bytes'] / 1e6:.0f} MB "
                f"({time.perf_counter() - start:.1f} s with start-up)")
    rows = []
    for index, entry in enumerate(entries):
        role_runs = {role: r for (i, role), r in runs.items() if i == index and entry["status"] == "measured"}
        if not role_runs:
            rows.append(dict(entry, role=""))
        for role, records in role_runs.items():
            rows.append(dict(entry, role=role, runs=records, summary=summarize(records)))
    return rows


def run_all(argv: List[str], args: argparse.Namespace) -> Dict[str, Any]:
    started = time.time()
    machine = report.machine()  # before the runs: its load average is the one at the start
    if any(s.runner == "cpp" for s, _ in args.cells) and not (args.build_dir / "bench" / "torchdefer_bench_strategy").exists():
        raise SystemExit(f"{args.build_dir}/bench/torchdefer_bench_strategy is missing: build first (cmake --build build)")
    rows = measure(args.cells, args)
    micro = report.load_micro(args.micro or (report.discover_micro(args.build_dir) if args.docs else []))
    return dict(
        command="python3 -m bench.harness.run " + shlex.join(argv), machine=machine,
        settings=dict(reps=args.reps, world=args.world, broadcast_world=args.broadcast_world, seed=args.seed,
                      device=args.device, headroom=plan.HEADROOM),
        started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)), duration_s=time.time() - started,
        load_average_end=os.getloadavg()[0], rows=rows, micro=micro,
    )


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", metavar="STRATEGIES=MODELS[:REPS]",
                        help=f"strategies (names or patterns) and models to compare, with their own repetitions"
                        f" after ':' (else --reps); repeatable (default: {DEFAULT_RUN})."
                        f" Strategies: {', '.join(plan.BY_NAME)}. Models: {', '.join(models.CONFIGS)}")
    parser.add_argument("--reps", type=int, default=1, help="repetitions of each run without its own :REPS (default 1)")
    parser.add_argument("--world", type=int, default=8, help="W for the shard and slice strategies (rank 0 of W)")
    parser.add_argument("--broadcast-world", type=int, default=2, help="processes of py-broadcast (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where Python strategies make real tensors (cpu, cuda)")
    parser.add_argument("--build-dir", type=Path, default=REPO / "build")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default BUILD_DIR/bench-results)")
    parser.add_argument("--micro", action="append", default=[], metavar="BINARY_OR_JSON",
                        help="a Google Benchmark binary to run, or its JSON output, for the throughput table;"
                        " with --docs, every executable in BUILD_DIR/bench/micro by default")
    parser.add_argument("--docs", action="store_true", help="write docs/benchmarks.md, .json and docs/img/benchmarks.png")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    parser.add_argument("--note", action="append", default=[],
                        help="a sentence the page prints under the run's settings (what disturbed it); repeatable,"
                        " kept in the results file, added to its notes with --render")
    parser.add_argument("--render", type=Path, metavar="RESULTS_JSON",
                        help="run nothing: write the report again from a results file this harness wrote")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.world < 1 or args.broadcast_world < 2:
        parser.error("--reps and --world must be at least 1, --broadcast-world at least 2")
    args.build_dir = args.build_dir.resolve()
    try:
        args.cells = parse_matrix(args.run or [DEFAULT_RUN])
        args.cell_reps = cell_reps(args.run or [DEFAULT_RUN], args.reps)
    except ValueError as e:
        parser.error(str(e))

    if args.docs:
        paths = report.Paths(json=REPO / "docs" / "benchmarks.json", markdown=REPO / "docs" / "benchmarks.md",
                             plot=REPO / "docs" / "img" / "benchmarks.png")
    else:
        out = args.out or args.build_dir / "bench-results"
        paths = report.Paths(json=out / "results.json", markdown=out / "results.md", plot=out / "peak_memory.png")
    if args.render:
        results = json.loads(args.render.read_text())
    else:
        results = run_all(argv, args)
    results["notes"] = results.get("notes", []) + args.note
    report.write(results, paths)
    print(report.table(results["rows"]))
    log(f"wrote {paths.json}, {paths.markdown}, {paths.plot}")
    return 1 if any(r["status"] == "failed" for r in results["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
