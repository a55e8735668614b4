"""Real code that once gave a silently different model under deferred_init: torch's
parametrizations (a refusal swallowed as NotImplementedError), Hugging Face's
resize_token_embeddings, and random ops given an explicit torch.Generator (PEFT's VeRA). Each
case gives eager's bits, and eager's generators afterwards, or a clear error."""

from __future__ import annotations

import pytest
import torch
import torchdefer
from _same_model import assert_same_state, built_both_ways
from torch.nn.utils import parametrizations, parametrize


def eager_and_deferred(build, *args, seed=0, **kwargs):
    """(eager model, generator draw after it), (the same through deferred_init + materialize)."""
    eager, deferred, eager_next, deferred_next = built_both_ways(build, *args, seed=seed, **kwargs)
    return (eager, eager_next), (deferred, deferred_next)


# torch.nn.utils.parametrizations (Note [Refusals are RuntimeErrors]).


def orthogonal_linear(rows, cols, orthogonal_map, use_trivialization, dtype):
    linear = torch.nn.Linear(cols, rows, dtype=dtype)
    parametrizations.orthogonal(linear, orthogonal_map=orthogonal_map,
                                use_trivialization=use_trivialization)
    return linear


@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5)])
@pytest.mark.parametrize("orthogonal_map", ["matrix_exp", "cayley", "householder"])
@pytest.mark.parametrize("use_trivialization", [True, False])
def test_orthogonal_gives_eager_bits(shape, orthogonal_map, use_trivialization):
    # householder without trivialization runs geqrf in right_inverse; with it, the QR completion
    # of _make_orthogonal does, and an orthogonality check reads values.
    for dtype in (torch.float32, torch.float64):
        (eager, eager_next), (deferred, deferred_next) = eager_and_deferred(
            orthogonal_linear, *shape, orthogonal_map, use_trivialization, dtype)
        assert_same_state(eager, deferred)
        assert torch.equal(eager.weight, deferred.weight)
        assert torch.equal(eager_next, deferred_next)


@pytest.mark.parametrize("kind", ["weight_norm", "spectral_norm", "old_weight_norm", "old_spectral_norm"])
def test_weight_norm_and_spectral_norm_give_eager_bits(kind):
    def build():
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Conv1d(3, 4, 3))
        for layer in model:
            if kind == "old_weight_norm":
                torch.nn.utils.weight_norm(layer)
            elif kind == "old_spectral_norm":
                torch.nn.utils.spectral_norm(layer)
            else:
                getattr(parametrizations, kind)(layer)
        return model

    (eager, eager_next), (deferred, deferred_next) = eager_and_deferred(build)
    assert_same_state(eager, deferred)
    assert torch.equal(eager_next, deferred_next)


def test_geqrf_on_fakes_has_the_cpu_kernels_geometry():
    for shape in [(5, 4), (3, 5, 4), (4, 6), (2, 0, 3)]:
        real = torch.geqrf(torch.randn(*shape))
        with torchdefer.fake_mode():
            fake = torch.geqrf(torch.empty(*shape))
        for r, f in zip(real, fake):
            assert torchdefer.is_fake(f)
            assert (f.shape, f.stride(), f.dtype) == (r.shape, r.stride(), r.dtype), shape


class _MinMaxScaled(torch.nn.Module):
    """A parametrization whose right_inverse runs an op fakes cannot run (_aminmax has no meta
    kernel): eager uses right_inverse, so recording must not fall back to the identity."""

    def forward(self, x):
        return x * 2

    def right_inverse(self, x):
        low, high = torch._aminmax(x)
        return (x - low) / (high - low)


def test_a_refusal_inside_right_inverse_is_not_swallowed():
    def build():
        linear = torch.nn.Linear(3, 3)
        parametrize.register_parametrization(linear, "weight", _MinMaxScaled())
        return linear

    torch.manual_seed(0)
    build()  # eager runs it
    with pytest.raises(RuntimeError, match="aten::_aminmax cannot run on fake tensors") as error:
        torchdefer.deferred_init(build)
    assert not isinstance(error.value, NotImplementedError)


# Hugging Face resize_token_embeddings. Its cause of a "silent difference" was the repro's: the
# eager resize writes the new vocabulary size into the config object, so a second model built
# from that same config already has the resized vocabulary and its resize copies nothing. Built
# from equal configs, deferred_init gives eager's bits, whatever ran before in the process.

transformers = pytest.importorskip("transformers")


def tiny_config(arch):
    if arch == "llama":
        return transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=2, pad_token_id=62)
    return transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=32)


def causal_lm(arch):
    cls = transformers.LlamaForCausalLM if arch == "llama" else transformers.GPT2LMHeadModel
    return cls(tiny_config(arch))


def resized(arch, new_num_tokens, mean_resizing):
    model = causal_lm(arch)
    model.resize_token_embeddings(new_num_tokens, mean_resizing=mean_resizing)
    return model


def test_an_eager_resize_changes_the_config_it_was_built_from():
    config = tiny_config("llama")
    transformers.LlamaForCausalLM(config).resize_token_embeddings(80)
    assert config.vocab_size == 80  # a model built from `config` now starts at 80 rows


