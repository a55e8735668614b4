"""The jump at the end of deferred_init is made on a worker thread that holds the default
generator's mutex (Note [The jump in the background]): from Python, the generator right after
deferred_init is eager's for torch.get_rng_state, draws, reseeds, os.fork and exit."""

import os
import subprocess
import sys
import textwrap

import torch
import torchdefer


def build():
    return torch.nn.Sequential(torch.nn.Embedding(8000, 512), torch.nn.Linear(512, 2048))


def eager_after(seed: int):
    torch.manual_seed(seed)
    build()
    return torch.get_rng_state(), torch.rand(100)


def test_get_rng_state_right_after_deferred_init_is_eagers():
    state, _ = eager_after(3)
    torch.manual_seed(3)
    torchdefer.deferred_init(build)
    assert torch.equal(torch.get_rng_state(), state)


def test_a_draw_right_after_deferred_init_is_eagers():
    _, drawn = eager_after(4)
    torch.manual_seed(4)
    torchdefer.deferred_init(build)
    assert torch.equal(torch.rand(100), drawn)


def test_a_manual_seed_right_after_deferred_init_stands():
    torch.manual_seed(9)
    seeded = torch.rand(100)
    torch.manual_seed(5)
    torchdefer.deferred_init(build)
    torch.manual_seed(9)
    assert torch.equal(torch.rand(100), seeded)


def test_a_child_forked_right_after_deferred_init_draws_eagers_numbers():
    _, drawn = eager_after(6)
    torch.manual_seed(6)
    torchdefer.deferred_init(build)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.write(write_end, torch.rand(100).numpy().tobytes())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert torch.equal(torch.frombuffer(bytearray(data), dtype=torch.float32), drawn)


def test_the_interpreter_exits_cleanly_with_a_jump_pending():
    program = textwrap.dedent(
        """
        import torch, torchdefer
        torchdefer.deferred_init(lambda: torch.nn.Linear(4096, 4096))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
