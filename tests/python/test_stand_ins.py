"""What the stand-ins installed while a recording is open leave behind, and how they act for data
torch takes (Note [What recording changes, and where] in bindings/torchdefer/_recording.py)."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest
import torch
import torchdefer


def _run(program: str, *args: str) -> list:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(program), *args],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


# Each cache is asked for the first time inside a recording, in a fresh interpreter.
CACHES_PROGRAM = """
    import sys, torch, torch.overrides as O, torch.utils._device
    import torchdefer

    def answers():
        return [
            torch.tensor in torch.utils._device._device_constructors(),
            torch.as_tensor in torch.utils._device._device_constructors(),
            torch.Tensor.new in O.get_ignored_functions(),
            torch.tensor in O.get_ignored_functions(),
            torch.Tensor.tolist in O.get_overridable_functions()[torch.Tensor],
            torch.Tensor.tolist in O.get_testing_overrides(),
            torch.Tensor.data.__get__ in O.get_testing_overrides(),
            len(O._get_tensor_methods()),
        ]

    def first_asked():
        torch.utils._device._device_constructors(), O.get_ignored_functions()
        O.get_overridable_functions(), O.get_testing_overrides(), O._get_tensor_methods()
        return torch.nn.Linear(2, 2)

    if sys.argv[1] == "recording":
        torchdefer.deferred_init(first_asked)
    else:
        first_asked()
    print(answers())
    torch.set_default_device("meta")
    print(torch.tensor([1.0]).device, torch.as_tensor([1.0]).device)
