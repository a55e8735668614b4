"""Initialization run after deferred_init returned, written for eager PyTorch (issue 12 item 3).

torchtitan builds its model first and initializes it afterwards: ``m = Transformer(args);
m.init_weights()``, with ``torch.nn.init.trunc_normal_`` on every weight. With torchdefer the same
code runs on the recorded fakes: ``m = deferred_init(Transformer, args); m.init_weights();
materialize_module(m)`` gives eager's weights bit for bit (torch RNG mode) and the full counter
model's slices (counter mode, sharded), and every parameter is an ``nn.Parameter`` again once real
(Note [Handed-out fakes after deferred_init] in bindings/torchdefer/_stand_ins.py).
"""

from __future__ import annotations

import copy
import dataclasses
import io
import pickle
import threading
from typing import Optional

import pytest
import torch
import torchdefer
from torch import nn
from torch.nn.utils import parametrize
from torchdefer import _stand_ins as _after_return

from test_distributed import run_ranks
from test_torchdefer import bitwise_equal


# --- a small model written the way torchtitan writes its Llama ---------------------------------


@dataclasses.dataclass
class ModelArgs:
    dim: int = 32
    n_layers: int = 3
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab_size: int = 97
    multiple_of: int = 16
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 16
    depth_init: bool = True


