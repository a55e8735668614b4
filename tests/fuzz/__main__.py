"""The long fuzz run: ``python3 -m tests.fuzz --programs 100000 --workers 2 --seed-base 0``.

Run from the repository root with the torchdefer package importable (for a build tree:
``PYTHONPATH=build/python``). Prints, per family, how many programs drew from it, how many of
those failed and how many eager itself rejected; writes each failing program, with the check that
failed and its message, to ``--out`` as a runnable Python file. Exits 1 if any program failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Iterable

from .check import CHECKS, Outcome, init_worker, run_job
from .programs import FAMILIES


def _outcomes(seeds: Iterable[int], families, checks, workers: int) -> Iterable[Outcome]:
    jobs = ((seed, families, checks) for seed in seeds)
    if workers <= 1:
        init_worker()
        yield from map(run_job, jobs)
        return
    # The workers' functions live in an importable module: a spawned process cannot find
    # functions of a `python3 -m` __main__. An executor, not a Pool: a worker that crashes (a
    # segfault in the library under test) breaks it and the run ends with that error, where a
    # Pool would wait for the lost results forever.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=init_worker) as pool:
        yield from pool.map(run_job, jobs, chunksize=16)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=1000, help="how many programs (default 1000)")
    parser.add_argument("--seed-base", type=int, default=0, help="program k has seed seed-base + k")
    parser.add_argument("--families", default=",".join(FAMILIES),
                        help=f"comma-separated families to draw from (default all: {','.join(FAMILIES)})")
    parser.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated, of {','.join(CHECKS)}")
    parser.add_argument("--workers", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--out", type=Path, default=Path("fuzz-failures"),
                        help="directory for failing programs (default ./fuzz-failures)")
    parser.add_argument("--quiet", action="store_true", help="no line per failure")
    args = parser.parse_args(argv)
    families = tuple(f for f in args.families.split(",") if f)
    checks = tuple(c for c in args.checks.split(",") if c)
    unknown = [f for f in families if f not in FAMILIES] + [c for c in checks if c not in CHECKS]
    if unknown:
        parser.error(f"unknown families or checks: {unknown}")

    drawn, failed, rejected, refused, by_check = Counter(), Counter(), Counter(), Counter(), Counter()
    total_failed = 0
    start = time.monotonic()
    seeds = range(args.seed_base, args.seed_base + args.programs)
    for outcome in _outcomes(seeds, families, checks, args.workers):
        program = outcome.program
        for family in set(program.families):
            drawn[family] += 1
            failed[family] += outcome.failed
            rejected[family] += outcome.status == "eager_raises"
            refused[family] += outcome.status == "refused"
        if not outcome.failed:
            continue
        total_failed += 1
        by_check[outcome.check] += 1
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"seed{program.seed}_{outcome.check}.py"
        path.write_text(outcome.report())
        if not args.quiet:
            first = outcome.message.strip().splitlines()[0] if outcome.message.strip() else ""
            print(f"FAIL seed={program.seed} [{','.join(program.families)}] {outcome.check}: {first[:160]} -> {path}",
                  flush=True)
    elapsed = time.monotonic() - start
    print(f"\n{args.programs} programs (seeds {args.seed_base}..{args.seed_base + args.programs - 1}), "
          f"checks {','.join(checks)}, {elapsed:.1f} s, {total_failed} failed")
    print(f"{'family':16} {'programs':>9} {'failed':>7} {'eager raised':>13} {'refused':>8}")
    for family in families:
        print(f"{family:16} {drawn[family]:>9} {failed[family]:>7} {rejected[family]:>13} "
              f"{refused[family]:>8}")
    if by_check:
        print("failures by check: " + ", ".join(f"{c} {n}" for c, n in sorted(by_check.items())))
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(main())
