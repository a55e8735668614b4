"""Pipeline stages cut from one recording: every stage records the whole model, deletes the layers
it does not run (as pipeline splitting does), and materializes what is left, which gets exactly
the full model's weights and costs only its own tensors."""

import pytest
import torch
import torchdefer

from test_distributed import run_ranks
from test_torchdefer import bitwise_equal


class Block(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.attn = torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        torch.nn.init.normal_(self.mlp.weight, std=0.02)
        torch.nn.init.trunc_normal_(self.attn.bias, std=0.1)

    def forward(self, x):
        return self.norm(x + self.mlp(torch.tanh(self.attn(x))))


class Model(torch.nn.Module):
    """Llama-shaped, with its layers in a ModuleDict as torchtitan keeps them for splitting; the
    output layer's weight is drawn after every block, so it depends on all of their draws."""

    def __init__(self, dim=12, layers=4, vocab=29):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.layers = torch.nn.ModuleDict({str(i): Block(dim) for i in range(layers)})
        self.norm = torch.nn.LayerNorm(dim)
        self.output = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, x):
        x = self.embed(x) if self.embed is not None else x
        for layer in self.layers.values():
            x = layer(x)
        return self.output(self.norm(x)) if self.output is not None else x


def cut(model, stage, stages):
    """Keeps the layers of ``stage`` (of ``stages``): deletes the others, and the embedding or the
    output head where this stage is not the first or the last."""
    per_stage = len(model.layers) // stages
    for name in list(model.layers):
        if int(name) // per_stage != stage:
            del model.layers[name]
    if stage != 0:
        model.embed = None
    if stage != stages - 1:
        model.norm = None
        model.output = None
    return model


def reference(rng):
    torch.manual_seed(0)
    if rng == "torch":
        return Model()
    model = torchdefer.deferred_init(Model)
    torchdefer.materialize_module(model, rng="counter")
    return model


def materialize_counting_ops(model, rng):
    ops = []
    torchdefer.materialize_module(model, rng=rng, progress=lambda done, total, op: ops.append(op))
    return ops


@pytest.mark.parametrize("rng", ["torch", "counter"])
def test_two_stages_get_the_full_models_weights_and_compute_only_their_own(rng):
    full = reference(rng)
    torch.manual_seed(0)
    whole_ops = materialize_counting_ops(torchdefer.deferred_init(Model), rng)
    stage_ops = []
    weights = {}
    for stage in range(2):
        torch.manual_seed(0)
        module = cut(torchdefer.deferred_init(Model), stage, 2)
        stage_ops += materialize_counting_ops(module, rng)
        weights.update(module.state_dict())
    assert weights.keys() == full.state_dict().keys()
    for name, value in full.state_dict().items():
        assert bitwise_equal(weights[name], value), name
    # The stages partition the model: together they replay exactly the ops of the whole model,
    # so neither computed a deleted layer's tensors.
    assert sorted(stage_ops) == sorted(whole_ops)


def test_a_late_stage_gets_eagers_bits_though_the_draws_before_it_are_deleted():
    # In torch RNG mode each random op replays from the generator offset it was recorded at, so
    # deleting the layers whose draws came first changes nothing for the ones kept.
    full = reference("torch")
    torch.manual_seed(0)
    model = torchdefer.deferred_init(Model)
    del model.layers["0"], model.layers["1"], model.layers["2"]
    model.embed = None
    ops = materialize_counting_ops(model, "torch")
    for name, value in model.state_dict().items():
        assert bitwise_equal(value, full.state_dict()[name]), name
    assert ops.count("aten::normal_") == 1  # layers.3.mlp.weight only; the embedding's is gone


def test_deleting_list_items_and_setting_none_cut_the_same_way():
    full = reference("torch")

    class Listed(Model):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(self.layers.values())

    torch.manual_seed(0)
    model = torchdefer.deferred_init(Listed)
    del model.layers[0]  # the list renumbers: layers.0 is now the recording's layers.1
    model.layers[1] = None
    model.output = None
    torchdefer.materialize_module(model)
    assert bitwise_equal(model.layers[0].attn.weight, full.layers["1"].attn.weight)
    assert bitwise_equal(model.layers[2].mlp.weight, full.layers["3"].mlp.weight)
    assert bitwise_equal(model.embed.weight, full.embed.weight)


def pipeline_worker(rank, world):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    full = reference("torch")
    torch.manual_seed(0)
    module = cut(torchdefer.deferred_init(Model), rank, world)
    torchdefer.materialize_module(module)
    for name, value in module.state_dict().items():
        assert bitwise_equal(value, full.state_dict()[name]), name
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    tokens = torch.arange(24).remainder(29).view(4, 6)
    schedule = ScheduleGPipe(stage, n_microbatches=2)
    if rank == 0:
        schedule.step(tokens)
    else:
        output = schedule.step()
        assert torch.allclose(output, full(tokens), rtol=0, atol=1e-6)


def test_two_pipeline_stages_over_gloo_run_the_full_models_forward(tmp_path):
    run_ranks(tmp_path, 2, pipeline_worker)


def test_a_kept_tensor_computed_from_a_deleted_layers_gets_its_values():
    class Derived(Model):
        def __init__(self):
            super().__init__()
            with torch.no_grad():  # the output layer starts as a scaled copy of the embedding
                self.output.weight.copy_(self.embed.weight * 0.5)

    torch.manual_seed(0)
    full = Derived()
    torch.manual_seed(0)
    last = cut(torchdefer.deferred_init(Derived), 1, 2)
    assert last.embed is None
    ops = materialize_counting_ops(last, "torch")
    assert bitwise_equal(last.output.weight, full.output.weight)
    assert ops.count("aten::normal_") == 3  # the embedding's draw (read), layers 2 and 3's mlp
