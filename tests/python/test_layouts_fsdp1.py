"""FSDP1 through torchdefer.compat: each rank's peak memory while FSDP wraps a deferred model is at
most eager construction's for the same wrap policy (Note [FSDP1 units and the heap] in
bindings/torchdefer/_heap.py), measured by bench/fsdp1_memory.py on 2 Gloo ranks."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^(torchdefer|eager)\s+rank (\d)/2: peak RSS growth\s+([\d.]+) MiB")


def peaks(*options):
    """{(way, rank): peak RSS growth in MiB} from one run of the benchmark, default malloc."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    command = [sys.executable, str(REPO / "bench" / "fsdp1_memory.py"), "--world", "2", *options]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    found = {}
    for line in done.stdout.splitlines():
        match = LINE.match(line)
        if match:
            found[(match[1], int(match[2]))] = float(match[3])
    assert len(found) == 4, done.stdout
    return found


@pytest.mark.parametrize("policy", [[], ["--root-units"]], ids=["blocks", "root-units"])
def test_each_ranks_peak_is_at_most_eagers_for_the_same_wrap_policy(policy):
    found = peaks("--layers", "4", "--dim", "512", "--vocab", "8000", *policy)
    for rank in range(2):
        assert found[("torchdefer", rank)] <= found[("eager", rank)], found