def precompute_freqs_cis(dim: int, end: int, theta: float) -> torch.Tensor:
    inverse = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    positions = torch.arange(end, device=inverse.device)
    angles = torch.outer(positions, inverse).float()
    return torch.polar(torch.ones_like(angles), angles)  # complex64


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * head_dim, args.dim, bias=False)

    def init_weights(self, init_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=init_std)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, multiple_of: int):
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def init_weights(self, init_std: float) -> None:
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=0.02)
        for linear in (self.w2, self.w3):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=init_std)


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, 4 * args.dim, args.multiple_of)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        depth = layer_id + 1 if args.depth_init else args.n_layers
        self.weight_init_std = 0.02 / (2 * depth) ** 0.5

    def init_weights(self) -> None:
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        self.attention.init_weights(self.weight_init_std)
        self.feed_forward.init_weights(self.weight_init_std)


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.register_buffer("freqs_cis", self._precompute_freqs_cis(), persistent=True)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, args) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def _precompute_freqs_cis(self) -> torch.Tensor:
        return precompute_freqs_cis(self.args.dim // self.args.n_heads, self.args.max_seq_len * 2, self.args.rope_theta)

    def init_weights(self, buffer_device: Optional[torch.device] = None) -> None:
        buffer_device = buffer_device or self.freqs_cis.device
        with torch.device(buffer_device):
            self.freqs_cis = self._precompute_freqs_cis()
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers.values():
            layer.init_weights()
        self.norm.reset_parameters()
        final_out_std = self.args.dim**-0.5
        cutoff_factor = 3
        nn.init.trunc_normal_(
            self.output.weight,
            mean=0.0,
            std=final_out_std,
            a=-cutoff_factor * final_out_std,
            b=cutoff_factor * final_out_std,
        )


# --- helpers ------------------------------------------------------------------------------------


def assert_bitwise(expected: torch.nn.Module, actual: torch.nn.Module) -> None:
    expected_state, actual_state = expected.state_dict(), actual.state_dict()
    assert list(expected_state) == list(actual_state)
    for name, value in expected_state.items():
        assert not torchdefer.is_fake(actual_state[name]), name
        assert bitwise_equal(value, actual_state[name]), name


def assert_classes_are_what_the_model_built(model: torch.nn.Module) -> None:
    assert all(type(p) is nn.Parameter for p in model.parameters())
    assert all(type(b) is torch.Tensor for b in model.buffers())


def eager(seed: int, args: ModelArgs = ModelArgs()):
    torch.manual_seed(seed)
    model = Transformer(args)
    with torch.no_grad():  # as torchtitan's trainer calls it
        model.init_weights()
    return model, torch.rand(4)


def deferred(seed: int, args: ModelArgs = ModelArgs()) -> Transformer:
    torch.manual_seed(seed)
    model = torchdefer.deferred_init(Transformer, args)
    with torch.no_grad():
        model.init_weights()
    return model


# --- torchtitan's flow --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_init_weights_after_deferred_init_is_eagers_bits_and_leaves_eagers_generator(seed):
    expected, expected_next = eager(seed)
    model = deferred(seed)
    assert torchdefer.is_deferred(model)
    assert torchdefer.is_fake(model.output.weight) and not torchdefer.is_fake(model.freqs_cis)
    assert isinstance(model.output.weight, nn.Parameter)
    torchdefer.materialize_module(model)
    assert torch.equal(torch.rand(4), expected_next)
    assert_bitwise(expected, model)
    assert_classes_are_what_the_model_built(model)


def test_trunc_normal_after_return_is_one_recorded_operator():
    model = deferred(0)
    # The constructor's empty and kaiming uniform_, then the sampler as one operator: not its
    # normal_, rejection masks and where.
    steps = torchdefer.explain(model.output.weight).split(" → ")
    assert [step.split("(")[0] for step in steps] == ["empty", "uniform_", "trunc_normal_"]


def test_trunc_normal_under_a_torch_function_mode_is_the_same_operator():
    torch.manual_seed(1)
    expected = nn.Linear(4, 3)
    nn.init.trunc_normal_(expected.weight, std=0.5)
    torch.manual_seed(1)
    model = torchdefer.deferred_init(nn.Linear, 4, 3)
    with torch.device("cpu"):  # a mode that forwards the sampler's calls to the fake's class
        nn.init.trunc_normal_(model.weight, std=0.5)
    assert torchdefer.explain(model.weight).endswith("trunc_normal_(0, 0.5, -2, 2)")
    torchdefer.materialize_module(model)
    assert_bitwise(expected, model)


def test_init_std_by_layer_count_instead_of_depth_gives_the_same():
    args = ModelArgs(depth_init=False, n_layers=2)
    expected, expected_next = eager(5, args)
    model = deferred(5, args)
    torchdefer.materialize_module(model)
    assert torch.equal(torch.rand(4), expected_next)
    assert_bitwise(expected, model)


def test_context_manager_gives_the_same():
    expected, expected_next = eager(11)
    torch.manual_seed(11)
    with torchdefer.deferred() as block:
        model = Transformer(ModelArgs())
    assert block.modules == [model]
    with torch.no_grad():
        model.init_weights()
    torchdefer.materialize_module(model)
    assert torch.equal(torch.rand(4), expected_next)
    assert_bitwise(expected, model)
    assert_classes_are_what_the_model_built(model)


@pytest.mark.parametrize("world", [2, 3])
def test_shards_concatenate_to_the_full_counter_model(world):
    full = deferred(7)
    torchdefer.materialize_module(full, rng="counter")
    shards = []
    for rank in range(world):
        model = deferred(7)
        torchdefer.materialize_module(model, shard=torchdefer.Shard(rank, world))  # counter mode
        assert_classes_are_what_the_model_built(model)
        shards.append(dict(model.named_parameters()))
    for name, value in full.named_parameters():
        joined = torch.cat([shard[name].detach() for shard in shards])
        assert bitwise_equal(joined, value.detach()), name
    assert torch.equal(model.freqs_cis, full.freqs_cis)  # buffers stay whole


# --- every torch.nn.init function on a fake deferred_init returned ----------------------------

INIT_FUNCTIONS = {
    "uniform_": lambda t: nn.init.uniform_(t, -0.1, 0.2),
    "normal_": lambda t: nn.init.normal_(t, 0.1, 0.5),
    "trunc_normal_": lambda t: nn.init.trunc_normal_(t, std=0.02),
    "trunc_normal_ narrow": lambda t: nn.init.trunc_normal_(t, std=1.0, a=-0.3, b=0.3),
    "constant_": lambda t: nn.init.constant_(t, 0.3),
    "ones_": nn.init.ones_,
    "zeros_": nn.init.zeros_,
    "eye_": nn.init.eye_,
    "xavier_uniform_": nn.init.xavier_uniform_,
    "xavier_normal_": nn.init.xavier_normal_,
    "kaiming_uniform_": lambda t: nn.init.kaiming_uniform_(t, a=5**0.5),
    "kaiming_normal_": nn.init.kaiming_normal_,
    "orthogonal_": nn.init.orthogonal_,
    "sparse_": lambda t: nn.init.sparse_(t, 0.5),
}


@pytest.mark.parametrize("name", list(INIT_FUNCTIONS))
def test_each_init_function_after_return_gives_eagers_bits(name):
    init = INIT_FUNCTIONS[name]
    build = lambda: nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 40))  # noqa: E731
    torch.manual_seed(3)
    expected = build()
    for layer in expected:
        init(layer.weight)
    expected_next = torch.rand(3)
    torch.manual_seed(3)
    model = torchdefer.deferred_init(build)
    for layer in model:
        init(layer.weight)
    torchdefer.materialize_module(model)
    assert torch.equal(torch.rand(3), expected_next)
    assert_bitwise(expected, model)
    assert_classes_are_what_the_model_built(model)


