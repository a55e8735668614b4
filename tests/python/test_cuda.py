"""The GPU path: counter mode on CUDA gives the CPU counter fill's bits, whole and sharded, with
GPU memory bounded by the shard; torch mode gives eager construction's bits on CUDA (CUDA's
generator, Note [Torch-mode draws on CUDA]) or, with cuda_draws="cpu", eager's CPU bits. These need
a CUDA device and run on the GPU machine (docs/gpu.md); without one they are skipped."""

import math
import os
import subprocess
import sys

import pytest
import torch
import torchdefer

from test_torchdefer import bitwise_equal

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
FLOAT_INITS = {
    "uniform": lambda t: t.uniform_(-0.7, 1.3),
    "normal": lambda t: t.normal_(0.25, 2.0),
    # torchdefer's truncated normal operator, device-independent in counter mode (its own erf and
    # erfinv). torch 2.13's nn.init.trunc_normal_ records as this operator; 2.11's records its
    # erfinv_ as an op of its own, which runs on the materialization device.
    "trunc_normal": lambda t: torch.ops.torchdefer.trunc_normal_(t, 0.0, 0.02, -0.04, 0.04),
    # torchtitan's bounds: the uniform reaches ±1, erfinv's tail polynomials and its infinities.
    "trunc_normal_wide": lambda t: torch.ops.torchdefer.trunc_normal_(t, 0.0, 0.02, -2.0, 2.0),
    "bernoulli": lambda t: t.bernoulli_(0.3),
    "exponential": lambda t: t.exponential_(1.5),
    "log_normal": lambda t: t.log_normal_(0.1, 0.5),
    "cauchy": lambda t: t.cauchy_(0.0, 1.0),
    "geometric": lambda t: t.geometric_(0.2),
    "random": lambda t: t.random_(0, 1000),
}
INT_INITS = {
    "random_range": lambda t: t.random_(-50, 5000),
    "random_default": lambda t: t.random_(),
    "bernoulli": lambda t: t.bernoulli_(0.6),
}
# Odd sizes so that no kernel's block or vector width divides them; the large one spans many
# thread blocks and several Philox blocks per thread.
SHAPES = [(3,), (37, 129), (1 << 20) + 7]


class Holder(torch.nn.Module):
    def __init__(self, shape, dtype, init):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
        init(self.weight.data)


def counter_values(shape, dtype, init, device, shard=None, seed=7):
    torch.manual_seed(seed)
    module = torchdefer.deferred_init(Holder, shape, dtype, init)
    torchdefer.materialize_module(module, device=device, rng="counter", shard=shard)
    assert module.weight.device.type == torch.device(device).type
    return module.weight.detach().cpu()


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(FLOAT_INITS))
def test_counter_fill_on_cuda_has_the_cpu_bits_for_float_dtypes(name, dtype, shape):
    init = FLOAT_INITS[name]
    assert bitwise_equal(counter_values(shape, dtype, init, "cuda"), counter_values(shape, dtype, init, "cpu"))