@pytest.mark.parametrize("arch", ["llama", "gpt2"])  # gpt2 ties lm_head to the embedding
@pytest.mark.parametrize("new_num_tokens", [80, 40])
@pytest.mark.parametrize("mean_resizing", [True, False])
def test_resize_token_embeddings_after_an_eager_resize_gives_eager_bits(arch, new_num_tokens,
                                                                         mean_resizing):
    transformers.logging.set_verbosity_error()
    torch.manual_seed(1)
    resized(arch, new_num_tokens, mean_resizing)  # an eager resize first, in this process
    (eager, eager_next), (deferred, deferred_next) = eager_and_deferred(
        resized, arch, new_num_tokens, mean_resizing)
    assert deferred.get_input_embeddings().weight.shape[0] == new_num_tokens
    assert_same_state(eager, deferred)
    assert torch.equal(eager_next, deferred_next)
    if arch == "gpt2":
        assert deferred.lm_head.weight is deferred.get_input_embeddings().weight


def test_resize_token_embeddings_after_deferred_init_returned():
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    eager = resized("llama", 80, mean_resizing=False)
    # Outside a recording the new nn.Embedding is real: copying fake rows into it is refused, and
    # the model keeps its embedding.
    refused = torchdefer.deferred_init(causal_lm, "llama")
    with pytest.raises(RuntimeError, match="would write into the real tensor"):
        refused.resize_token_embeddings(80, mean_resizing=False)
    assert refused.get_input_embeddings().weight.shape[0] == 64 and torchdefer.is_deferred(refused)
    # In a deferred() block it is recorded, and gives eager's bits.
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(causal_lm, "llama")
    with torchdefer.deferred():
        deferred.resize_token_embeddings(80, mean_resizing=False)
    torchdefer.materialize_module(deferred)
    assert_same_state(eager, deferred)


# Random ops given an explicit CPU torch.Generator (Note [Explicit generators]).


def with_own_generators(generators):
    g, h = generators
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 20))
    torch.nn.init.kaiming_uniform_(model[0].weight, generator=g)  # PEFT VeRA's call
    model[0].bias.data.normal_(0, 1, generator=g)  # 5 elements: counted by a run on scratch
    torch.nn.init.trunc_normal_(model[1].weight, std=0.5, generator=h)
    model.register_buffer("noise", torch.randn(4, 8, generator=g, dtype=torch.float64))
    rates = torch.rand(7) * 3  # default generator
    model.register_buffer("counts", torch.poisson(rates, generator=h))  # value-dependent sampler
    model.register_buffer("order", torch.randperm(9, generator=g))
    # A value read (a branch on drawn numbers) between draws.
    scale = 2.0 if torch.rand(3, generator=g).sum().item() > 1.5 else 0.5
    model[1].bias.data.uniform_(-scale, scale, generator=h)
    model.register_buffer("mask", torch.empty(16).bernoulli_(0.3, generator=g))
    return model


def generators(seed):
    return torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_explicit_generators_give_eager_bits_and_are_left_where_eager_leaves_them(seed):
    eager_generators, deferred_generators = generators(seed), generators(seed)
    torch.manual_seed(seed)
    eager = with_own_generators(eager_generators)
    eager_next = torch.rand(4)
    torch.manual_seed(seed)
    deferred = torchdefer.deferred_init(with_own_generators, deferred_generators)
    # Right after recording, as after eager construction.
    for e, d in zip(eager_generators, deferred_generators):
        assert torch.equal(e.get_state(), d.get_state())
    recorded_states = [d.get_state() for d in deferred_generators]
    for tensor in [deferred.order, deferred.noise, deferred[1].weight, deferred[0].weight]:
        torchdefer.materialize_tensor(tensor)  # any order
    torchdefer.materialize_module(deferred)
    deferred_next = torch.rand(4)
    assert_same_state(eager, deferred)
    assert torch.equal(eager_next, deferred_next)
    for before, d in zip(recorded_states, deferred_generators):
        assert torch.equal(before, d.get_state()), "materializing moved a user's generator"
    # The generators continue as eager's do.
    assert all(torch.equal(torch.rand(5, generator=e), torch.rand(5, generator=d))
               for e, d in zip(eager_generators, deferred_generators))


def test_explicit_generators_under_counter_mode_shards():
    torch.manual_seed(0)
    full = torchdefer.deferred_init(with_own_generators, generators(0))
    torchdefer.materialize_module(full, rng="counter")
    weights = []
    for rank in range(2):
        torch.manual_seed(0)
        part = torchdefer.deferred_init(with_own_generators, generators(0))
        torchdefer.materialize_module(part, shard=torchdefer.Shard(rank, 2))
        weights.append(part[0].weight)
    assert torch.equal(torch.cat(weights), full[0].weight)


def test_random_ops_on_a_deferred_model_with_an_explicit_generator_after_it_returned():
    torch.manual_seed(0)
    eager, g_eager = torch.nn.Linear(8, 8), torch.Generator().manual_seed(5)
    torch.nn.init.xavier_normal_(eager.weight, generator=g_eager)
    torch.manual_seed(0)
    deferred, g = torchdefer.deferred_init(torch.nn.Linear, 8, 8), torch.Generator().manual_seed(5)
    torch.nn.init.xavier_normal_(deferred.weight, generator=g)
    assert torch.equal(g.get_state(), g_eager.get_state())
    torchdefer.materialize_module(deferred)
    assert_same_state(eager, deferred)