"""


def test_torchs_caches_first_filled_inside_a_recording_hold_torchs_objects():
    assert _run(CACHES_PROGRAM, "recording") == _run(CACHES_PROGRAM, "eager")


def test_fake_mode_leaves_the_default_device_applying_to_torch_tensor():
    lines = _run(
        """
        import torch, torchdefer
        with torchdefer.fake_mode():
            torch.zeros(2)
        torch.set_default_device("meta")
        with torch.device("meta"):
            made = torch.as_tensor([1.0])
        print(torch.tensor([1.0]).device, made.device)
        """
    )
    assert lines == ["meta meta"]


def test_dynamo_compiled_first_while_a_recording_is_open_sees_torchs_functions_after():
    lines = _run(
        """
        import threading, warnings, torch, torchdefer
        warnings.simplefilter("ignore")
        started, release = threading.Event(), threading.Event()
        def build():
            started.set(); release.wait(); return torch.nn.Linear(2, 2)
        thread = threading.Thread(target=lambda: torchdefer.deferred_init(build))
        thread.start(); started.wait()
        torch.compile(lambda x: torch.relu(x), backend="eager")(torch.ones(2))
        release.set(); thread.join()
        from torch._dynamo import trace_rules
        print(torch.tensor in trace_rules.get_torch_obj_rule_map())
        torch._dynamo.reset()
        f = torch.compile(lambda x: x + torch.tensor([1.0, 2.0]), backend="eager", fullgraph=True)
        print(f(torch.ones(2)).tolist())
        """
    )
    assert lines == ["True", "[2.0, 3.0]"]


def _add_constants(x: torch.Tensor) -> torch.Tensor:
    return x + torch.tensor([1.0, 2.0]) + torch.as_tensor([3.0, 4.0])


def test_torchscript_compiles_torch_tensor_and_as_tensor_while_a_recording_is_open():
    scripted = {}

    def build():
        scripted["f"] = torch.jit.script(_add_constants)
        return torch.nn.Linear(2, 2)

    torchdefer.deferred_init(build)
    assert scripted["f"](torch.ones(2)).tolist() == [5.0, 7.0]


def test_a_patch_made_while_a_recording_is_open_is_kept_after_it_closes():
    def patched_tolist(self):
        return "patched"

    def build():
        torch.Tensor.tolist = patched_tolist
        return torch.nn.Linear(2, 2)

    try:
        torchdefer.deferred_init(build)
        assert torch.Tensor.tolist is patched_tolist
    finally:
        del torch.Tensor.tolist
    assert torch.Tensor.tolist is torch._C.TensorBase.tolist


def test_a_patch_made_on_another_thread_while_a_recording_is_open_is_kept():
    torchs = torch.tensor
    started, release = threading.Event(), threading.Event()

    def build():
        started.set()
        release.wait(timeout=60)
        return torch.nn.Linear(2, 2)

    thread = threading.Thread(target=lambda: torchdefer.deferred_init(build))
    thread.start()
    started.wait(timeout=60)

    def patched(*args, **kwargs):
        return torchs(*args, **kwargs)

    saved, torch.tensor = torch.tensor, patched  # the patch saves the stand-in
    try:
        release.set()
        thread.join()
        assert torch.tensor is patched
    finally:
        torch.tensor = saved  # and puts it back after the recording closed
    torchdefer.deferred_init(torch.nn.Linear, 2, 2)  # the next recording puts torch's back
    assert torch.tensor is torchs


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_a_child_forked_while_another_thread_records_restores_torch():
    lines = _run(
        """
        import os, threading, torch, torchdefer
        from torchdefer import _recording
        torchs = torch.tensor
        started, release = threading.Event(), threading.Event()
        def build():
            started.set(); release.wait(); return torch.nn.Linear(2, 2)
        thread = threading.Thread(target=lambda: torchdefer.deferred_init(build))
        thread.start(); started.wait()
        pid = os.fork()
        if pid == 0:
            restored = torch.tensor is torchs
            model = torchdefer.deferred_init(torch.nn.Linear, 2, 2)
            torchdefer.materialize_module(model)
            restored_after = torch.tensor is torchs
            print("child", restored, restored_after, _recording._installed._open, flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        release.set(); thread.join()
        print("parent", torch.tensor is torchs)
        """
    )
    assert lines == ["child True True 0", "parent True"]


Pair = collections.namedtuple("Pair", "x y")


def test_torch_tensor_of_a_namedtuple_holding_fakes_is_eagers():
    def build():
        layer = torch.nn.Linear(2, 2)
        layer.register_buffer("pair", torch.tensor(Pair(layer.bias[0] * 2, layer.bias[1])))
        return layer

    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build)
    torchdefer.materialize_module(deferred)
    assert torch.equal(deferred.pair, eager.pair)


def test_new_on_a_fake_takes_the_data_torch_takes_and_refuses_the_rest_as_torch_does():
    real = torch.zeros(2)
    with pytest.raises(TypeError) as eager_error:
        real.new(3.5)
    with torchdefer.fake_mode():
        fake = torch.zeros(2)
        with pytest.raises(TypeError) as fake_error:
            fake.new(3.5)
        made = fake.new(range(3))
    assert str(fake_error.value) == str(eager_error.value)
    assert torchdefer.is_fake(made) and made.shape == (3,)
    assert made.dtype == real.new(range(3)).dtype


def test_deleting_data_while_a_recording_is_open_raises_torchs_error():
    parameter = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(RuntimeError) as eager_error:
        del parameter.data
    with torchdefer.fake_mode():
        with pytest.raises(RuntimeError) as recording_error:
            del parameter.data
    assert str(recording_error.value) == str(eager_error.value)


def test_trunc_normal_of_a_real_or_meta_tensor_while_a_recording_is_open_is_torchs():
    def sample(tensor):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.nn.init.trunc_normal_(tensor, mean=5.0, std=0.5, a=-1.0, b=1.0)
        return [str(w.message) for w in caught]

    torch.manual_seed(1)
    eager = torch.empty(33)
    eager_warnings, eager_meta_warnings = sample(eager), sample(torch.empty(4, device="meta"))
    real, meta = torch.empty(33), torch.empty(4, device="meta")  # made outside: not fakes
    with torchdefer.fake_mode():
        torch.manual_seed(1)
        recording_warnings, recording_meta_warnings = sample(real), sample(meta)
    assert torch.equal(real, eager)
    assert recording_warnings == eager_warnings and recording_meta_warnings == eager_meta_warnings