INT_CASES = [(name, dtype) for name in sorted(INT_INITS)
             for dtype in [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
             if not (dtype in (torch.bool, torch.uint8, torch.int8) and name == "random_range")]


@pytest.mark.parametrize("name,dtype", INT_CASES, ids=str)
def test_counter_fill_on_cuda_has_the_cpu_bits_for_integer_dtypes(name, dtype):
    init = INT_INITS[name]
    for shape in SHAPES:
        assert bitwise_equal(counter_values(shape, dtype, init, "cuda"), counter_values(shape, dtype, init, "cpu"))


@pytest.mark.parametrize("world", [2, 3, 7])
def test_a_shard_on_cuda_is_the_cpu_shard(world):
    init = FLOAT_INITS["trunc_normal"]
    for rank in range(world):
        shard = torchdefer.Shard(rank, world)
        cuda = counter_values((1001, 67), torch.bfloat16, init, "cuda", shard)
        cpu = counter_values((1001, 67), torch.bfloat16, init, "cpu", shard)
        assert bitwise_equal(cuda, cpu), rank


# A column shard is rows of the global shape, each at its own place relative to a 16-byte boundary
# of GPU memory, so the kernel writes every row's partial head and tail pieces element by element
# and the rest with 16-byte stores (Note [CUDA counter fill tiles]).
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.uint8], ids=str)
@pytest.mark.parametrize("world", [3, 7])
def test_a_column_shard_on_cuda_is_the_cpu_shard(world, dtype):
    init = INT_INITS["random_default"] if dtype == torch.uint8 else FLOAT_INITS["normal"]
    for rank in range(world):
        shard = torchdefer.Shard(rank, world, dim=1)
        cuda = counter_values((37, 1031), dtype, init, "cuda", shard)
        cpu = counter_values((37, 1031), dtype, init, "cpu", shard)
        assert bitwise_equal(cuda, cpu), rank


class Llama(torch.nn.Module):
    def __init__(self, vocab=1000, dim=256, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            block = torch.nn.ModuleDict({
                "qkv": torch.nn.Linear(dim, 3 * dim, bias=False),
                "out": torch.nn.Linear(dim, dim, bias=False),
                "up": torch.nn.Linear(dim, 4 * dim, bias=False),
                "down": torch.nn.Linear(4 * dim, dim, bias=False),
                "norm": torch.nn.RMSNorm(dim),
            })
            self.blocks.append(block)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim)))
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers)
                torch.ops.torchdefer.trunc_normal_(p, 0.0, std, -3 * std, 3 * std)


def state_of(module):
    return {k: v.detach().cpu() for k, v in (dict(module.named_parameters()) | dict(module.named_buffers())).items()}


def test_a_model_materialized_on_cuda_in_counter_mode_is_the_cpu_model():
    torch.manual_seed(11)
    on_cuda = torchdefer.deferred_init(Llama)
    torchdefer.materialize_module(on_cuda, device="cuda", rng="counter")
    torch.manual_seed(11)
    on_cpu = torchdefer.deferred_init(Llama)
    torchdefer.materialize_module(on_cpu, rng="counter")
    assert all(t.device.type == "cuda" for t in on_cuda.parameters())
    # The parameters are drawn: the same bits on every device. The inv_freq buffer is arithmetic
    # (pow) that runs on the materialization device, as it would in eager construction there.
    cpu_parameters = dict(on_cpu.named_parameters())
    for name, value in on_cuda.named_parameters():
        assert bitwise_equal(value.detach().cpu(), cpu_parameters[name].detach()), name


def test_a_shard_on_cuda_allocates_the_shard_and_bounded_temporaries():
    world = 8
    torch.manual_seed(5)
    model = torchdefer.deferred_init(Llama, 32000, 1024, 2)
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    stats = torchdefer.materialize_module(model, device="cuda", shard=torchdefer.Shard(0, world))
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before
    peak = torch.cuda.max_memory_allocated() - before
    assert kept <= full_bytes / world * 1.05 + (1 << 20), (kept, full_bytes)
    assert peak <= kept * 1.05 + (1 << 20), (peak, kept)
    assert sum(s["bytes_computed"] for s in stats) == sum(s["bytes_kept"] for s in stats)


TORCH_MODE_INITS = {
    "uniform": lambda t: t.uniform_(-0.7, 1.3),
    "normal": lambda t: t.normal_(0.25, 2.0),
    "bernoulli": lambda t: t.bernoulli_(0.3),
    "exponential": lambda t: t.exponential_(1.5),
    "random": lambda t: t.random_(0, 100),
}


