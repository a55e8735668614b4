"""torchdefer changes nothing in torch at import and nothing after recording; while a recording is
open it stands in for a few of torch's Python entry points, which act only for fakes on the
recording's thread, and puts no torch-function mode on any thread (Note [What recording changes,
and where] in bindings/torchdefer/_recording.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
import torchdefer

# Runs in a fresh interpreter, so that nothing imported torchdefer before the first snapshot.
SNAPSHOT_PROGRAM = textwrap.dedent(
    """
    import pickle, torch, torch.nn.init

    # Before the snapshots: pickling a tensor sets copyreg's Tensor.__slotnames__.
    pickled = pickle.dumps(torch.arange(3.0))

    def snapshot():
        entries = {}
        for cls in (*torch.Tensor.__mro__, torch.nn.Parameter):
            for name, value in vars(cls).items():
                entries[f"{cls.__qualname__}.{name}"] = id(value)
        for name, value in vars(torch.nn.init).items():
            if callable(value):
                entries[f"torch.nn.init.{name}"] = id(value)
        entries["torch.cuda._lazy_init"] = id(torch.cuda._lazy_init)
        entries["torch.tensor"] = id(torch.tensor)
        entries["torch.as_tensor"] = id(torch.as_tensor)
        entries["torch._utils._rebuild_tensor"] = id(torch._utils._rebuild_tensor)
        return entries

    def cuda_error():
        try:
            torch.empty(1, device="cuda")
        except Exception as e:
            return type(e).__name__
        return "none"

    def changed(before, after):
        return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))

    before, error_before = snapshot(), cuda_error()
    import torchdefer
    after_import = snapshot()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            torch.nn.init.trunc_normal_(self.linear.weight, std=0.02)
            self.on_cuda = torch.nn.Parameter(torch.empty(3, device="cuda"))
            self.listed = [repr(self.linear.weight), self.linear.weight.tolist()]
            self.loaded = pickle.loads(pickled)

    model = torchdefer.deferred_init(Model)
    try:
        torchdefer.deferred_init(lambda: [Model(), 1 / 0])  # left by an exception
    except ZeroDivisionError:
        pass
    torch.nn.init.trunc_normal_(model.linear.bias, std=0.1)  # after return: the fake's class
    with torchdefer.fake_mode("cuda"):
        torch.nn.Linear(2, 2)
    torchdefer.materialize_module(model, device="cpu")
    after_use = snapshot()
    print("import:", changed(before, after_import))
    print("use:", changed(before, after_use))
    print("cuda:", error_before, cuda_error())
    """
)


def test_import_and_use_leave_every_torch_function_as_it_was():
    result = subprocess.run(
        [sys.executable, "-c", SNAPSHOT_PROGRAM], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "import: []"
    assert lines[1] == "use: []"
    before, after = lines[2].split()[1:]
    assert before == after, "the CUDA lazy-init state leaked out of deferred_init"


def _on_another_thread_while_recording(work):
    """``work()``'s result, run on another thread while this thread's deferred_init is open."""
    result = {}
    recording = threading.Event()
    checked = threading.Event()

    def other_thread():
        recording.wait()
        try:
            result["value"] = work()
        finally:
            checked.set()

    def build():
        recording.set()
        checked.wait(timeout=60)
        return torch.nn.Linear(2, 2)

    thread = threading.Thread(target=other_thread)
    thread.start()
    model = torchdefer.deferred_init(build)
    thread.join()
    assert torchdefer.is_fake(model.weight)
    return result["value"]


def test_recording_is_invisible_to_other_threads():
    modes, made = _on_another_thread_while_recording(
        lambda: (torch.overrides._get_current_function_mode_stack(), torch.ones(2))
    )
    assert modes == [] and not torchdefer.is_fake(made)
    assert torch.overrides._get_current_function_mode_stack() == []


def test_trunc_normal_is_one_operator_under_fake_mode_too():
    with torchdefer.fake_mode():
        weight = torch.empty(64, 32)
        assert torch.nn.init.trunc_normal_(weight, std=0.02) is weight
    assert torchdefer.is_fake(weight)


def test_trunc_normal_operator_gives_torchs_bits():
    # The C++ kernel makes the same ATen calls as torch's Python sampler: both of its branches
    # (normal draws redrawn outside [a, b]; uniform candidates accepted by density), all dtypes.
    for mean, std, a, b in ((0.0, 1.0, -2.0, 2.0), (0.0, 0.02, -0.04, 0.04), (3.0, 1.0, -1.0, 0.0)):
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            torch.manual_seed(5)
            eager = torch.nn.init.trunc_normal_(torch.empty(257, dtype=dtype), mean, std, a, b)
            eager_state = torch.random.get_rng_state()
            torch.manual_seed(5)
            ours = torch.ops.torchdefer.trunc_normal_(torch.empty(257, dtype=dtype), mean, std, a, b)
            assert torch.equal(eager, ours), (mean, std, a, b, dtype)
            assert torch.equal(torch.random.get_rng_state(), eager_state)
    schema = torch.ops.torchdefer.trunc_normal_.default
    assert torch.Tag.nondeterministic_seeded in schema.tags


def test_trunc_normal_is_one_recorded_operator_under_other_torch_function_modes():
    # Hugging Face builds models inside `with torch.device(...)`, a torch-function mode of its own
    # that sees each call first and forwards it.
    def build():
        with torch.device("cpu"):
            layer = torch.nn.Linear(4, 4)
            torch.nn.init.trunc_normal_(layer.weight, std=0.02)
        return layer

    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build)
    assert torchdefer.explain(deferred.weight).endswith("trunc_normal_(0, 0.02, -2, 2)")
    torchdefer.materialize_module(deferred)
    assert torch.equal(deferred.weight, eager.weight)


def test_recording_puts_no_torch_function_mode_on_its_own_thread():
    # A mode would be handed every torch call of the construction (Note [What recording changes,
    # and where]); the stand-ins are found by attribute lookup instead.
    seen = {}

    def build():
        seen["modes"] = torch.overrides._get_current_function_mode_stack()
        seen["enabled"] = torch._C._is_torch_function_mode_enabled()
        return torch.nn.Linear(2, 2)

    torchdefer.deferred_init(build)
    assert seen["modes"] == [] and not seen["enabled"]
    with torchdefer.fake_mode():
        build()
    # Only the `with torch.device(...)` that fake_mode enters for torch's Python factories.
    assert [type(mode) for mode in seen["modes"]] == [torch.utils._device.DeviceContext]


def _real_tensor_behaviour():
    """What a thread sees of torch's stand-in entry points for real tensors and a fake."""
    torch.manual_seed(3)
    t = torch.arange(6.0).reshape(2, 3)
    p = torch.nn.Parameter(torch.zeros(2))
    p.data = torch.ones(2)
    copied = __import__("copy").deepcopy(t)
    sampled = torch.nn.init.trunc_normal_(torch.empty(5), std=0.5)
    return dict(
        repr=repr(t), format=f"{t}", tolist=t.tolist(), numpy=t.numpy().tolist(),
        array=__import__("numpy").asarray(t).tolist(), tensor=torch.tensor([1.5, 2.5]).tolist(),
        as_tensor=torch.as_tensor([[1, 2]]).tolist(), new_tensor=t.new_tensor([7]).tolist(),
        new=tuple(t.new(3, 1).shape), data=p.tolist(), deepcopy=copied.tolist(),
        copy_shares=copied.data_ptr() != t.data_ptr(), trunc_normal=sampled.tolist(),
        generator=torch.random.get_rng_state().sum().item(),
    )


