"""Unpickling and torch.load of real tensors inside a recording or fake_mode give real tensors,
as in eager (Note [Loading real tensors while recording] in bindings/torchdefer/_recording.py)."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
import torchdefer

TABLE = torch.arange(12.0).reshape(3, 4)


def _saved(obj) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


LOADS = {
    "pickle tensor": lambda: pickle.loads(pickle.dumps(TABLE)),
    "pickle parameter": lambda: pickle.loads(pickle.dumps(torch.nn.Parameter(TABLE.clone()))),
    "pickle offset view": lambda: pickle.loads(pickle.dumps(TABLE[1:, ::2])),
    "torch.load weights_only": lambda: torch.load(_saved(TABLE[:, 1:])),
    "torch.load full pickle": lambda: torch.load(_saved({"t": TABLE.t()}), weights_only=False)["t"],
    "torch.load parameter": lambda: torch.load(_saved(torch.nn.Parameter(TABLE.clone()))),
}


class WithTable(torch.nn.Module):
    """Loads a precomputed table in its constructor, registers it, and uses it in its init."""

    def __init__(self, load):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("table", load().detach().clone())
        with torch.no_grad():
            self.linear.weight.add_(self.table[:, :1].sum())
            self.linear.bias.copy_(self.table.reshape(-1)[:4])


@pytest.mark.parametrize("name", sorted(LOADS))
def test_a_loaded_tensor_is_real_and_equal_to_eagers(name):
    eager = LOADS[name]()
    seen = {}

    def build():
        seen["loaded"] = LOADS[name]()
        return torch.nn.Linear(2, 2)

    torchdefer.deferred_init(build)
    loaded = seen["loaded"]
    assert not torchdefer.is_fake(loaded)
    assert type(loaded) is type(eager)
    assert (loaded.shape, loaded.stride(), loaded.storage_offset()) == (
        eager.shape, eager.stride(), eager.storage_offset())
    assert torch.equal(loaded, eager)
    with torchdefer.fake_mode():
        under_fake_mode = LOADS[name]()
    assert not torchdefer.is_fake(under_fake_mode) and torch.equal(under_fake_mode, eager)


@pytest.mark.parametrize("name", ["pickle offset view", "torch.load weights_only"])
def test_a_model_using_a_loaded_table_materializes_to_eagers_bits(name):
    torch.manual_seed(0)
    eager = WithTable(LOADS[name])
    torch.manual_seed(0)
    model = torchdefer.deferred_init(WithTable, LOADS[name])
    torchdefer.materialize_module(model)
    for (key, expected), (_, got) in zip(eager.state_dict().items(), model.state_dict().items()):
        assert torch.equal(got, expected), key


def test_a_state_dict_loaded_into_the_fake_model_in_its_constructor_materializes_to_it():
    saved = _saved(torch.nn.Linear(4, 4).state_dict())

    class Pretrained(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            saved.seek(0)
            self.linear.load_state_dict(torch.load(saved))

    torch.manual_seed(0)
    eager = Pretrained()
    torch.manual_seed(0)
    model = torchdefer.deferred_init(Pretrained)
    assert torchdefer.is_fake(model.linear.weight)
    torchdefer.materialize_module(model)
    for (key, expected), (_, got) in zip(eager.state_dict().items(), model.state_dict().items()):
        assert torch.equal(got, expected), key


def test_torchs_rebuild_function_is_back_after_the_recording():
    rebuild = torch._utils._rebuild_tensor
    torchdefer.deferred_init(lambda: pickle.loads(pickle.dumps(TABLE)) + torch.ones(1))
    assert torch._utils._rebuild_tensor is rebuild