class Mixed(torch.nn.Module):
    """Every op of TORCH_MODE_INITS on a few sizes and dtypes, factories and a dropout mask: draws
    and arithmetic that is exact on every device (Note [Torch-mode draws run on the CPU])."""

    def __init__(self):
        super().__init__()
        self.params = torch.nn.ParameterList()
        for i, (name, init) in enumerate(sorted(TORCH_MODE_INITS.items())):
            for j, shape in enumerate([(5,), (33, 17), (257, 1031)]):
                dtype = DTYPES[(i + j) % len(DTYPES)]
                p = torch.nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
                init(p.data)
                self.params.append(p)
        self.noise = torch.nn.Parameter(torch.randn(300, 7) + torch.rand(300, 7))
        self.register_buffer("mask", torch.nn.functional.dropout(torch.ones(4097), 0.25))


def eager_cpu_state(seed):
    torch.manual_seed(seed)
    return state_of(Mixed())


@pytest.mark.parametrize("recorded_on", ["cuda", "cpu"])
def test_torch_mode_on_cuda_from_the_cpu_generator_gives_eagers_cpu_bits(recorded_on):
    """Note [Torch-mode draws run on the CPU]: recorded with torch.device("cuda") and
    cuda_draws="cpu", or on the CPU, and materialized with device="cuda", the values are eager
    construction's on the CPU."""
    for seed in [0, 3]:
        expected = eager_cpu_state(seed)
        torch.manual_seed(seed)
        with torch.device(recorded_on):
            deferred = torchdefer.deferred_init(Mixed, cuda_draws="cpu")
        torchdefer.materialize_module(deferred, device="cuda")
        assert all(p.device.type == "cuda" for p in deferred.parameters())
        got = state_of(deferred)
        for name, value in expected.items():
            assert bitwise_equal(got[name], value), (seed, name)


def test_torch_mode_on_cuda_from_the_cpu_generator_in_reverse_order_gives_eagers_cpu_bits():
    expected = eager_cpu_state(1)
    torch.manual_seed(1)
    with torch.device("cuda"):
        deferred = torchdefer.deferred_init(Mixed, cuda_draws="cpu")
    for p in reversed(list(deferred.params)):
        holder = torch.nn.Module()
        holder.p = p
        torchdefer.materialize_module(holder)
    torchdefer.materialize_module(deferred)
    got = state_of(deferred)
    for name, value in expected.items():
        assert bitwise_equal(got[name], value), name


# Note [Torch-mode draws on CUDA]: recorded on CUDA's generator (the default with a GPU), torch
# mode gives eager construction on the GPU, in any order, and leaves CUDA's generator where eager
# leaves it; the CPU generator is left alone, as eager on the GPU leaves it.


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, groups=2), torch.nn.BatchNorm2d(64), torch.nn.ReLU())
        self.classifier = torch.nn.Linear(64 * 9, 10)


class MoE(torch.nn.Module):
    """Experts drawn with normal_, a router with nn.init.trunc_normal_, a randperm buffer and a
    dropout mask (ops whose increment only their run tells) between them."""

    def __init__(self, experts=6, dim=96):
        super().__init__()
        self.router = torch.nn.Linear(dim, experts, bias=False)
        torch.nn.init.trunc_normal_(self.router.weight, std=0.02)
        self.register_buffer("order", torch.randperm(experts))
        self.experts = torch.nn.ModuleList(torch.nn.Linear(dim, 2 * dim) for _ in range(experts))
        for expert in self.experts:
            torch.nn.init.normal_(expert.weight, std=0.02)
        self.register_buffer("mask", torch.nn.functional.dropout(torch.ones(999), 0.1))
        self.gate = torch.nn.Parameter(torch.randn(experts, dim, dtype=torch.float64))


