"""Note [A recording and a torch-mode replay on two threads]: a torch-mode materialization on one
thread while another thread is inside deferred_init is refused, since the replay would lend itself
the default generator that the recording places its random ops on; a counter-mode one runs."""

import threading

import pytest
import torch

import torchdefer
from test_recording_state import assert_same_state

inside = threading.Event()
release = threading.Event()


class WaitsInsideItsConstructor(torch.nn.Module):
    def __init__(self, wait):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(8).uniform_())
        if wait:
            inside.set()
            assert release.wait(30)
        self.v = torch.nn.Parameter(torch.randn(8))


def test_a_torch_mode_materialization_during_another_threads_recording_is_refused_and_changes_nothing():
    inside.clear()
    release.clear()
    torch.manual_seed(0)
    elsewhere = torchdefer.deferred_init(torch.nn.Linear, 4, 4)
    counter = torchdefer.deferred_init(torch.nn.Linear, 4, 4)
    recorded = {}

    def record():
        torch.manual_seed(0)
        recorded["model"] = torchdefer.deferred_init(WaitsInsideItsConstructor, True)

    thread = threading.Thread(target=record)
    thread.start()
    try:
        assert inside.wait(30)
        with pytest.raises(RuntimeError, match="while another thread is inside deferred_init"):
            torchdefer.materialize_module(elsewhere)
        torchdefer.materialize_module(counter, rng="counter")
        assert not torchdefer.is_fake(counter.weight)
    finally:
        release.set()
        thread.join()
    torchdefer.materialize_module(recorded["model"])
    torch.manual_seed(0)
    assert_same_state(WaitsInsideItsConstructor(False), recorded["model"])
    torchdefer.materialize_module(elsewhere)  # the recording has ended: torch mode runs again
    assert not torchdefer.is_fake(elsewhere.weight)