def test_other_threads_get_torchs_behaviour_while_a_recording_is_open():
    expected = _real_tensor_behaviour()
    with torchdefer.fake_mode():
        fake = torch.ones(2)

    def work():
        seen = {"behaviour": _real_tensor_behaviour()}
        try:
            repr(fake)
        except RuntimeError as error:  # torch's value read, as with no recording open
            seen["fake"] = str(error)
        return seen

    seen = _on_another_thread_while_recording(work)
    assert seen["behaviour"] == expected
    assert "fake" in seen and "FakeTensor(" not in seen["fake"]


def test_a_subclass_on_another_thread_is_handed_torchs_own_functions_while_a_recording_is_open():
    seen = []

    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(func)
            return super().__torch_function__(func, types, args, kwargs or {})

    def calls():
        t = torch.ones(2).as_subclass(Logged)
        t.tolist(), t.numpy(), repr(t), t.new_tensor([1.0]), t.data
        t.data = torch.zeros(2)
        made, seen[:] = list(seen), []
        return made

    outside = calls()
    during = _on_another_thread_while_recording(calls)

    def what(func):  # a descriptor's __get__/__set__ is a new object at each access
        return (func.__self__, func.__name__) if type(func).__name__ == "method-wrapper" else func

    # The same functions: torch's own, never a stand-in.
    assert len(outside) == 6 and [what(f) for f in during] == [what(f) for f in outside]