class ForksAndReseeds(torch.nn.Module):
    """Moves of CUDA's generator while a sampler is owed (Note [Marks of an owed CUDA generator]):
    a fork_rng that restores it around a draw, and a reseed to the seed construction started from
    after a first op that was a sampler."""

    def __init__(self, seed=4):
        super().__init__()
        self.first = torch.nn.Parameter(torch.randperm(10).float())
        with torch.random.fork_rng(devices=[torch.cuda.current_device()]):
            self.inside = torch.nn.Parameter(torch.randn(100))
        self.after = torch.nn.Parameter(torch.randn(100))  # eager: `inside` again
        torch.manual_seed(seed)
        self.again = torch.nn.Parameter(torch.randperm(10).float())  # eager: `first` again
        self.last = torch.nn.Parameter(torch.empty(33, 7).uniform_())


CUDA_MODELS = {"llama": Llama, "convnet": ConvNet, "moe": MoE, "mixed": Mixed, "forks": ForksAndReseeds}


def eager_on_cuda(build, seed):
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = build()
    return state_of(model), torch.cuda.get_rng_state(), torch.get_rng_state()


def deferred_on_cuda(build, seed):
    torch.manual_seed(seed)
    with torch.device("cuda"):
        return torchdefer.deferred_init(build)


def materialized_in(model, order):
    if order == "children first":
        for module in reversed(list(model.modules())):
            holder = torch.nn.Module()
            for i, p in enumerate(module.parameters(recurse=False)):
                holder.register_parameter(f"p{i}", p)
            torchdefer.materialize_module(holder)
    elif order == "one tensor at a time, last first":
        for tensor in reversed(list(model.parameters()) + list(model.buffers())):
            if torchdefer.is_fake(tensor):
                torchdefer.materialize_tensor(tensor)
    torchdefer.materialize_module(model)
    return state_of(model)


@pytest.mark.parametrize("order", ["whole", "children first", "one tensor at a time, last first"])
@pytest.mark.parametrize("name", sorted(CUDA_MODELS))
def test_torch_mode_on_cuda_gives_eager_construction_on_cuda(name, order):
    expected, cuda_state, cpu_state = eager_on_cuda(CUDA_MODELS[name], 4)
    deferred = deferred_on_cuda(CUDA_MODELS[name], 4)
    assert torch.equal(torch.get_rng_state(), cpu_state), "the CPU generator moved"
    got = materialized_in(deferred, order)
    assert all(t.device.type == "cuda" for t in got.values())
    for key, value in expected.items():
        assert bitwise_equal(got[key], value), key
    assert torch.equal(torch.cuda.get_rng_state(), cuda_state)


def distribution_kernel_fills():
    """Every op the op table marks CudaDrawRule::kDistributionKernel, sizes around a capped
    launch's rounds (1056 blocks of 256 on an H100 SXM or an H200: 1,081,344 elements per round of
    four), every float dtype, a strided view, complex, empty, and tensors whose offsets need more
    than 32 bits (ATen then launches each half on its own)."""
    fills = [
        ("uniform_ float32 2^29+5", lambda: torch.empty((1 << 29) + 5).uniform_()),
        ("uniform_ float64 2^28+3", lambda: torch.empty((1 << 28) + 3, dtype=torch.float64).uniform_()),
        ("exponential_ transposed", lambda: torch.empty(64, 1000).t().exponential_()),
        ("bernoulli_ column slice", lambda: torch.empty(4096, 4096)[:, :1000].bernoulli_(0.5)),
        ("bernoulli_ float64", lambda: torch.empty(3000, dtype=torch.float64).bernoulli_(0.5)),
        ("bernoulli p", lambda: torch.bernoulli(torch.zeros(5000), p=0.3)),
        ("randn complex64", lambda: torch.randn(17, 33, dtype=torch.complex64)),
        ("rand empty", lambda: torch.rand(0)),
        ("rand_like", lambda: torch.rand_like(torch.zeros(2000, 3, dtype=torch.float16))),
        ("randn_like", lambda: torch.randn_like(torch.zeros(2000, 3, dtype=torch.float64))),
        ("cauchy_", lambda: torch.empty(3001).cauchy_()),
        ("log_normal_", lambda: torch.empty(3001, dtype=torch.bfloat16).log_normal_()),
        ("geometric_ int64", lambda: torch.empty(3001, dtype=torch.int64).geometric_(0.3)),
        ("geometric_ float64", lambda: torch.empty(3001, dtype=torch.float64).geometric_(0.3)),
        ("normal(Tensor, Tensor)", lambda: torch.normal(torch.zeros(777, 3), torch.ones(777, 3))),
        ("normal(float, Tensor)", lambda: torch.normal(0.5, torch.ones(4099))),
        ("normal(float, float, size)", lambda: torch.normal(0.0, 1.0, size=(1081345,))),
    ]
    for n in [1, 255, 256, 257, 1081343, 1081344, 1081345, 5_000_001]:
        for dtype in DTYPES:
            fills.append((f"normal_ {dtype} {n}", lambda n=n, dtype=dtype: torch.empty(n, dtype=dtype).normal_()))
    return fills


