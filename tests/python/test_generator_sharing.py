"""Note [Replays that lend themselves the default generator]: a materialization whose random ops
draw from the default generator is refused while another thread is inside deferred_init (the
recording places its random ops on that generator) and waits while another thread runs such a
replay (each would draw from the other's states); a counter-mode one, and one that draws nothing,
run beside either."""

import contextlib
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import torchdefer
from test_recording_state import assert_same_state

inside = threading.Event()
release = threading.Event()


@contextlib.contextmanager
def another_thread_waiting(target, waiting: threading.Event, release_it: threading.Event):
    """Runs `target` on another thread until it sets `waiting`, and the body while it waits there;
    then sets `release_it` and joins it."""
    thread = threading.Thread(target=target)
    thread.start()
    try:
        assert waiting.wait(30)
        yield
    finally:
        release_it.set()
        thread.join()


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

    with another_thread_waiting(record, inside, release):
        with pytest.raises(RuntimeError, match="while another thread is inside deferred_init"):
            torchdefer.materialize_module(elsewhere)
        torchdefer.materialize_module(counter, rng="counter")
        assert not torchdefer.is_fake(counter.weight)
    torchdefer.materialize_module(recorded["model"])
    torch.manual_seed(0)
    assert_same_state(WaitsInsideItsConstructor(False), recorded["model"])
    torchdefer.materialize_module(elsewhere)  # the recording has ended: torch mode runs again
    assert not torchdefer.is_fake(elsewhere.weight)


# A replay that stops inside its run until released: the custom op's CPU kernel runs only when a
# materialization computes it, after the replay has marked itself (Note [Replays that lend
# themselves the default generator]).
replaying = threading.Event()
resume = threading.Event()


@torch.library.custom_op("torchdefer_tests::waits_in_replay", mutates_args=())
def waits_in_replay(x: torch.Tensor) -> torch.Tensor:
    replaying.set()
    assert resume.wait(30)
    return x.clone()


@waits_in_replay.register_fake
def _(x):
    return torch.empty_like(x)


class WaitsInItsReplay(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(8).uniform_())
        self.v = torch.nn.Parameter(waits_in_replay(torch.full((8,), 0.5)))


class DrawsNothing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3) * 2)


@contextlib.contextmanager
def another_thread_materializing_a_waiting_model():
    """Records WaitsInItsReplay (seed 0) and materializes it in torch mode on another thread, which
    stops inside its replay while the body runs; yields the model, which must then materialize."""
    replaying.clear()
    resume.clear()
    torch.manual_seed(0)
    waiting = torchdefer.deferred_init(WaitsInItsReplay)
    failures = []

    def materialize():
        try:
            torchdefer.materialize_module(waiting)
        except Exception as e:  # reported below
            failures.append(e)
            replaying.set()

    with another_thread_waiting(materialize, replaying, resume):
        yield waiting
    assert not failures, failures


def test_a_second_replay_on_the_default_generator_waits_and_one_that_draws_nothing_runs():
    torch.manual_seed(1)
    second = torchdefer.deferred_init(torch.nn.Linear, 4, 4)
    counter = torchdefer.deferred_init(torch.nn.Linear, 4, 4)
    nothing_random = torchdefer.deferred_init(DrawsNothing)
    failures = []
    second_done = threading.Event()

    def materialize_second():
        try:
            torchdefer.materialize_module(second)
        except Exception as e:  # reported by the main thread
            failures.append(e)
        second_done.set()

    other = threading.Thread(target=materialize_second)
    with another_thread_materializing_a_waiting_model() as waiting:
        other.start()
        # Long enough for a second replay that did not wait to have ended.
        assert not second_done.wait(1.0)
        assert torchdefer.is_fake(second.weight) and torchdefer.is_fake(second.bias)
        torchdefer.materialize_module(nothing_random)
        assert torch.equal(nothing_random.w, torch.arange(6.0).reshape(2, 3) * 2)
        torchdefer.materialize_module(counter, rng="counter")
        assert not torchdefer.is_fake(counter.weight)
    other.join()
    assert not failures, failures
    torch.manual_seed(0)
    assert_same_state(WaitsInItsReplay(), waiting)
    torch.manual_seed(1)
    assert_same_state(torch.nn.Linear(4, 4), second)


def test_a_random_op_on_a_returned_models_fakes_is_refused_while_another_thread_lends_the_generator():
    torch.manual_seed(1)
    later = torchdefer.deferred_init(torch.nn.Linear, 4, 4)
    with another_thread_materializing_a_waiting_model():
        with pytest.raises(RuntimeError, match="cannot record aten::normal_ on a deferred model's fakes"):
            torch.nn.init.normal_(later.weight)
    torch.manual_seed(2)
    torch.nn.init.normal_(later.weight)  # no replay lends the generator now: recorded
    torchdefer.materialize_module(later)
    torch.manual_seed(1)
    eager = torch.nn.Linear(4, 4)
    torch.manual_seed(2)
    torch.nn.init.normal_(eager.weight)
    assert_same_state(eager, later)


def test_a_block_left_open_by_a_finished_thread_and_dropped_elsewhere_ends_no_other_threads_work():
    # Note [A scope dropped on another thread]: in a fresh interpreter, since ending the scope on
    # the dropping thread crashed it.
    script = textwrap.dedent(
        """
        import gc, threading, torch, torchdefer
        box = {}
        def worker():
            block = torchdefer.deferred()
            block.__enter__()
            box["block"] = block
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        del box["block"]
        gc.collect()
        assert not torchdefer.is_fake(torch.zeros(1))  # this thread's state is its own
        torch.manual_seed(0)
        model = torchdefer.deferred_init(torch.nn.Linear, 4, 4)
        torchdefer.materialize_module(model)  # not refused for the dead thread's block
        torch.manual_seed(0)
        assert torch.equal(model.weight, torch.nn.Linear(4, 4).weight)
        print("ok")
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.split() == ["ok"], run.stdout + run.stderr