def test_trunc_normal_of_data_and_of_a_bfloat16_parameter():
    def build():
        layer = nn.Linear(8, 8).to(torch.bfloat16)
        layer.register_buffer("scale", torch.empty(8))
        return layer

    def init(layer):
        nn.init.trunc_normal_(layer.weight.data, std=0.5, a=-0.4, b=0.9)
        nn.init.trunc_normal_(layer.bias, std=2.0)
        nn.init.trunc_normal_(layer.scale, mean=1.0, std=0.1)

    torch.manual_seed(4)
    expected = build()
    init(expected)
    torch.manual_seed(4)
    model = torchdefer.deferred_init(build)
    init(model)
    torchdefer.materialize_module(model)
    assert_bitwise(expected, model)
    assert_classes_are_what_the_model_built(model)


# --- what the handed-out class changes, and when it goes ----------------------------------------


def test_the_class_is_a_subclass_until_real_and_every_materialization_restores_it():
    model = torchdefer.deferred_init(Transformer, ModelArgs(n_layers=1))
    weight, freqs = model.output.weight, model.freqs_cis
    assert isinstance(weight, nn.Parameter) and type(weight) is not nn.Parameter
    assert isinstance(freqs, torch.Tensor) and not isinstance(freqs, nn.Parameter)
    # Fakes computed from it are handed out too (Note [Fakes computed after deferred_init
    # returned]); real results of operations are plain tensors.
    assert type(weight.t()) is _after_return.DeferredTensor
    assert type(weight * 2) is _after_return.DeferredTensor
    assert type((weight > 0).nonzero()) is torch.Tensor and not torchdefer.is_fake((weight > 0).nonzero())
    torchdefer.materialize_tensor(weight)
    assert type(weight) is nn.Parameter and type(freqs) is not torch.Tensor
    torchdefer.materialize_module(model.layers)
    assert_classes_are_what_the_model_built(model.layers)
    assert type(model.tok_embeddings.weight) is not nn.Parameter  # still fake
    torchdefer.materialize_module(model)
    assert_classes_are_what_the_model_built(model)
    assert not torch.overrides.has_torch_function((weight,))

    from torchdefer import compat

    other = torchdefer.deferred_init(Transformer, ModelArgs(n_layers=1))
    compat.materialize_module(other)
    assert_classes_are_what_the_model_built(other)


def test_a_failed_materialization_keeps_the_class_and_the_fake():
    model = deferred(0, ModelArgs(n_layers=1))
    with pytest.raises(RuntimeError):
        torchdefer.materialize_module(model, device="cuda:99" if torch.cuda.is_available() else "cuda")
    assert torchdefer.is_fake(model.output.weight) and type(model.output.weight) is not nn.Parameter
    torchdefer.materialize_module(model)
    assert_classes_are_what_the_model_built(model)