@pytest.mark.parametrize("name,fill", distribution_kernel_fills(), ids=lambda x: x if isinstance(x, str) else "")
def test_recording_a_distribution_kernel_moves_cudas_generator_as_eager_does(name, fill):
    torch.cuda.init()  # default_generators is empty until then
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    torch.manual_seed(0)
    with torch.device("cuda"):
        fill()
    eager = generator.get_offset()
    torch.cuda.empty_cache()
    torch.manual_seed(0)
    with torch.device("cuda"):
        torchdefer.deferred_init(fill)
    assert generator.get_offset() == eager, name


def test_recording_on_cudas_generator_creates_no_cuda_context():
    """Asked of the driver: whether device 0's primary context is active after a recording that
    drew from CUDA's generator (uniform_, and trunc_normal_: a sampler under torch 2.13, a
    distribution kernel and arithmetic under 2.11)."""
    program = (
        "import ctypes, torch, torchdefer\n"
        "torch.manual_seed(0)\n"
        "with torch.device('cuda'):\n"
        "    m = torchdefer.deferred_init(torch.nn.Linear, 64, 64, cuda_draws='cuda')\n"
        "    torch.nn.init.trunc_normal_(m.weight)\n"
        "driver = ctypes.CDLL('libcuda.so.1')\n"
        "device, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()\n"
        "assert driver.cuInit(0) == 0 and driver.cuDeviceGet(ctypes.byref(device), 0) == 0\n"
        "assert driver.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(active)) == 0\n"
        "print(active.value)\n")
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "0", run.stdout + run.stderr


def test_a_cuda_draw_between_recording_and_materializing_warns_and_the_model_stays_eagers(capfd):
    expected, _, _ = eager_on_cuda(MoE, 2)
    deferred = deferred_on_cuda(MoE, 2)
    torch.rand(3, device="cuda")
    got = materialized_in(deferred, "whole")
    # Said by the C++ library, which writes to stderr with the GIL released.
    assert "was drawn from while it still owed" in capfd.readouterr().err
    for key, value in expected.items():
        assert bitwise_equal(got[key], value), key


def test_the_fsdp2_example_over_nccl_has_the_single_process_counter_weights(tmp_path):
    examples = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
    initial = tmp_path / "initial.pt"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(torch.cuda.device_count()),
               os.path.join(examples, "llama_fsdp2.py"), "--steps", "2", "--seed", "3",
               "--save-initial", str(initial)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    sys.path.insert(0, examples)
    from llama import Config, Llama as ExampleLlama

    torch.manual_seed(3)
    reference = torchdefer.deferred_init(ExampleLlama, Config())
    torchdefer.materialize_module(reference, rng="counter", device="cuda")  # the ranks' device math
    expected = state_of(reference)
    state = torch.load(initial)
    assert state.keys() == expected.keys()
    for name, value in state.items():
        assert bitwise_equal(value.cpu(), expected[name]), name
