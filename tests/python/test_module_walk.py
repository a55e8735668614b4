"""Which tensors materialize_module and is_deferred see (Note [Walking a module] in
bindings/torchdefer/_module_tree.py), and that the walk keeps nothing alive."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torchdefer


class Rotary(torch.nn.Module):
    """Tensors held as plain attributes, as rotary embeddings and position tables do."""

    def __init__(self, dim: int = 8, n: int = 6):
        super().__init__()
        self.proj = torch.nn.Linear(dim, dim)
        self.inv_freq = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)
        self.pos = torch.arange(n)
        self.tables = [torch.randn(2, 3), (torch.rand(4), {"scale": torch.full((2,), 0.5)})]
        self.by_name = {"cos": self.inv_freq.cos(), "nested": [torch.randn(3)]}
        self.alias = self.proj.weight  # a parameter also held as an attribute


def attribute_tensors(m: Rotary):
    return {
        "inv_freq": m.inv_freq,
        "pos": m.pos,
        "tables[0]": m.tables[0],
        "tables[1][0]": m.tables[1][0],
        "tables[1][1]['scale']": m.tables[1][1]["scale"],
        "by_name['cos']": m.by_name["cos"],
        "by_name['nested'][0]": m.by_name["nested"][0],
    }


def test_tensors_held_as_attributes_and_in_containers_are_materialized_with_eager_values():
    torch.manual_seed(0)
    eager = Rotary()
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(Rotary)
    assert torchdefer.is_fake(deferred.inv_freq) and torchdefer.is_fake(deferred.by_name["nested"][0])
    assert torchdefer.is_deferred(deferred)
    stats = torchdefer.materialize_module(deferred)
    assert not torchdefer.is_deferred(deferred)
    names = {s["name"] for s in stats}
    assert {"proj.weight", "proj.bias"} | set(attribute_tensors(deferred)) == names, names
    for name, tensor in attribute_tensors(deferred).items():
        assert not torchdefer.is_fake(tensor), name
        assert torch.equal(tensor, attribute_tensors(eager)[name]), name
    assert deferred.alias is deferred.proj.weight and torch.equal(deferred.alias, eager.proj.weight)


def test_is_deferred_sees_a_fake_attribute_left_alone():
    deferred = torchdefer.deferred_init(Rotary)
    torchdefer.materialize_module(deferred, buffers_only=True)
    assert torchdefer.is_fake(deferred.proj.weight) and not torchdefer.is_fake(deferred.pos)
    torchdefer.materialize_module(deferred)
    deferred.extra = {"late": torchdefer.deferred_init(torch.zeros, 3)}
    assert torchdefer.is_deferred(deferred)


def test_a_shard_splits_parameters_and_keeps_attributes_whole():
    torch.manual_seed(0)
    full = torchdefer.deferred_init(Rotary)
    torchdefer.materialize_module(full, rng="counter")
    torch.manual_seed(0)
    local = torchdefer.deferred_init(Rotary)
    stats = torchdefer.materialize_module(local, shard=torchdefer.Shard(1, 2))
    by_name = {s["name"]: s for s in stats}
    assert local.proj.weight.shape == (4, 8) and by_name["proj.weight"]["box"] is not None
    for name, tensor in attribute_tensors(local).items():
        assert by_name[name]["box"] is None, name
        assert torch.equal(tensor, attribute_tensors(full)[name]), name


def test_check_fn_skips_the_attributes_of_skipped_children():
    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Rotary()
            self.own = torch.ones(2)

    deferred = torchdefer.deferred_init(Outer)
    torchdefer.materialize_module(deferred, check_fn=lambda m: not isinstance(m, Rotary))
    assert not torchdefer.is_fake(deferred.own)
    assert torchdefer.is_fake(deferred.inner.pos) and torchdefer.is_fake(deferred.inner.proj.weight)


def test_a_deleted_module_frees_its_weights_without_the_cyclic_collector():
    deferred = torchdefer.deferred_init(Rotary)
    torchdefer.materialize_module(deferred)
    weight, attribute = weakref.ref(deferred.proj.weight), weakref.ref(deferred.inv_freq)
    gc.disable()
    try:
        assert torchdefer.is_deferred(deferred) is False
        torchdefer.materialize_module(deferred)  # a second walk, finding nothing
        del deferred
        assert weight() is None and attribute() is None, "a reference cycle kept the weights"
    finally:
        gc.enable()


def test_materializing_on_the_meta_device_is_refused_and_keeps_the_recording():
    deferred = torchdefer.deferred_init(torch.nn.Linear, 3, 2)
    with pytest.raises(ValueError, match='cannot materialize on device="meta"'):
        torchdefer.materialize_module(deferred, device="meta")
    with pytest.raises(ValueError, match='cannot materialize on device="meta"'):
        torchdefer.materialize_tensor(deferred.weight, device=torch.device("meta"))
    assert torchdefer.is_fake(deferred.weight)
    torchdefer.materialize_module(deferred)
    assert not torchdefer.is_deferred(deferred) and deferred.weight.abs().sum() > 0