def test_stand_ins_stay_until_the_last_of_overlapping_recordings_closes():
    tolist = torch._C.TensorBase.tolist
    inner_open = threading.Event()
    outer_closed = threading.Event()
    seen = {}

    def other_thread():
        def build():
            inner_open.set()
            outer_closed.wait(timeout=60)
            fake = torch.ones(3)
            seen["tolist"] = fake.tolist()  # this thread's recording is still open
            return fake

        torchdefer.deferred_init(build)

    thread = threading.Thread(target=other_thread)
    thread.start()

    def outer():
        inner_open.wait(timeout=60)
        return torch.ones(1)

    torchdefer.deferred_init(outer)
    outer_closed.set()
    thread.join()
    assert seen["tolist"] == [1.0, 1.0, 1.0]
    assert "tolist" not in vars(torch.Tensor) and torch.Tensor.tolist is tolist


def test_nested_recordings_and_fake_mode_restore_torch_when_the_outermost_closes():
    def inner():
        with torchdefer.fake_mode():
            assert repr(torch.ones(1)).startswith("FakeTensor(")
        return torch.ones(2)

    def outer():
        made = torchdefer.deferred_init(inner)
        assert repr(made).startswith("FakeTensor(")  # the outer recording is still open
        raise KeyError("leaving")

    repr_before = torch.Tensor.__repr__
    try:
        torchdefer.deferred_init(outer)
    except KeyError:
        pass
    assert torch.Tensor.__repr__ is repr_before and "data" not in vars(torch.Tensor)


FORK_AFTER_BACKWARD_PROGRAM = textwrap.dedent(
    """
    import os, torch, torchdefer

    with torchdefer.fake_mode("cuda"):  # a fake on a device type this build has no backend for
        torch.empty(2)
    threads = len(os.listdir("/proc/self/task"))
    torch.ones(2, requires_grad=True).sum().backward()  # the process's first backward
    print("threads started:", len(os.listdir("/proc/self/task")) - threads)
    pid = os.fork()
    if pid == 0:
        try:
            torch.ones(2, requires_grad=True).sum().backward()
        except RuntimeError:
            os._exit(3)
        os._exit(0)
    print("forked child's backward:", "ok" if os.waitpid(pid, 0)[1] == 0 else "failed")
    """
)


@pytest.mark.skipif(torch.cuda.is_available() or not hasattr(os, "fork"),
                    reason="the stand-in CUDA guard exists only without CUDA; needs os.fork")
def test_a_fake_cuda_tensor_leaves_a_cpu_backward_on_its_thread_and_forked_children_able_to_train():
    # Note [Stand-in device guards]: autograd started a worker per device the stand-in counted.
    result = subprocess.run(
        [sys.executable, "-c", FORK_AFTER_BACKWARD_PROGRAM], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["threads started: 0", "forked child's backward: ok"]
