"""What a user meets first: progress reporting, Tensor methods on fakes, errors for bad input,
the documented quick start, help(), and the package as pip installs it."""

from __future__ import annotations

import inspect
import io
import os
import re
import subprocess
import sys
import textwrap
from contextlib import redirect_stderr
from pathlib import Path

import pytest
import torch
import torchdefer

ROOT = Path(__file__).resolve().parents[2]


def linear_stack() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))


# Progress.


def test_progress_callable_sees_every_replayed_op_once_in_order():
    model = torchdefer.deferred_init(linear_stack)
    steps = []
    torchdefer.materialize_module(model, progress=lambda *step: steps.append(step))
    assert [done for done, _, _ in steps] == list(range(1, len(steps) + 1))
    assert {total for _, total, _ in steps} == {len(steps)}
    assert all(name.startswith("aten::") for _, _, name in steps)
    assert not torchdefer.is_deferred(model)


def test_progress_when_sharding_counts_tensors_by_name():
    torch.manual_seed(0)
    model = torchdefer.deferred_init(linear_stack)
    steps = []
    torchdefer.materialize_module(model, shard=torchdefer.Shard(0, 2), progress=lambda *s: steps.append(s))
    assert sorted(name for _, _, name in steps) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert [done for done, total, _ in steps] == [1, 2, 3, 4] and steps[-1][1] == 4


def test_progress_that_raises_leaves_the_module_fake_and_materializable():
    model = torchdefer.deferred_init(linear_stack)

    class Stop(Exception):
        pass

    def stop(done, total, name):
        if done == 2:
            raise Stop

    with pytest.raises(Stop):
        torchdefer.materialize_module(model, progress=stop)
    assert all(torchdefer.is_fake(p) for p in model.parameters())
    torchdefer.materialize_module(model)
    assert not torchdefer.is_deferred(model)


def test_progress_true_shows_a_tqdm_bar_on_stderr():
    import tqdm  # noqa: F401  (installed with transformers; without it: the line tested below)
    model = torchdefer.deferred_init(linear_stack)
    err = io.StringIO()
    with redirect_stderr(err):
        torchdefer.materialize_module(model, progress=True)
    assert re.search(r"materializing: 100%.*\d+/\d+", err.getvalue()), err.getvalue()


def test_progress_true_without_tqdm_prints_plain_lines(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # makes `from tqdm.auto import` fail
    model = torchdefer.deferred_init(linear_stack)
    err = io.StringIO()
    with redirect_stderr(err):
        torchdefer.materialize_module(model, progress=True)
    last = err.getvalue().strip().splitlines()[-1]
    assert re.fullmatch(r"torchdefer: materialized (\d+)/\1 ops \(aten::\w+.*\)", last), last


# Tensor methods on fakes.


def test_type_and_legacy_new_work_on_fakes():
    def program():
        base = torch.empty(2, 3, dtype=torch.float64)
        assert base.type() == "torch.DoubleTensor"
        return base, base.new(4, 5), base.new(torch.Size([2])), base.new(), base.new([1.0, 2.0])

    base, by_sizes, by_size, empty, by_data = torchdefer.deferred_init(program)
    assert base.type() == "torch.DoubleTensor" and base.type(torch.float32).dtype == torch.float32
    assert [t.shape for t in (by_sizes, by_size, empty, by_data)] == [(4, 5), (2,), (0,), (2,)]
    assert all(t.dtype == torch.float64 and torchdefer.is_fake(t) for t in (by_sizes, by_data))
    assert torchdefer.materialize_tensor(by_data).tolist() == [1.0, 2.0]
    with torchdefer.fake_mode("cuda"):
        on_cuda = torch.empty(2)
        assert on_cuda.type() == "torch.cuda.FloatTensor" and on_cuda.new(3).is_cuda
        assert torch.ones(2).new(3).shape == (3,), "real tensors keep torch's own new()"
        with pytest.raises(RuntimeError, match="not supported on a fake"):
            base.new(torch.ones(2))
    # Outside deferred_init and fake_mode, new() is torch's own, which cannot place a fake
    # (docs/python.md); new_empty, a dispatcher op, can.
    with pytest.raises(RuntimeError, match="Fake doesn't correspond to a device"):
        on_cuda.new(3)
    assert torchdefer.is_fake(on_cuda.new_empty(3)) and on_cuda.new_empty(3).is_cuda


# Bad input: a clear Python exception, and the module as it was.


def fresh():
    return torchdefer.deferred_init(torch.nn.Linear, 4, 6)


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(shard="0/2"), TypeError, r"shard must be a torchdefer.Shard"),
        (dict(shard=torchdefer.Shard(2, 2)), RuntimeError, r"not a rank of that world"),
        (dict(shard=torchdefer.Shard(-1, 2)), RuntimeError, r"not a rank of that world"),
        (dict(shard=torchdefer.Shard(0, 0)), RuntimeError, r"not a rank of that world"),
        (dict(shard=torchdefer.Shard(0, 2, dim=-1)), RuntimeError, r"dim must be >= 0"),
        (dict(rng="fast"), ValueError, r'rng must be "torch" or "counter"'),
        (dict(rng=1), ValueError, r'rng must be "torch" or "counter"'),
        (dict(counter_seed=-1), ValueError, r"counter_seed must be an int"),
        (dict(counter_seed="7"), TypeError, r"counter_seed must be an int"),
        (dict(counter_seed=7), ValueError, r"counter_seed only applies to the counter RNG mode"),
        (dict(counter_seed=7, rng="torch"), ValueError, r"counter_seed only applies"),
        (dict(check_fn=5), TypeError, r"check_fn must be a callable"),
        (dict(progress="yes"), TypeError, r"progress must be True, False, None or a callable"),
        (dict(device=3), TypeError, r"device must be a str or torch.device"),
        (dict(device="gpu"), RuntimeError, r"device type at start of device string: gpu"),
        (dict(device="cuda:99"), RuntimeError, r"cannot materialize"),
    ],
)
def test_bad_arguments_raise_clearly_and_change_nothing(kwargs, error, message):
    model = torch.nn.Sequential(fresh())
    with pytest.raises(error, match=message):
        torchdefer.materialize_module(model, **kwargs)
    assert all(torchdefer.is_fake(p) for p in model.parameters())
    torchdefer.materialize_module(model)
    assert not torchdefer.is_deferred(model)


