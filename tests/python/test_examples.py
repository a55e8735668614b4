"""The examples run as users run them (torchrun, 4 processes, Gloo), and their weights before
training are the single-process counter-mode model's, bitwise (issue 14 §7). They run with a slow
GIL hand-off (_slow_gil_handoff.py), under which an example that exits while Gloo's threads still
need the GIL aborts in most runs instead of a few."""

import os
import subprocess
import sys

import pytest
import torch
import torchdefer

from test_torchdefer import bitwise_equal

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
SLOW_GIL_HANDOFF = os.path.join(os.path.dirname(__file__), "_slow_gil_handoff.py")
sys.path.insert(0, EXAMPLES)
from llama import Config, Llama  # noqa: E402


@pytest.mark.parametrize("example", ["llama_fsdp2.py", "llama_fsdp2_tp.py"])
def test_example_trains_from_the_single_process_counter_model(tmp_path, example):
    initial = tmp_path / "initial.pt"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", SLOW_GIL_HANDOFF,
               os.path.join(EXAMPLES, example), "--steps", "2", "--seed", "3", "--save-initial", str(initial)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "step 1: loss" in run.stdout, run.stdout

    torch.manual_seed(3)
    reference = torchdefer.deferred_init(Llama, Config())
    torchdefer.materialize_module(reference, rng="counter")
    expected = dict(reference.named_parameters()) | dict(reference.named_buffers())
    state = torch.load(initial)
    assert state.keys() == expected.keys()
    for name, value in state.items():
        assert bitwise_equal(value, expected[name].detach()), name
