"""The differential fuzzer in CI (docs/fuzzing.md): random init programs from a fixed seed base,
eager against deferred_init in torch mode, child-first and counter mode (tests/fuzz/check.py).

One test per family draws its programs from that family alone, so a failing family is named by
its test and runs alone with ``-k <family>``; one more draws from all of them together. The
environment can narrow or widen a run without editing this file:

* ``TORCHDEFER_FUZZ_FAMILIES=element_writes,ambient``: only those families' tests (and the mixed
  test draws only from them);
* ``TORCHDEFER_FUZZ_PROGRAMS=200``: programs per test (default below);
* ``TORCHDEFER_FUZZ_SEED_BASE=...``: another fixed set of programs.

A failure prints the seed and the source of each failing program, and the command that reruns it.
"""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fuzz.check import run_seed  # noqa: E402
from tests.fuzz.programs import FAMILIES  # noqa: E402

# Families CI leaves out until the fixes they wait for land (none now); TORCHDEFER_FUZZ_FAMILIES
# and the long run (python3 -m tests.fuzz) draw from them as from the others.
WAITING = ()
# 23 tests of this many programs: 368 programs (docs/fuzzing.md).
PROGRAMS = int(os.environ.get("TORCHDEFER_FUZZ_PROGRAMS", "16"))
SEED_BASE = int(os.environ.get("TORCHDEFER_FUZZ_SEED_BASE", "1100000"))
DEFAULT_FAMILIES = ",".join(f for f in FAMILIES if f not in WAITING)
SELECTED = tuple(f for f in os.environ.get("TORCHDEFER_FUZZ_FAMILIES", DEFAULT_FAMILIES).split(",") if f)


def run_programs(families, seed_base):
    failures = []
    for seed in range(seed_base, seed_base + PROGRAMS):
        outcome = run_seed(seed, families)
        if outcome.failed:
            failures.append(outcome)
    if not failures:
        return
    rerun = (f"python3 -m tests.fuzz --families {','.join(families)} --seed-base {failures[0].program.seed} "
             "--programs 1")
    shown = "\n\n".join(o.report() for o in failures[:3])
    pytest.fail(f"{len(failures)} of {PROGRAMS} programs differ from eager (rerun the first: {rerun}):\n\n{shown}",
                pytrace=False)


@pytest.mark.parametrize("family", SELECTED)
def test_programs_of_one_family_match_eager(family):
    offset = list(FAMILIES).index(family) * 10000
    run_programs((family,), SEED_BASE + offset)


def test_programs_mixing_every_family_match_eager():
    run_programs(SELECTED, SEED_BASE + 500000)