def test_parameter_of_a_handed_out_fake_is_a_parameter_and_ends_as_one():
    torch.manual_seed(2)
    expected = nn.Linear(4, 3)
    expected.tied = nn.Parameter(expected.weight)
    nn.init.trunc_normal_(expected.tied, std=0.1)
    torch.manual_seed(2)
    model = torchdefer.deferred_init(nn.Linear, 4, 3)
    model.tied = nn.Parameter(model.weight)
    assert isinstance(model.tied, nn.Parameter) and "tied" in dict(model.named_parameters())
    nn.init.trunc_normal_(model.tied, std=0.1)
    torchdefer.materialize_module(model)
    assert_bitwise(expected, model)
    assert type(model.tied) is nn.Parameter and "_is_param" not in vars(model.tied)


@pytest.mark.parametrize("device", ["cpu", "cuda"])  # a fake CUDA tensor needs no GPU
def test_new_tensor_and_new_on_a_handed_out_fake_are_recorded_fakes(device):
    model = torchdefer.deferred_init(nn.Linear, 4, 3, dtype=torch.float64, device=device)
    made = model.weight.new_tensor([1.5, 2.5])
    sized = model.weight.new(2, 3)
    assert torchdefer.is_fake(made) and made.dtype == torch.float64 and made.device.type == device
    assert torchdefer.is_fake(sized) and sized.shape == (2, 3) and sized.device.type == device
    assert torchdefer.materialize_tensor(made, device="cpu").tolist() == [1.5, 2.5]


def test_nothing_is_left_active_and_other_tensors_see_nothing():
    model = deferred(0, ModelArgs(n_layers=1))
    assert not torch.overrides._get_current_function_mode_stack()
    assert not torch.overrides.has_torch_function((torch.ones(1), nn.Parameter(torch.ones(1))))
    # Another thread initializes the same handed-out fakes the same way.
    errors = []

    def init():
        try:
            nn.init.trunc_normal_(model.layers["0"].attention.wq.weight, std=0.02)
        except Exception as error:  # reported below
            errors.append(error)

    thread = threading.Thread(target=init)
    thread.start()
    thread.join()
    assert not errors
    assert torchdefer.explain(model.layers["0"].attention.wq.weight).count("trunc_normal_(") == 2


# --- what other code does with a handed-out fake before it is real ------------------------------
#
# Each of these worked on deferred_init's fakes before they carried a class of their own; they
# give the same model now, and every tensor ends with the class eager gives it.


