"""torchdefer changes nothing in torch: not at import, not after recording, not on other threads
(Note [What recording changes, and where] in bindings/torchdefer/_recording.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import torch
import torchdefer

# Runs in a fresh interpreter, so that nothing imported torchdefer before the first snapshot.
SNAPSHOT_PROGRAM = textwrap.dedent(
    """
    import torch, torch.nn.init

    def snapshot():
        entries = {}
        for cls in (*torch.Tensor.__mro__, torch.nn.Parameter):
            for name, value in vars(cls).items():
                entries[f"{cls.__qualname__}.{name}"] = id(value)
        for name, value in vars(torch.nn.init).items():
            if callable(value):
                entries[f"torch.nn.init.{name}"] = id(value)
        entries["torch.cuda._lazy_init"] = id(torch.cuda._lazy_init)
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

    model = torchdefer.deferred_init(Model)
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


def test_recording_is_invisible_to_other_threads():
    seen = {}
    recording = threading.Event()
    checked = threading.Event()

    def other_thread():
        recording.wait()
        seen["modes"] = torch.overrides._get_current_function_mode_stack()
        seen["made"] = torch.ones(2)
        checked.set()

    def build():
        recording.set()
        checked.wait(timeout=60)
        return torch.nn.Linear(2, 2)

    thread = threading.Thread(target=other_thread)
    thread.start()
    model = torchdefer.deferred_init(build)
    thread.join()
    assert seen["modes"] == [] and not torchdefer.is_fake(seen["made"])
    assert torchdefer.is_fake(model.weight)
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