def test_a_check_fn_that_raises_changes_nothing():
    model = torch.nn.Sequential(fresh(), fresh())

    def check(module):
        raise ValueError("check_fn failed")

    with pytest.raises(ValueError, match="check_fn failed"):
        torchdefer.materialize_module(model, check_fn=check)
    assert all(torchdefer.is_fake(p) for p in model.parameters())


def test_materializing_twice_is_a_no_op_that_keeps_the_values():
    torch.manual_seed(0)
    model = fresh()
    first = torchdefer.materialize_module(model)
    weight = model.weight.detach().clone()
    pointer = model.weight.data_ptr()
    assert [s["name"] for s in first] == ["weight", "bias"]
    assert torchdefer.materialize_module(model) == []
    assert model.weight.data_ptr() == pointer and torch.equal(model.weight, weight)
    assert torchdefer.materialize_tensor(model.bias) is model.bias


def test_a_shard_dim_a_tensor_lacks_keeps_that_tensor_whole():
    # Shard semantics: tensors without dimension `dim` are replicated (replay/shard.h).
    stats = torchdefer.materialize_module(fresh(), shard=torchdefer.Shard(0, 2, dim=1))
    boxes = {s["name"]: s["box"] for s in stats}
    assert boxes == {"weight": ([0, 0], [6, 2]), "bias": None}


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: torchdefer.is_deferred("model"), "is_deferred expects an nn.Module"),
        (lambda: torchdefer.is_fake([1.0]), "is_fake expects a torch.Tensor"),
        (lambda: torchdefer.explain(None), "explain expects a torch.Tensor"),
        (lambda: torchdefer.shard_info(3), "shard_info expects a torch.Tensor"),
        (lambda: torchdefer.materialize_tensor("w"), "materialize_tensor expects a torch.Tensor"),
        (lambda: torchdefer.materialize_module(torch.ones(2)), "materialize_module expects an nn.Module"),
        (lambda: torchdefer.deferred_init(None), "nn.Module class or a callable"),
        (lambda: torchdefer.fake_mode(3).__enter__(), "device must be a str or torch.device"),
    ],
)
def test_wrong_types_name_the_function_and_what_it_expects(call, message):
    with pytest.raises(TypeError, match=message):
        call()


def test_a_fake_mode_fake_cannot_be_materialized_and_says_why():
    with torchdefer.fake_mode():
        layer = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="made under a FakeMode, which records nothing"):
        torchdefer.materialize_module(layer)
    assert torchdefer.is_fake(layer.weight)


# Documentation.


def python_blocks(markdown: str):
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


def test_the_quick_start_in_docs_python_md_runs_as_written(tmp_path):
    quick_start = python_blocks((ROOT / "docs" / "python.md").read_text())[0]
    script = tmp_path / "quick_start.py"
    script.write_text(quick_start)
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "fake Float[2048, 1024] on cpu" in result.stdout


def test_every_public_function_has_a_docstring_and_type_hints():
    for name in torchdefer.__all__:
        item = getattr(torchdefer, name)
        assert inspect.getdoc(item), name
        if inspect.isfunction(item):
            signature = inspect.signature(inspect.unwrap(item))
            assert signature.return_annotation is not inspect.Signature.empty, name
            for parameter in signature.parameters.values():
                assert parameter.annotation is not inspect.Parameter.empty, f"{name}({parameter.name})"
    assert "Quick start" in torchdefer.__doc__


def test_help_renders_the_quick_start_and_every_function():
    text = subprocess.run(
        [sys.executable, "-c", "import pydoc, torchdefer; print(pydoc.render_doc(torchdefer, renderer=pydoc.plaintext))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Quick start" in text
    for name in torchdefer.__all__:
        assert name in text, name