class Symmetric(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.triu() + x.triu(1).transpose(-1, -2)


class Halved(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def right_inverse(self, x: torch.Tensor) -> torch.Tensor:
        return x / 2


class WithBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.other = nn.Linear(4, 4, bias=False)
        self.register_buffer("running", torch.randn(4))
        self.marked = nn.Buffer(torch.rand(2))  # a Buffer: isinstance(t, nn.Buffer) holds


def _a_checkpoint() -> dict:
    torch.manual_seed(123)
    return WithBuffers().state_dict()


def _register_elsewhere(model: nn.Module) -> None:
    model.other.register_parameter("shared", model.lin.weight)


EDITS = {
    "parametrize": lambda m: parametrize.register_parametrization(m.lin, "weight", Symmetric()),
    "parametrize with right_inverse": lambda m: parametrize.register_parametrization(
        m.other, "weight", Halved()
    ),
    "weight_norm": lambda m: nn.utils.parametrizations.weight_norm(m.lin),
    "spectral_norm": lambda m: nn.utils.parametrizations.spectral_norm(m.other),  # draws u and v
    "to float64": lambda m: m.to(torch.float64),
    "half": lambda m: m.half(),
    "register_parameter": _register_elsewhere,
    "tie": lambda m: setattr(m.other, "weight", m.lin.weight),
    "load_state_dict": lambda m: m.load_state_dict(_a_checkpoint()),
    "load_state_dict assign, in part": lambda m: m.load_state_dict(
        {"lin.weight": _a_checkpoint()["lin.weight"]}, strict=False, assign=True
    ),
}


def classes(model: nn.Module):
    return [(n, type(t)) for n, t in (*model.named_parameters(), *model.named_buffers())]


@pytest.mark.parametrize("name", list(EDITS))
def test_module_edits_before_materializing_give_eagers_model_and_classes(name):
    torch.manual_seed(6)
    expected = WithBuffers()
    EDITS[name](expected)
    expected_next = torch.rand(3)
    torch.manual_seed(6)
    model = torchdefer.deferred_init(WithBuffers)
    EDITS[name](model)
    def kinds(m):
        return [(n, isinstance(t, nn.Parameter)) for n, t in m.state_dict(keep_vars=True).items()]

    assert kinds(model) == kinds(expected)
    torchdefer.materialize_module(model)
    assert torch.equal(torch.rand(3), expected_next)
    assert_bitwise(expected, model)
    assert classes(model) == classes(expected)


def test_state_dict_before_materializing_has_eagers_keys_and_values():
    torch.manual_seed(4)
    expected = WithBuffers()
    torch.manual_seed(4)
    model = torchdefer.deferred_init(WithBuffers)
    state = model.state_dict()
    assert list(state) == list(expected.state_dict())
    # Detached fakes, computed from the handed-out ones: they read eager's values as those do.
    assert all(isinstance(v, torch.Tensor) and torchdefer.is_fake(v) for v in state.values())
    assert [v.tolist() for v in state.values()] == [v.tolist() for v in expected.state_dict().values()]
    assert type(torchdefer.materialize_tensor(state["running"])) is torch.Tensor
    kept = model.state_dict(keep_vars=True)
    assert kept["lin.weight"] is model.lin.weight and kept["running"] is model.running
    def buffer_checks(m):
        return [isinstance(t, nn.Buffer) for t in (m.running, m.marked, m.lin.weight)]

    assert buffer_checks(model) == buffer_checks(expected) == [False, True, False]
    torchdefer.materialize_module(model)
    assert buffer_checks(model) == buffer_checks(expected)


def test_copies_and_rebuilds_of_a_parameter_are_nn_parameters_as_before():
    torch.manual_seed(8)
    expected = copy.deepcopy(nn.Linear(4, 3))
    torch.manual_seed(8)
    copied = copy.deepcopy(torchdefer.deferred_init(nn.Linear, 4, 3))
    # A copy of a deferred model is a deferred model (Note [Deep copies after deferred_init
    # returned]): its fakes are handed out, and an nn.Parameter once real.
    assert isinstance(copied.weight, nn.Parameter) and torchdefer.is_fake(copied.weight)
    torchdefer.materialize_module(copied)
    assert_bitwise(expected, copied)
    assert type(copied.weight) is nn.Parameter
    # accelerate's set_module_tensor_to_device rebuilds a parameter as type(p)(value).
    from accelerate.utils import set_module_tensor_to_device

    model = torchdefer.deferred_init(nn.Linear, 4, 3)
    rebuilt = type(model.weight)(torch.ones(2), requires_grad=False)
    assert type(rebuilt) is nn.Parameter and not rebuilt.requires_grad
    set_module_tensor_to_device(model, "weight", "cpu", value=torch.ones(3, 4))
    assert type(model.weight) is nn.Parameter and not torchdefer.is_fake(model.weight)
    torchdefer.materialize_module(model)
    assert torch.equal(model.weight, torch.ones(3, 4)) and type(model.bias) is nn.Parameter


def test_a_handed_out_fake_made_real_in_place_gets_its_class_back():
    model = torchdefer.deferred_init(WithBuffers)
    model.lin.weight.data = torch.ones(4, 4)
    model.running.data = torch.zeros(4)
    assert type(model.lin.weight) is nn.Parameter and type(model.running) is torch.Tensor
    assert not torchdefer.is_fake(model.lin.weight) and torchdefer.is_fake(model.lin.bias)
    torchdefer.materialize_module(model)
    assert torch.equal(model.lin.weight, torch.ones(4, 4))
    assert_classes_are_what_the_model_built(model)


def test_pickling_fake_buffers_fails_and_says_to_materialize():
    model = torchdefer.deferred_init(WithBuffers)
    for attempt in (lambda: torch.save(model, io.BytesIO()), lambda: pickle.dumps(model)):
        with pytest.raises(RuntimeError, match=r"pickling fake Float\[4\] on cpu.*Materialize the module"):
            attempt()
    assert torchdefer.is_fake(model.running) and type(model.running) is not torch.Tensor


_HOOKS_AND_OPTIMIZER = """
import torch, torchdefer
from torch import nn
torch.manual_seed(0)
expected = nn.Linear(4, 3)
torch.manual_seed(0)
model = torchdefer.deferred_init(nn.Linear, 4, 3)
calls = []
model.register_forward_hook(lambda module, inputs, output: calls.append("forward"))
model.weight.register_hook(lambda grad: grad * 2)
model.weight.register_post_accumulate_grad_hook(lambda p: calls.append("accumulated"))
optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
torchdefer.materialize_module(model)
x = torch.randn(2, 4)
model(x).sum().backward()
expected(x).sum().backward()
assert calls == ["forward", "accumulated"], calls
assert torch.equal(model.weight.grad, 2 * expected.weight.grad)
optimizer.step()
assert optimizer.param_groups[0]["params"][0] is model.weight
assert torch.equal(model.weight, expected.weight.detach() - 2 * expected.weight.grad)
"""


def test_hooks_and_optimizers_set_up_before_materializing_see_the_real_parameters():
    # In a child process: a backward pass starts autograd's threads, and the distributed tests
    # later in this process fork ranks, which autograd's threads forbid.
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _HOOKS_AND_OPTIMIZER], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def test_hugging_face_tie_weights_and_init_weights_after_deferred_init():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(3)
    expected = GPT2LMHeadModel(config)
    expected.tie_weights()
    expected.init_weights()
    torch.manual_seed(3)
    model = torchdefer.deferred_init(GPT2LMHeadModel, config)
    model.tie_weights()
    model.init_weights()
    assert model.lm_head.weight is model.transformer.wte.weight
    torchdefer.materialize_module(model)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert_bitwise(expected, model)
    assert classes(model) == classes(expected)


def test_a_torch_function_mode_of_the_users_sees_the_class_of_handed_out_fakes():
    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.extend(types)
            return func(*args, **(kwargs or {}))

    model = torchdefer.deferred_init(nn.Linear, 4, 3)
    with Spy():
        doubled = model.weight * 2
        tripled = doubled * 1.5
    assert seen == [_after_return.DeferredParameter, _after_return.DeferredTensor]
    assert type(tripled) is _after_return.DeferredTensor and torchdefer.is_fake(tripled)


# --- FSDP2 after init_weights -------------------------------------------------------------------


def fsdp2_worker(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    reference = deferred(9)
    torchdefer.materialize_module(reference, rng="counter")
    model = deferred(9)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    torchdefer.materialize_module(model)  # counter mode: the module holds DTensors
    assert not torchdefer.is_deferred(model)
    expected = dict(reference.named_parameters())
    for name, value in model.named_parameters():
        assert isinstance(value, DTensor) and isinstance(value, nn.Parameter), name
        assert bitwise_equal(value.full_tensor().detach(), expected[name].detach()), name
    assert torch.equal(model.freqs_cis, reference.freqs_cis)


def test_fully_shard_after_init_weights_gives_the_full_counter_model(tmp_path):
    run_ranks(tmp_path, 2, fsdp2_worker)
