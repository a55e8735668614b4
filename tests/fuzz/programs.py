"""Random init programs: seeded generators of nn.Module constructors, printed as Python source.

A program is the source of one module class, ``M``, whose ``__init__`` is a sequence of
*snippets*, and of a function ``after(m)`` that the checks run on the model once it is built (on
the eager model, and on the deferred one after deferred_init returned, before materializing it):
what training code does between building a model and materializing it (init_weights, deep copies,
value reads). Each snippet comes from one *family*: a kind of construction code that model code
runs and that deferred_init must record exactly (docs/fuzzing.md lists them with the issue class
each one exercises); a snippet may add lines to ``after`` too. The program is a pure function of ``(seed, families)``: the same pair always
prints the same source, so a failure is reproduced from the seed and the family list alone, and
the printed source is a self-contained reproducer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Sequence, Tuple

HEADER = """import copy
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class Shifted(nn.Module):
    \"\"\"A parametrization with a right_inverse (the parametrizations family).\"\"\"

    def forward(self, x):
        return x + 1

    def right_inverse(self, x):
        return x - 1


class Scale(nn.Module):
    \"\"\"A module with parameters and a buffer of its own, and its own init (the trainer_flows family).\"\"\"

    def __init__(self, n, k):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(n))
        self.table = nn.Parameter(torch.empty(n, k))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.ones_(self.scale)
        nn.init.normal_(self.table, std=0.5)
        self.steps.zero_()


# Every torch.Generator the program makes with make_generator, in order: the checks compare their
# states with eager's (after construction, after after(m), after materializing).
GENERATORS = []


def make_generator(seed):
    g = torch.Generator().manual_seed(seed)
    GENERATORS.append(g)
    return g
"""

FLOAT_DTYPES = ["torch.float32", "torch.float64", "torch.bfloat16", "torch.float16"]


@dataclass
class Context:
    """What the snippets of one program share: fresh names and the parameters made so far."""

    rng: random.Random
    counter: int = 0
    # Attribute paths of 2-d floating parameters (e.g. "self.c0.weight"), for snippets that
    # alias tensors an earlier snippet made.
    matrices: List[str] = field(default_factory=list)
    # The body of after(m), run on the built model (the module is `m` there).
    after: List[str] = field(default_factory=list)
    # (tensor name as named_tensors gives it, a, b) for tensors whose last write is a
    # trunc_normal_(..., a=a, b=b): the counter check requires their values within [a, b].
    bounds: List[Tuple[str, float, float]] = field(default_factory=list)
    # Whether after(m) empties and writes the whole model again (to_empty on the root).
    after_rewrites_all: bool = False
    # Names of tensors that must be fake when deferred_init returns: made by a to_empty inside
    # the constructor, then written by recorded ops only.
    fakes: List[str] = field(default_factory=list)

    def bound(self, name: str, a: float, b: float, in_after: bool) -> None:
        """`name` was last written by a trunc_normal_ within [a, b], in after(m) or in the
        constructor; unless after(m) writes everything again later."""
        if in_after or not self.after_rewrites_all:
            self.bounds.append((name, a, b))

    def fresh(self) -> int:
        self.counter += 1
        return self.counter

    def shape(self, lo: int = 1, hi: int = 9) -> Tuple[int, int]:
        return self.rng.randint(lo, hi), self.rng.randint(lo, hi)

    def value(self) -> float:
        return round(self.rng.uniform(-2.0, 2.0), 3)

    def pick(self, options: Sequence):
        return options[self.rng.randrange(len(options))]


Snippet = Callable[[Context], List[str]]


def _view(ctx: Context, name: str, rows: int, cols: int) -> Tuple[str, int, int]:
    """An expression viewing the 2-d tensor `name`, and the view's shape (rows, cols; cols=0 for
    a 1-d view)."""
    r = ctx.rng
    kind = ctx.pick(["whole", "rows", "cols", "t", "row", "step", "narrow", "flat"])
    if kind == "rows":
        a = r.randrange(rows)
        b = r.randint(a + 1, rows)
        return f"{name}[{a}:{b}]", b - a, cols
    if kind == "cols":
        a = r.randrange(cols)
        b = r.randint(a + 1, cols)
        return f"{name}[:, {a}:{b}]", rows, b - a
    if kind == "t":
        return f"{name}.t()", cols, rows
    if kind == "row":
        return f"{name}[{r.randrange(rows)}]", cols, 0
    if kind == "step":
        return f"{name}[:, ::2]", rows, (cols + 1) // 2
    if kind == "narrow":
        a = r.randrange(rows)
        return f"{name}.narrow(0, {a}, {rows - a})", rows - a, cols
    if kind == "flat":
        return f"{name}.view(-1)", rows * cols, 0
    return name, rows, cols


def _inplace(ctx: Context, target: str, rows: int, cols: int, dtype: str) -> str:
    a = ctx.value()
    shape = f"({rows},)" if cols == 0 else f"({cols},)"
    ops = [
        f"{target}.uniform_({a}, {a + 1.5})",
        f"{target}.normal_({a}, 0.5)",
        f"{target}.bernoulli_(0.3)",
        f"{target}.exponential_(1.5)",
        f"{target}.fill_({a})",
        f"{target}.mul_({a})",
        f"{target}.add_(torch.full({shape}, {a}, dtype={dtype}))",
        f"{target}.clamp_({min(a, 0.0)}, {max(a, 0.0) + 0.25})",
        f"{target}.copy_(({target} * 3).to(torch.float64).round().to({dtype}))",
        f"{target}.clamp_(-0.5, 0.5).erfinv_()",
        f"{target}.random_(0, 10)",
        f"{target}.geometric_(0.3)",
        f"{target}.cauchy_()",
        f"{target}.log_normal_(0.0, 0.25)",
        f"{target}.zero_()",
        f"{target}.uniform_().sub_(0.5).mul_(2)",
    ]
    return ctx.pick(ops)


def basics(ctx: Context) -> List[str]:
    """Factories, views, in-place random and pointwise ops through views, casts."""
    i, (rows, cols) = ctx.fresh(), ctx.shape()
    dtype = ctx.pick(FLOAT_DTYPES)
    factory = ctx.pick(
        [
            f"torch.zeros({rows}, {cols}, dtype={dtype})",
            f"torch.ones({rows}, {cols}, dtype={dtype})",
            f"torch.rand({rows}, {cols}, dtype={dtype})",
            f"torch.randn({rows}, {cols}, dtype={dtype})",
            f"torch.full(({rows}, {cols}), {ctx.value()}, dtype={dtype})",
            f"torch.arange({rows * cols}, dtype={dtype}).reshape({rows}, {cols})",
            f"torch.linspace(-1, 1, {rows * cols}, dtype={dtype}).view({rows}, {cols})",
            f"torch.empty({rows}, {cols}, dtype={dtype}).fill_(0.5)",
            f"torch.eye({rows}, {cols}, dtype={dtype})",
        ]
    )
    name = f"self.p{i}"
    lines = [f"{name} = nn.Parameter({factory})", "with torch.no_grad():"]
    for _ in range(ctx.rng.randint(1, 4)):
        view, vr, vc = _view(ctx, name, rows, cols)
        lines.append("    " + _inplace(ctx, view, vr, vc, dtype))
    if ctx.rng.random() < 0.5:
        cast = ctx.pick(FLOAT_DTYPES)
        lines.append(f'self.register_buffer("b{i}", {name}.detach().to({cast}) * {ctx.value()})')
    if dtype in ("torch.float32", "torch.float64"):
        ctx.matrices.append(name)
    return lines


def init(ctx: Context) -> List[str]:
    """torch.nn.init functions, on fresh parameters and on module weights."""
    i, (rows, cols) = ctx.fresh(), ctx.shape(2, 9)
    name = f"self.w{i}"
    calls = [
        f"nn.init.uniform_({name}, -0.3, 0.7)",
        f"nn.init.normal_({name}, 0.1, 0.02)",
        f"nn.init.trunc_normal_({name}, std=0.02, a=-0.04, b=0.04)",
        f"nn.init.trunc_normal_({name}, mean=0.5, std=1.0, a=-1.0, b=2.0)",
        f"nn.init.xavier_uniform_({name})",
        f"nn.init.xavier_normal_({name}, gain=0.5)",
        f"nn.init.kaiming_uniform_({name}, a=math.sqrt(5))",
        f"nn.init.kaiming_normal_({name}, mode='fan_out', nonlinearity='relu')",
        f"nn.init.orthogonal_({name})",
        f"nn.init.eye_({name})",
        f"nn.init.sparse_({name}, 0.5)",
        f"nn.init.constant_({name}, {ctx.value()})",
        f"nn.init.ones_({name}); nn.init.zeros_({name}[0])",
    ]
    lines = [f"{name} = nn.Parameter(torch.empty({rows}, {cols}))"]
    for _ in range(ctx.rng.randint(1, 2)):
        lines.append(ctx.pick(calls))
    ctx.matrices.append(name)
    if ctx.rng.random() < 0.4:
        out_c, in_c, k = ctx.rng.randint(1, 4), ctx.rng.randint(1, 4), ctx.pick([1, 3])
        lines.append(f"self.k{i} = nn.Conv2d({in_c}, {out_c}, {k})")
        lines.append(ctx.pick([f"nn.init.dirac_(self.k{i}.weight)", f"nn.init.kaiming_normal_(self.k{i}.weight)"]))
    return lines


def modules(ctx: Context) -> List[str]:
    """torch.nn modules as model code builds them, tied weights, apply(init) with .data writes."""
    i = ctx.fresh()
    d, o = ctx.rng.randint(1, 8), ctx.rng.randint(1, 8)
    lines: List[str] = []
    kind = ctx.pick(["linear", "embedding", "norms", "conv", "tied", "apply", "attention"])
    if kind == "linear":
        lines.append(f"self.m{i} = nn.Linear({d}, {o}, bias={ctx.pick(['True', 'False'])})")
        ctx.matrices.append(f"self.m{i}.weight")
    elif kind == "embedding":
        lines.append(f"self.m{i} = nn.Embedding({o + 2}, {d}, padding_idx={ctx.rng.randrange(o + 2)})")
        ctx.matrices.append(f"self.m{i}.weight")
    elif kind == "norms":
        lines.append(f"self.m{i} = nn.Sequential(nn.LayerNorm({d}), nn.BatchNorm1d({d}), nn.GroupNorm(1, {d}))")
    elif kind == "conv":
        lines.append(f"self.m{i} = nn.Conv1d({d}, {o}, {ctx.pick([1, 2, 3])}, groups=1)")
    elif kind == "tied":
        lines.append(f"self.m{i} = nn.Embedding({o}, {d})")
        lines.append(f"self.h{i} = nn.Linear({d}, {o}, bias=False)")
        lines.append(f"self.h{i}.weight = self.m{i}.weight")
        ctx.matrices.append(f"self.m{i}.weight")
    elif kind == "apply":
        lines.append(f"self.m{i} = nn.Sequential(nn.Linear({d}, {o}), nn.ReLU(), nn.Linear({o}, {d}))")
        lines.append("for sub in self.m%d.modules():" % i)
        lines.append("    if isinstance(sub, nn.Linear):")
        lines.append("        sub.weight.data.normal_(mean=0.0, std=0.02)")
        lines.append("        sub.bias.data.zero_()")
    else:
        heads = ctx.pick([1, 2])
        lines.append(f"self.m{i} = nn.MultiheadAttention({2 * heads * ctx.rng.randint(1, 3)}, {heads})")
    return lines


def element_writes(ctx: Context) -> List[str]:
    """Writes through single elements: select/index views, reshape(-1)[k], dirac_ (issue 11, class 4)."""
    i, (rows, cols) = ctx.fresh(), ctx.shape(2, 9)
    name = f"self.e{i}"
    r, c = ctx.rng.randrange(rows), ctx.rng.randrange(cols)
    writes = [
        f"{name}.data[{r}].zero_()",
        f"{name}.data[{r}].random_(51)",
        f"{name}.reshape(-1)[{ctx.rng.randrange(rows * cols)}].geometric_(0.1)",
        f"{name}[{r}, {c}] = {ctx.value()}",
        f"{name}.data[:, {c}].fill_({ctx.value()})",
        f"{name}[-1].normal_()",
        f"{name}[{r}][{c}].uniform_(-1, 1)",
        f"{name}.index_fill_(0, torch.tensor([{r}]), {ctx.value()})",
        f"{name}[[{r}, {rows - 1}]] = {ctx.value()}",
    ]
    lines = [f"{name} = nn.Parameter(torch.randn({rows}, {cols}))", "with torch.no_grad():"]
    for _ in range(ctx.rng.randint(1, 3)):
        lines.append("    " + ctx.pick(writes))
    if ctx.rng.random() < 0.3:
        lines.append(f"self.d{i} = nn.Conv1d({ctx.rng.randint(1, 4)}, {ctx.rng.randint(1, 4)}, 3)")
        lines.append(f"nn.init.dirac_(self.d{i}.weight)")
    ctx.matrices.append(name)
    return lines


def bool_mask(ctx: Context) -> List[str]:
    """Boolean-mask indexing and other ops with data-dependent output shapes (class 6)."""
    i, (rows, cols) = ctx.fresh(), ctx.shape()
    lines = [f"x{i} = torch.randn({rows}, {cols})"]
    uses = [
        f'self.register_buffer("m{i}", x{i}[x{i} > 0])',
        f'self.register_buffer("m{i}", torch.masked_select(x{i}, x{i} > 0.5))',
        f'self.register_buffer("m{i}", x{i}[x{i}.abs() < 1].clone())',
        f'self.register_buffer("m{i}", torch.nonzero(x{i} > 0))',
        f'self.register_buffer("m{i}", x{i}.masked_fill(x{i} > 0, {ctx.value()}))',
    ]
    lines.append(ctx.pick(uses))
    if ctx.rng.random() < 0.5:
        lines.append(f"self.q{i} = nn.Parameter(torch.randn({rows}, {cols}))")
        lines.append("with torch.no_grad():")
        lines.append(f"    self.q{i}[self.q{i} < 0] = {ctx.value()}")
    return lines


def where_scalar(ctx: Context) -> List[str]:
    """torch.where with Python scalars, on real and on recorded inputs (class 10)."""
    i, n = ctx.fresh(), ctx.rng.randint(1, 8)
    values = ", ".join(str(ctx.value()) for _ in range(n))
    a, b = ctx.value(), ctx.value()
    uses = [
        f'self.register_buffer("w{i}", torch.where(t{i} > 0, t{i}, {a}))',
        f'self.register_buffer("w{i}", torch.where(t{i} > 0, {a}, {b}))',
        f'self.register_buffer("w{i}", torch.where(t{i} < {a}, {b}, t{i}) * 2)',
    ]
    source = ctx.pick([f"torch.tensor([{values}])", f"torch.randn({n})"])
    return [f"t{i} = {source}", ctx.pick(uses)]


def unused_random(ctx: Context) -> List[str]:
    """Random ops whose output is never used, then a parameter that draws after them (class 5)."""
    i, (rows, cols) = ctx.fresh(), ctx.shape()
    lines = [f"x{i} = torch.randn({rows}, {cols})"]
    draws = [
        f"_ = torch.randn_like(x{i})",
        f"_ = torch.randn_like(x{i}.t())",
        f"_ = torch.rand_like(x{i}[:, :1])",
        f"_ = torch.normal(x{i}, x{i}.abs() + 0.1)",
        f"_ = torch.normal(0.0, x{i}.abs() + 0.1)",
        f"_ = torch.bernoulli(torch.rand({rows}))",
        f"_ = x{i}.clone().bernoulli_(0.25)",
        f"_ = F.dropout(x{i}, 0.5, training=True)",
        f"_ = nn.Dropout(0.3)(x{i})",
        f"_ = torch.multinomial(torch.rand({cols}) + 0.1, 1)",
        f"_ = torch.poisson(torch.rand({rows}) * 3)",
        f"_ = torch.randperm({rows})",
        f"_ = torch.randint(0, 10, ({rows},))",
    ]
    for _ in range(ctx.rng.randint(1, 3)):
        lines.append(ctx.pick(draws))
    r2, c2 = ctx.shape()
    lines.append(f"self.u{i} = nn.Parameter(torch.randn({r2}, {c2}))")
    return lines


def size_zero(ctx: Context) -> List[str]:
    """Size-0 tensors: random ops on them, init functions, a size-0 matmul (class 12)."""
    i, n = ctx.fresh(), ctx.rng.randint(1, 5)
    uses = [
        f'self.register_buffer("z{i}", torch.empty(0, {n}, dtype=torch.int64).random_(0, 10))',
        f'self.register_buffer("z{i}", torch.empty(0, dtype=torch.int32).random_())',
        f'self.register_buffer("z{i}", torch.randint(0, 5, (0, {n})))',
        f'self.register_buffer("z{i}", torch.randn(0, {n}) @ torch.randn({n}, 3))',
        f"self.z{i} = nn.Parameter(torch.empty(0, {n})); nn.init.normal_(self.z{i})",
        f"self.z{i} = nn.Parameter(torch.empty({n}, 0)); nn.init.trunc_normal_(self.z{i}, std=0.02)",
        f'self.register_buffer("z{i}", torch.empty(0, dtype=torch.int64)); nn.init.trunc_normal_(self.z{i})',
        f'self.register_buffer("z{i}", torch.empty(0, {n}).bernoulli_(0.5))',
    ]
    lines = [ctx.pick(uses)]
    lines.append(f"self.y{i} = nn.Parameter(torch.rand({n}, 2))")
    return lines


def real_written(ctx: Context) -> List[str]:
    """Real tensors created during construction and written with recorded values (class 11)."""
    i, n = ctx.fresh(), ctx.rng.randint(1, 6)
    values = ", ".join(str(ctx.value()) for _ in range(n))
    kind = ctx.pick(["copy", "add", "index", "sparse", "batchnorm", "read_then_write", "attr"])
    if kind == "copy":
        return [f"t{i} = torch.tensor([{values}])", f"t{i}.copy_(torch.randn({n}))", f'self.register_buffer("r{i}", t{i})']
    if kind == "add":
        return [
            f"t{i} = torch.tensor([{values}])",
            f"t{i}.add_(torch.rand({n})).mul_(2)",
            f"self.r{i} = nn.Parameter(t{i})",
        ]
    if kind == "index":
        return [
            f"t{i} = torch.tensor([{values}])",
            f"t{i}[torch.randint(0, {n}, (2,))] = {ctx.value()}",
            f'self.register_buffer("r{i}", t{i})',
        ]
    if kind == "sparse":
        rows, cols = ctx.shape(2, 6)
        return [
            f"w{i} = torch.tensor([[0.0] * {cols}] * {rows})",
            f"nn.init.sparse_(w{i}, 0.5)",
            f"self.r{i} = nn.Parameter(w{i})",
        ]
    if kind == "batchnorm":
        d = ctx.rng.randint(1, 4)
        return [
            f"self.n{i} = nn.BatchNorm1d({d})",
            f'self.register_buffer("r{i}", self.n{i}.num_batches_tracked + torch.randint(0, 3, ()))',
            f"self.n{i}.num_batches_tracked += 1",
        ]
    if kind == "read_then_write":
        return [
            f"t{i} = torch.tensor([{values}])",
            f'self.register_buffer("r{i}", torch.randn({n}) * t{i})',
            f"t{i}.mul_(3)",
            f'self.register_buffer("s{i}", t{i} + torch.zeros({n}))',
        ]
    return [f"self.r{i} = torch.tensor([{values}])", f"self.r{i}.copy_(torch.randn({n}) * 2)"]


def attributes(ctx: Context) -> List[str]:
    """Tensors held as plain attributes, and in lists, tuples and dicts on a module (class 3)."""
    i, n = ctx.fresh(), ctx.rng.randint(1, 8)
    uses = [
        f"self.a{i} = torch.randn({n}, 2)",
        f"self.a{i} = 1.0 / (10000 ** (torch.arange(0, {2 * n}, 2).float() / {2 * n}))",
        f"self.a{i} = torch.arange({n})",
        f"self.a{i} = [torch.randn({n}), torch.zeros(2)]",
        f'self.a{i} = {{"x": torch.arange({n}), "y": torch.rand(2)}}',
        f"self.a{i} = (torch.ones(2) * 3, torch.rand({n}))",
    ]
    if ctx.rng.random() < 0.3:
        # A deep copy after deferred_init returned copies the attributes' fakes as deferred copies
        # (Note [Deep copies after deferred_init returned]).
        ctx.after.append(f"m.cp{i} = copy.deepcopy(m)")
    return [ctx.pick(uses), f"self.v{i} = nn.Parameter(torch.rand({n}))"]


def ambient(ctx: Context) -> List[str]:
    """Default dtype and device changed during construction, grad mode (class 1), inference mode
    (writes into parameters record, temporaries included, and `.data` assigned across it; a buffer
    made in it, a view, or a parameter given an inference tensor's data, is refused)."""
    i, d = ctx.fresh(), ctx.rng.randint(1, 6)
    kind = ctx.pick(["dtype", "device", "default_device", "grad", "inference"])
    if kind == "inference":
        write = ctx.pick([f"self.g{i}.normal_()", f"self.g{i}.uniform_(-1, 1)", f"self.g{i}.mul_(3)",
                          f"torch.nn.init.kaiming_uniform_(self.g{i})", f"self.g{i}.zero_()",
                          f"self.g{i}.copy_(torch.ones({d}, 2) * 0.5)",
                          f"self.g{i}.mul_(torch.rand({d}, 2) + self.g{i} * 2)"])
        lines = [f"self.g{i} = nn.Parameter(torch.randn({d}, 2))", "with torch.inference_mode():",
                 f"    {write}"]
        if ctx.rng.random() < 0.05:  # refused: a tensor made, or a view
            lines.append(ctx.pick([f'    self.register_buffer("h{i}", torch.zeros({d}))',
                                   f"    self.g{i}[0].fill_(2.5)"]))
        if ctx.rng.random() < 0.15:
            # `.data` across the mode: a temporary that takes an inference tensor's data feeds an
            # ordinary parameter; a parameter that takes it becomes an inference tensor (refused).
            lines += ["with torch.inference_mode():", f"    v{i} = torch.rand({d}, 2) + 1",
                      f"t{i} = torch.empty({d}, 2)", f"t{i}.data = v{i}",
                      ctx.pick([f"self.k{i} = nn.Parameter(t{i} * 2)", f"self.g{i}.data = v{i}"])]
        return lines
    if kind == "dtype":
        dtype = ctx.pick(["torch.bfloat16", "torch.float64", "torch.float16"])
        body = ctx.pick(
            [
                f"self.l{i} = nn.Linear({d}, {d})",
                f'self.register_buffer("g{i}", torch.arange({d}) / 3)',
                f'self.register_buffer("g{i}", torch.sqrt(torch.arange({d})) * 0.5)',
                f"self.g{i} = nn.Parameter(torch.randn({d}, 2))",
                f'self.register_buffer("g{i}", torch.full(({d},), 1.5) + torch.linspace(0, 1, {d}))',
            ]
        )
        return [
            f"old{i} = torch.get_default_dtype()",
            f"torch.set_default_dtype({dtype})",
            "try:",
            f"    {body}",
            "finally:",
            f"    torch.set_default_dtype(old{i})",
            f"self.f{i} = nn.Parameter(torch.randn({d}))",
        ]
    if kind == "device":
        return ["with torch.device('cpu'):", f"    self.l{i} = nn.Linear({d}, {d})"]
    if kind == "default_device":
        return [
            "torch.set_default_device('cpu')",
            "try:",
            f"    self.g{i} = nn.Parameter(torch.randn({d}, 2))",
            "finally:",
            "    torch.set_default_device(None)",
        ]
    return [
        f"self.g{i} = nn.Parameter(torch.randn({d}))",
        ctx.pick(["with torch.no_grad():", "with torch.enable_grad():"]),
        f'    self.register_buffer("h{i}", self.g{i} * 2)',
    ]


def data_assign(ctx: Context) -> List[str]:
    """`.data =` assignment, on fake and on real parameters (class 9)."""
    i, (rows, cols) = ctx.fresh(), ctx.shape()
    uses = [
        [f"self.d{i} = nn.Parameter(torch.zeros({rows}, {cols}))", f"self.d{i}.data = torch.randn({rows}, {cols})"],
        [f"self.l{i} = nn.Linear({cols}, {rows})", f"self.l{i}.weight.data = torch.ones_like(self.l{i}.weight) * 0.5"],
        [f"self.d{i} = nn.Parameter(torch.tensor([1.0, 2.0]))", f"self.d{i}.data = torch.randn(2)"],
        [f"self.d{i} = nn.Parameter(torch.randn({rows}))", f"self.d{i}.data = self.d{i}.data.to(torch.float64)"],
    ]
    return list(ctx.pick(uses))


def tensor_of_0d(ctx: Context) -> List[str]:
    """torch.tensor of 0-d tensors, as rotary scaling code builds it (class 2)."""
    i, n = ctx.fresh(), ctx.rng.randint(1, 5)
    uses = [
        f'self.register_buffer("o{i}", torch.tensor([f / 2 for f in torch.rand({n})]))',
        f'self.register_buffer("o{i}", torch.tensor(torch.randn(()).item() * 3))',
        f'self.register_buffer("o{i}", torch.tensor([torch.randn(()), torch.zeros(())]))',
    ]
    return [ctx.pick(uses), f"self.x{i} = nn.Parameter(torch.randn({n}))"]


def aliasing(ctx: Context) -> List[str]:
    """Buffers that alias another child's parameter, copies taken before a rewrite (class 8)."""
    i = ctx.fresh()
    if not ctx.matrices or ctx.rng.random() < 0.5:
        ctx.matrices.append(f"self.c{i}.weight")
        lines = [f"self.c{i} = nn.Linear(3, 3)"]
        base = f"self.c{i}.weight"
    else:
        lines, base = [], ctx.pick(ctx.matrices)
    kind = ctx.pick(["issue", "view_buffer", "tie"])
    if kind == "issue":
        lines += [
            f"t{i} = {base}.detach() * 2",
            f"{base}.data.normal_()",
            f'self.register_buffer("b{i}", {base}.detach())',
            f"self.p{i} = nn.Parameter(t{i}.clone())",
        ]
    elif kind == "view_buffer":
        lines += [f"self.v{i} = nn.Module()", f'self.v{i}.register_buffer("row", {base}[0])']
    else:  # the same Parameter held by a second child: a tied weight
        lines += [f"self.s{i} = nn.Module()", f"self.s{i}.w = {base}"]
    return lines


def generators(ctx: Context) -> List[str]:
    """Random ops given an explicit CPU torch.Generator (PEFT's VeRA), held as an attribute so
    that its state after construction is compared too; default-generator draws in between."""
    i, (rows, cols) = ctx.fresh(), ctx.shape()
    g = f"self.g{i}"
    lines = [f"{g} = torch.Generator().manual_seed({ctx.rng.randrange(1000)})"]
    for k in range(ctx.rng.randint(1, 3)):
        name = f"self.q{i}_{k}"
        buffer = f'self.register_buffer("q{i}_{k}", '
        draws = [
            f"{name} = nn.Parameter(torch.randn({rows}, {cols}, generator={g}))",
            f"{name} = nn.Parameter(torch.rand({rows}, {cols}, generator={g}, dtype=torch.float64))",
            f"{name} = nn.Parameter(torch.empty({rows}, {cols})); "
            f"nn.init.kaiming_uniform_({name}, a=math.sqrt(5), generator={g})",
            f"{name} = nn.Parameter(torch.empty({rows}, {cols})); "
            f"nn.init.trunc_normal_({name}, std=0.5, generator={g})",
            f"{name} = nn.Parameter(torch.empty({rows}, {cols})); nn.init.xavier_normal_({name}, generator={g})",
            f"{name} = nn.Parameter(torch.empty({rows}, {cols})); nn.init.orthogonal_({name}, generator={g})",
            f"{name} = nn.Parameter(torch.empty({rows}, {cols}).normal_(0, 1, generator={g}))",
            f"{name} = nn.Parameter(torch.zeros({rows}, {cols})); "
            f"{name}.data[{ctx.rng.randrange(rows)}].uniform_(-1, 1, generator={g})",
            f"{name} = nn.Parameter(torch.zeros({rows}, {cols})); {name}.data.t().normal_(generator={g})",
            buffer + f"torch.randperm({rows * cols}, generator={g}))",
            buffer + f"torch.randint(0, 7, ({rows}, {cols}), generator={g}))",
            buffer + f"torch.empty({rows}, {cols}).bernoulli_(0.4, generator={g}))",
            buffer + f"torch.bernoulli(torch.rand({rows}, {cols}), generator={g}))",
            buffer + f"torch.poisson(torch.rand({rows}) * 4, generator={g}))",
            buffer + f"torch.empty({rows}, {cols}).exponential_(2.0, generator={g}))",
            buffer + f"torch.multinomial(torch.rand({cols}) + 0.1, 2, replacement=True, generator={g}))",
            f"_ = torch.randn({rows}, {cols}, generator={g})",
            f"_ = torch.rand(3, generator={g}).sum().item()",
        ]
        lines.append(ctx.pick(draws))
        if ctx.rng.random() < 0.3:
            lines.append(f"self.n{i}_{k} = nn.Parameter(torch.randn({cols}))")
    return lines


def parametrizations(ctx: Context) -> List[str]:
    """torch.nn.utils.parametrizations (orthogonal, weight_norm, spectral_norm) and
    register_parametrization, with an assignment through right_inverse."""
    i, (rows, cols) = ctx.fresh(), ctx.shape(1, 6)
    layer = f"self.z{i}"
    dtype = ctx.pick(["torch.float32", "torch.float64"])
    lines = [f"{layer} = nn.Linear({cols}, {rows}, dtype={dtype})"]
    kind = ctx.pick(["orthogonal", "weight_norm", "spectral_norm", "custom"])
    if kind == "orthogonal":
        orthogonal_map = ctx.pick([None, "matrix_exp", "cayley", "householder"])
        trivial = ctx.pick([True, False])
        lines.append(f"torch.nn.utils.parametrizations.orthogonal({layer}, orthogonal_map={orthogonal_map!r}, "
                     f"use_trivialization={trivial})")
        assign = trivial or orthogonal_map in (None, "householder") and rows * cols > 0
    elif kind == "weight_norm":
        lines.append(f"torch.nn.utils.parametrizations.weight_norm({layer}, dim={ctx.pick([0, 1, None])})")
        assign = True
    elif kind == "spectral_norm":
        lines.append(f"torch.nn.utils.parametrizations.spectral_norm({layer}, "
                     f"n_power_iterations={ctx.rng.randint(1, 3)})")
        assign = True
    else:
        lines.append(f"torch.nn.utils.parametrize.register_parametrization({layer}, 'weight', Shifted())")
        if ctx.rng.random() < 0.5:
            lines.append(f"torch.nn.utils.parametrize.register_parametrization({layer}, 'bias', nn.Tanh())")
        assign = True
    if assign and ctx.rng.random() < 0.5:
        lines.append("with torch.no_grad():")
        lines.append(f"    {layer}.weight = torch.randn({rows}, {cols}, dtype={dtype})")
    if ctx.rng.random() < 0.5:
        lines.append(f'self.register_buffer("zw{i}", {layer}.weight.detach() * 1)')
    return lines


def deepcopies(ctx: Context) -> List[str]:
    """copy.deepcopy of modules while recording and after deferred_init returned (EMA and teacher
    copies), with writes to the original after the copy and init code run on the copy."""
    i, d, o = ctx.fresh(), ctx.rng.randint(1, 6), ctx.rng.randint(1, 6)
    src = f"self.k{i}"
    kind = ctx.pick(["linear_bn", "tied", "buffers", "conv"])
    if kind == "linear_bn":
        lines = [f"{src} = nn.Sequential(nn.Linear({d}, {o}), nn.BatchNorm1d({o}))"]
    elif kind == "tied":
        lines = [f"{src} = nn.Module()", f"{src}.a = nn.Linear({d}, {d})", f"{src}.b = nn.Linear({d}, {d})",
                 f"{src}.b.weight = {src}.a.weight"]
    elif kind == "buffers":
        lines = [f"{src} = nn.Module()", f'{src}.register_buffer("t", torch.randn({d}, {o}))',
                 f'{src}.register_buffer("row", {src}.t[0])', f"{src}.p = nn.Parameter(torch.rand({o}))"]
    else:
        lines = [f"{src} = nn.Conv1d({d}, {o}, 3)"]
    when = ctx.pick(["during", "after", "both"])
    if when in ("during", "both"):
        lines.append(f"self.c{i} = copy.deepcopy({src})")
        if ctx.rng.random() < 0.5:
            lines.append(f"next({src}.parameters()).data.normal_()")
    if when in ("after", "both"):
        ctx.after.append(f"m.e{i} = copy.deepcopy(m.k{i})")
        if ctx.rng.random() < 0.5:
            ctx.after.append(f"next(m.k{i}.parameters()).data.uniform_(-1, 1)")
        if ctx.rng.random() < 0.5:
            ctx.after.append(f"nn.init.trunc_normal_(next(m.e{i}.parameters()), std=0.1)")
    return lines


def norm_train(ctx: Context) -> List[str]:
    """BatchNorm and InstanceNorm with tracked statistics run in train mode while recording: the
    forward writes running_mean and running_var (Note [Writes the schema does not show])."""
    i, d, n = ctx.fresh(), ctx.rng.randint(1, 5), ctx.rng.randint(2, 4)
    norm = f"self.n{i}"
    kind = ctx.pick(["bn1d", "bn2d", "in1d", "momentum_none", "functional", "on_a_parameter"])
    if kind == "bn1d":
        return [f"{norm} = nn.BatchNorm1d({d})", f"_ = {norm}(torch.randn({n}, {d}) * 2 + 1)"]
    if kind == "bn2d":
        return [f"{norm} = nn.BatchNorm2d({d})", f"_ = {norm}(torch.randn({n}, {d}, 3, 3))"]
    if kind == "in1d":
        return [f"{norm} = nn.InstanceNorm1d({d}, affine={ctx.pick(['True', 'False'])}, track_running_stats=True)",
                f"_ = {norm}(torch.randn({n}, {d}, 5))"]
    if kind == "momentum_none":
        return [f"{norm} = nn.BatchNorm1d({d}, momentum=None)",
                f"for _k in range({ctx.rng.randint(1, 3)}): _ = {norm}(torch.rand({n}, {d}))"]
    if kind == "functional":
        return [f'self.register_buffer("rm{i}", torch.zeros({d}))', f'self.register_buffer("rv{i}", torch.ones({d}))',
                f"_ = F.batch_norm(torch.randn({n}, {d}), self.rm{i}, self.rv{i}, training=True, momentum=0.3)"]
    return [f"self.x{i} = nn.Parameter(torch.randn({n}, {d}))", f"{norm} = nn.BatchNorm1d({d})",
            f"_ = {norm}(self.x{i})"]


def conj_views(ctx: Context) -> List[str]:
    """Conjugate views of complex fakes (conj(), .mH, .H, adjoint()), while recording or after
    deferred_init returned: refused by design (Note [Conjugate and negative views of fakes])."""
    i, n = ctx.fresh(), ctx.rng.randint(1, 4)
    view = ctx.pick(["conj()", "mH", "H", "adjoint()"])
    lines = [f"self.z{i} = nn.Parameter(torch.randn({n}, {n}, dtype=torch.complex64))"]
    if ctx.rng.random() < 0.5:
        lines.append(f'self.register_buffer("h{i}", self.z{i}.detach().{view}.clone())')
    else:
        ctx.after.append(f'm.register_buffer("h{i}", m.z{i}.detach().{view}.clone())')
    return lines


# Host values read from a recorded tensor `{t}`: a reduction or search, then item(), float(), ...
_READS = [
    "{t}.abs().max().item()", "{t}.min().item()", "{t}.std().item()", "{t}.var().item()",
    "{t}.norm().item()", "{t}.mean().item()", "float({t}.sum())", "{t}.median().item()",
    "torch.quantile({t}.flatten(), 0.75).item()", "{t}.amax().item()", "torch.aminmax({t})[1].item()",
    "{t}.flatten().kthvalue(1).values.item()", "{t}.flatten().topk(1).values.item()",
    "{t}.flatten().sort().values[-1].item()", "float(torch.count_nonzero({t} > 0))",
    "float(torch.isnan({t}).any())", "float(torch.linalg.vector_norm({t}, ord=float('inf')))",
    "float(torch.histc({t}, bins=3).max())", "float(torch.unique(({t} > 0).int()).numel())",
    "float(len(torch.where({t} > 0)[0]))", "float(torch.allclose({t}, {t} * 1.0))",
    "float(bool(({t} > -3).all()))", "float({t}.prod())", "float({t}.nansum())",
    "float(torch.var_mean({t}, 0)[1].sum())", "sum({t}.tolist()[0])",
    "float(({t} * 2).tolist()[-1][0])", "float({t}.detach()[0].numpy().max())",
    "float({t}.t().new_tensor([0.5, {t}.shape[0]]).sum())", "float({t}.T.new(2, 1).shape[0])",
    "float(len(repr({t} * 2)) > 0)", "float(f'{{{t}.sum():.3f}}')",
]


def _read_and_use(ctx: Context, sources: List[str], write_to: str, register: str, i: int) -> List[str]:
    """A value read from one of `sources` and used: a branch, a buffer, a scale. After
    deferred_init returned the sources are the handed-out parameter and fakes computed from it,
    which read values as it does (Note [Handed-out fakes after deferred_init])."""
    read = ctx.pick(_READS).format(t=ctx.pick(sources))
    use = ctx.pick(["branch", "buffer", "scale"])
    if use == "branch":
        return [f"if {read} > {ctx.value()}:", f"    {write_to}.data.mul_(0.5)"]
    if use == "buffer":
        return [f'{register}.register_buffer("rv{i}", torch.tensor({read}))']
    return [f"{write_to}.data.mul_(1.0 / (abs({read}) + 1.0))"]


def value_reads(ctx: Context) -> List[str]:
    """Values read from recorded fakes (reductions, then item(), float(), bool(), tolist()) and
    branches on them, while recording and after deferred_init returned (Note [Reading values while
    recording])."""
    i, (rows, cols) = ctx.fresh(), ctx.shape(2, 6)
    name = f"self.r{i}"
    lines = [f"{name} = nn.Parameter(torch.randn({rows}, {cols}))"]
    when = ctx.pick(["during", "after", "both"])
    if when in ("during", "both"):
        lines += _read_and_use(ctx, [f"{name}.detach()"], name, "self", i)
    if when in ("after", "both"):
        sources = [f"m.r{i}", f"m.r{i}.detach()", f"(m.r{i} * 2)", f"m.r{i}[1:]"]
        ctx.after += _read_and_use(ctx, sources, f"m.r{i}", "m", 1000 + i)
    return lines


def after_init(ctx: Context) -> List[str]:
    """Init code run after deferred_init returned, as torchtitan's init_weights does: nn.init
    calls (trunc_normal_ among them), .data writes, reset_parameters(), casts."""
    i, d, o = ctx.fresh(), ctx.rng.randint(1, 6), ctx.rng.randint(1, 6)
    lines = [f"self.t{i} = nn.Sequential(nn.Linear({d}, {o}), nn.LayerNorm({o}))"]
    w, b = f"m.t{i}[0].weight", f"m.t{i}[0].bias"
    calls = [
        f"nn.init.trunc_normal_({w}, std=0.02)",
        f"nn.init.trunc_normal_({w}.data, mean=0.1, std=1.0, a=-1.5, b=1.5)",
        # On fakes computed after return: a row, a transposed view.
        f"with torch.no_grad(): nn.init.trunc_normal_({w}[0], std=0.5)",
        f"with torch.no_grad(): nn.init.trunc_normal_({w}.t(), std=0.3, a=-0.5, b=0.5)",
        f'm.t{i}.register_buffer("n{i}", {w}.detach().t().new_tensor([{ctx.value()}, {ctx.value()}]))',
        f"nn.init.normal_({w}, std={abs(ctx.value()) + 0.01})",
        f"nn.init.zeros_({b})",
        f"nn.init.xavier_uniform_({w})",
        f"nn.init.orthogonal_({w})",
        f"m.t{i}[0].reset_parameters()",
        f"m.t{i}.apply(lambda s: nn.init.ones_(s.weight) if isinstance(s, nn.LayerNorm) else None)",
        f"with torch.no_grad(): {w}.clamp_(-0.1, 0.1)",
        f"{w}.data.uniform_(-0.5, 0.5)",
        # No draw from the default generator here: after a trunc_normal_ run after deferred_init
        # returned, the generator is owed until materialization (unless the recording was made
        # with exact_generator=True), and torchdefer warns that real draws made meanwhile differ
        # from eager's (Note [The generator after deferred_init]).
        f"with torch.no_grad(): {w}[0].copy_(torch.linspace(-1, 1, {d}))",
        f"m.t{i}[1].weight.data.fill_({ctx.value()})",
        f"m.t{i}.to(torch.float64)",
    ]
    for _ in range(ctx.rng.randint(1, 3)):
        ctx.after.append(ctx.pick(calls))
    return lines


# ---------------------------------------------------------------------------------------------
# trainer_flows: what training scripts do around construction (issue 29).


@dataclass
class _Node:
    """A module of a trainer_flows tree. `path` is its attribute path below the model
    ("t3.c1[0]"), `name` its named_tensors prefix ("t3.c1.0"); a leaf has a constructor, its
    parameters (name, shape) and its buffers; a container ("module" or "seq") has children."""

    path: str
    name: str
    kind: str  # leaf, module, seq
    ctor: str = ""
    params: List[Tuple[str, Tuple[int, ...]]] = field(default_factory=list)
    buffers: List[str] = field(default_factory=list)
    children: List["_Node"] = field(default_factory=list)

    def expr(self) -> str:
        if self.kind == "seq":
            return "nn.Sequential(" + ", ".join(c.expr() for c in self.children) + ")"
        return self.ctor

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()


def _leaf(ctx: Context, path: str, name: str) -> _Node:
    a, b = ctx.rng.randint(1, 6), ctx.rng.randint(1, 6)
    kind = ctx.pick(["linear", "embedding", "layernorm", "conv", "batchnorm", "custom"])
    if kind == "linear":
        bias = ctx.pick([True, False])
        return _Node(path, name, "leaf", f"nn.Linear({a}, {b}, bias={bias})",
                     [("weight", (b, a))] + ([("bias", (b,))] if bias else []))
    if kind == "embedding":
        return _Node(path, name, "leaf", f"nn.Embedding({a + 1}, {b})", [("weight", (a + 1, b))])
    if kind == "layernorm":
        return _Node(path, name, "leaf", f"nn.LayerNorm({a})", [("weight", (a,)), ("bias", (a,))])
    if kind == "conv":
        k = ctx.pick([1, 3])
        return _Node(path, name, "leaf", f"nn.Conv1d({a}, {b}, {k})", [("weight", (b, a, k)), ("bias", (b,))])
    if kind == "batchnorm":
        return _Node(path, name, "leaf", f"nn.BatchNorm1d({a})", [("weight", (a,)), ("bias", (a,))],
                     ["running_mean", "running_var", "num_batches_tracked"])
    return _Node(path, name, "leaf", f"Scale({a}, {b})", [("scale", (a,)), ("table", (a, b))], ["steps"])


def _tree(ctx: Context, path: str, name: str, depth: int) -> _Node:
    """A random module tree: plain nn.Module containers, Sequentials and leaves, up to 3 deep."""
    roll = ctx.rng.random()
    if depth >= 3 or roll < 0.35:
        return _leaf(ctx, path, name)
    if roll < 0.6:
        node = _Node(path, name, "seq")
        for k in range(ctx.rng.randint(1, 3)):
            child_path, child_name = f"{path}[{k}]", f"{name}.{k}"
            child = _leaf(ctx, child_path, child_name) if ctx.rng.random() < 0.7 else \
                _Node(child_path, child_name, "seq", children=[_leaf(ctx, f"{child_path}[0]", f"{child_name}.0")])
            node.children.append(child)
        return node
    node = _Node(path, name, "module")
    for k in range(ctx.rng.randint(1, 3)):
        node.children.append(_tree(ctx, f"{path}.c{k}", f"{name}.c{k}", depth + 1))
    return node


def _build_tree(node: _Node, meta: _Node, owner: str) -> List[str]:
    """The statements that build `node` ("nn.Module()" containers attribute by attribute), with
    the ones that build `meta` inside `with torch.device("meta"):`."""
    if node.kind == "module":
        lines = [f"{owner}.{node.path} = nn.Module()"]
        for child in node.children:
            lines += _build_tree(child, meta, owner)
    else:
        lines = [f"{owner}.{node.path} = {node.expr()}"]
    if node is meta:
        return ['with torch.device("meta"):'] + ["    " + line for line in lines]
    return lines


_TRUNC = [(0.0, 0.02, -0.04, 0.04), (0.0, 1.0, -2.0, 2.0), (0.5, 1.0, -1.0, 2.0), (0.0, 1.0, -0.3, 0.3),
          (0.1, 0.5, -0.2, 1.5)]


def _init_tensor(ctx: Context, target: str, name: str, shape: Tuple[int, ...], g: str, in_after: bool,
                 real: bool) -> List[str]:
    """Code that writes every element of the parameter `target` (after to_empty its memory is
    uninitialized): one or two nn.init calls or direct draws, some given the generator `g`.

    In after(m), no real draw from the default generator: after a rejection sampler it is owed
    until materialization, and a real draw then differs from eager's by design (Note [The
    generator after deferred_init]). So no factory draws from it there, and a `real` target (a
    meta tensor that to_empty made real after deferred_init returned) is drawn with `g` only."""
    lines: List[str] = []
    numel = 1
    for size in shape:
        numel *= size
    for _ in range(ctx.rng.randint(1, 2)):
        gen = f", generator={g}" if g and (real or ctx.rng.random() < 0.6) else ""
        bounds = None
        choices = [
            f"nn.init.normal_({target}, {ctx.value()}, {abs(ctx.value()) + 0.01}{gen})",
            f"nn.init.uniform_({target}, -0.5, 0.5{gen})",
            "TRUNC",
            f"nn.init.zeros_({target})",
            f"nn.init.ones_({target})",
            f"nn.init.constant_({target}, {ctx.value()})",
            f"{target}.data.uniform_(-1, 1{gen})",
            f"{target}.data.normal_(0.0, 0.2{gen})",
            f"{target}.data.bernoulli_(0.3{gen})",
            f"{target}.data.exponential_(2.0{gen})",
            f"{target}.data.log_normal_(0.0, 0.25{gen})",
            f"{target}.data.cauchy_({gen[2:]})",
            f"{target}.data.geometric_(0.3{gen})",
            f"{target}.data.random_(0, 5{gen})",
            f"with torch.no_grad(): {target}.normal_(generator={g or 'None'})",
        ]
        if not in_after or gen:
            choices += [
                f"{target}.data.copy_(torch.randn({shape}{gen}))",
                f"{target}.data.copy_(torch.randint(0, 9, {shape}{gen}).float())",
                f"{target}.data.copy_(torch.randperm({numel}{gen}).float().reshape({shape}))",
                f"{target}.data.copy_(torch.multinomial(torch.linspace(1, 2, {numel}), {numel}, replacement=True"
                f"{gen}).float().reshape({shape}))",
            ]
        if len(shape) >= 2:
            choices += [
                f"nn.init.kaiming_uniform_({target}, a=math.sqrt(5){gen})",
                f"nn.init.kaiming_normal_({target}, mode='fan_out', nonlinearity='relu'{gen})",
                f"nn.init.xavier_uniform_({target}, gain={abs(ctx.value()) + 0.1}{gen})",
                f"nn.init.xavier_normal_({target}{gen})",
                f"nn.init.orthogonal_({target}{gen})",
            ]
        call = ctx.pick(choices)
        if call == "TRUNC":
            mean, std, a, b = ctx.pick(_TRUNC)
            call = f"nn.init.trunc_normal_({target}, mean={mean}, std={std}, a={a}, b={b}{gen})"
            bounds = (name, a, b)
        lines.append(call)
    # The last write decides the bounds the counter check holds it to.
    if bounds is not None:
        ctx.bound(*bounds, in_after=in_after)
    return lines


def _init_buffers(ctx: Context, leaf: str, buffers: List[str], g: str, real: bool) -> List[str]:
    if not buffers:
        return []
    gen = f", generator={g}" if g and (real or ctx.rng.random() < 0.5) else ""
    if "steps" in buffers:
        return [ctx.pick([f"{leaf}.steps.zero_()", f"{leaf}.steps.fill_(3)", f"{leaf}.steps.random_(0, 9{gen})"])]
    return [ctx.pick([
        f"{leaf}.reset_running_stats()",
        f"{leaf}.running_mean.zero_(); {leaf}.running_var.fill_(1.0); {leaf}.num_batches_tracked.zero_()",
        f"{leaf}.running_mean.uniform_(-1, 1{gen}); {leaf}.running_var.uniform_(0.5, 2.0{gen}); "
        f"{leaf}.num_batches_tracked.fill_(2)",
    ])]


def _init_subtree(ctx: Context, target: _Node, owner: str, g: str, meta: _Node) -> List[str]:
    """Initializes every parameter and buffer below `target` (after its to_empty). In after(m),
    the tensors built under the meta device (below `meta`) are real once to_empty ran (they were
    never fakes), so they draw from `g` only: reset_parameters() would draw real numbers from
    the default generator, which may be owed then."""
    real_nodes = {id(n) for n in meta.walk()} if owner == "m" else set()
    if ctx.rng.random() < 0.15 and not any(id(n) in real_nodes for n in target.walk()):
        return [f"{owner}.{target.path}.apply(lambda s: s.reset_parameters() "
                "if hasattr(s, 'reset_parameters') else None)"]
    lines: List[str] = []
    for node in target.walk():
        if node.kind != "leaf":
            continue
        leaf, real = f"{owner}.{node.path}", id(node) in real_nodes
        if ctx.rng.random() < 0.25 and not real:
            lines.append(f"{leaf}.reset_parameters()")
            continue
        for pname, shape in node.params:
            lines += _init_tensor(ctx, f"{leaf}.{pname}", f"{node.name}.{pname}", shape, g, owner == "m", real)
        lines += _init_buffers(ctx, leaf, node.buffers, g, real)
    return lines


def _generator(ctx: Context, i: int, owner: str, needed: bool = False) -> Tuple[List[str], str]:
    """A fresh CPU generator `g{i}` (or none, unless `needed`), tracked by make_generator;
    sometimes held by the module."""
    if ctx.rng.random() < 0.3 and not needed:
        return [], ""
    lines = [f"g{i} = make_generator({ctx.rng.randrange(1000)})"]
    if owner == "self" and ctx.rng.random() < 0.3:
        lines.append(f"self.gen{i} = g{i}")
    return lines, f"g{i}"


def _meta_tree(ctx: Context, i: int, when: str) -> List[str]:
    """A tree with a subtree (any node, the root included) built under the meta device, then
    to_empty on a node at or below it or above it (or on none: it stays meta, as in eager), then
    init of every tensor that to_empty emptied, in the constructor or in after(m)."""
    root = _tree(ctx, f"t{i}", f"t{i}", 0)
    # `meta` must be one statement of the build: the root, or a child of an nn.Module container.
    statements = [root] + [c for n in root.walk() if n.kind == "module" for c in n.children]
    meta = ctx.pick(statements)
    lines = _build_tree(root, meta, "self")
    if ctx.rng.random() < 0.12:
        return lines  # never moved: meta in eager, and after materializing
    below = list(meta.walk())
    above = [n for n in root.walk() if n is not meta and any(x is meta for x in n.walk())]
    target = ctx.pick(below + above) if ctx.rng.random() < 0.8 else ctx.pick(below)
    owner = "self" if when == "during" else "m"
    glines, g = _generator(ctx, i, owner, needed=owner == "m")
    body = [f'{owner}.{target.path}.to_empty(device="cpu")'] + glines + _init_subtree(ctx, target, owner, g, meta)
    if when == "during":
        # The tensors built on the meta device that to_empty moved. (Not every tensor it moved: a
        # real tensor stays real, such as BatchNorm's num_batches_tracked, a torch.tensor literal,
        # built off the meta device.)
        moved_meta = {id(n) for n in meta.walk()}
        for node in target.walk():
            if node.kind == "leaf" and id(node) in moved_meta:
                ctx.fakes += [f"{node.name}.{name}" for name, _ in node.params]
                ctx.fakes += [f"{node.name}.{name}" for name in node.buffers]
        return lines + body
    ctx.after.extend(body)
    return lines


def _draws(ctx: Context, i: int) -> List[str]:
    """Direct draws with an explicit generator into new parameters and buffers, default-generator
    draws between them."""
    glines, g = _generator(ctx, i, "self")
    if not g:
        glines, g = [f"g{i} = make_generator({ctx.rng.randrange(1000)})"], f"g{i}"
    lines = list(glines)
    for k in range(ctx.rng.randint(1, 3)):
        rows, cols = ctx.shape()
        name = f"self.q{i}_{k}"
        buf = f'self.register_buffer("q{i}_{k}", '
        probs = f"torch.rand({cols}) + 0.1"
        draws = [
            f"{name} = nn.Parameter(torch.randn({rows}, {cols}, generator={g}))",
            f"{name} = nn.Parameter(torch.empty({rows}, {cols}).uniform_(generator={g}))",
            buf + f"torch.randint(0, 9, ({rows}, {cols}), generator={g}))",
            buf + f"torch.randperm({rows * cols}, generator={g}).view({rows}, {cols}))",
            buf + f"torch.empty({rows}, {cols}).bernoulli_(0.4, generator={g}))",
            buf + f"torch.empty({rows}, {cols}).exponential_(1.5, generator={g}))",
            buf + f"torch.empty({rows}, {cols}).log_normal_(0.0, 0.5, generator={g}))",
            buf + f"torch.empty({rows}, {cols}).cauchy_(generator={g}))",
            buf + f"torch.empty({rows}, {cols}).geometric_(0.4, generator={g}))",
            buf + f"torch.empty({rows}, {cols}, dtype=torch.int64).random_(generator={g}))",
            buf + f"torch.multinomial({probs}, {cols}, generator={g}))",
            buf + f"torch.multinomial({probs}, {rows}, replacement=True, generator={g}))",
            f"{name} = nn.Parameter(torch.empty({rows}, {cols})); "
            f"nn.init.trunc_normal_({name}, std=0.02, a=-0.04, b=0.04, generator={g})",
            f"{name} = nn.Parameter(torch.empty({rows}, {cols})); "
            f"nn.init.trunc_normal_({name}, mean=0.5, std=1.0, a=-1.0, b=2.0, generator={g})",
            f"_ = torch.randn({rows}, {cols}, generator={g})",
            f"_ = torch.empty({rows}).uniform_(generator={g})",
            # Reads of a generator a trunc_normal_ may have left owing (Note [Followed
            # generators]), and normal_ below 16 elements, which caches a sample in it and takes
            # it on the next call without moving the engine.
            f"_ = {g}.get_state()",
            f"_ = {g}.clone_state()",
            f"_ = torch.randn(1, generator={g})",
            buf + f"torch.empty(3).normal_(generator={g}))",
            f"{name} = nn.Parameter(torch.empty(5)); "
            f"nn.init.trunc_normal_({name}, mean=0.5, std=1.0, a=-1.0, b=2.0, generator={g})",
        ]
        draw = ctx.pick(draws)
        lines.append(draw)
        if "trunc_normal_" in draw:
            mean, a, b = (0.0, -0.04, 0.04) if "a=-0.04" in draw else (0.5, -1.0, 2.0)
            ctx.bound(f"q{i}_{k}", a, b, in_after=False)
        if ctx.rng.random() < 0.4:
            lines.append(f"self.n{i}_{k} = nn.Parameter(torch.randn({cols}))")
    return lines


def _norm_forward(ctx: Context, i: int) -> List[str]:
    """A forward at construction through a norm layer, in eval mode (running statistics read,
    not written) or train mode (written), with or without no_grad; its output kept, read or
    dropped."""
    d, n = ctx.rng.randint(1, 5), ctx.rng.randint(2, 4)
    net = f"self.n{i}"
    kind = ctx.pick(["bn1d", "bn2d", "instance", "group", "layer"])
    stats = False
    if kind == "bn1d":
        lines, x = [f"{net} = nn.Sequential(nn.Linear({d}, {d}), nn.BatchNorm1d({d}))"], f"torch.randn({n}, {d})"
        stats = True
    elif kind == "bn2d":
        lines, x = [f"{net} = nn.Sequential(nn.Conv2d({d}, {d}, 1), nn.BatchNorm2d({d}))"], f"torch.randn({n}, {d}, 3, 3)"
        stats = True
    elif kind == "instance":
        track = ctx.pick([True, False])
        lines = [f"{net} = nn.Sequential(nn.Conv1d({d}, {d}, 1), nn.InstanceNorm1d({d}, "
                 f"affine={ctx.pick([True, False])}, track_running_stats={track}))"]
        x, stats = f"torch.randn({n}, {d}, 4)", track
    elif kind == "group":
        groups, per = ctx.rng.randint(1, 3), ctx.rng.randint(1, 2)
        lines, x = [f"{net} = nn.Sequential(nn.Linear({d}, {groups * per}), nn.GroupNorm({groups}, {groups * per}))"], \
            f"torch.randn({n}, {d})"
    else:
        lines, x = [f"{net} = nn.Sequential(nn.Linear({d}, {d}), nn.LayerNorm({d}))"], f"torch.randn({n}, {d})"
    if stats and ctx.rng.random() < 0.5:
        lines.append(f"{net}[1].running_mean.uniform_(-1, 1); {net}[1].running_var.uniform_(0.5, 2.0)")
    source = ctx.pick(["real", "scaled", "parameter"])
    if source == "scaled":
        x = f"{x} * 2 + 1"
    elif source == "parameter":
        lines.append(f"self.x{i} = nn.Parameter({x})")
        x = f"self.x{i}"
    mode = ctx.pick(["eval", "eval", "root_eval", "train"])
    if mode == "eval":
        lines.append(f"{net}.eval()")
    elif mode == "root_eval":
        lines.append("self.eval()")
    grad = ctx.rng.random() < 0.7
    if grad:
        lines += ["with torch.no_grad():", f"    y{i} = {net}({x})"]
    else:
        lines.append(f"y{i} = {net}({x})")
    if mode == "root_eval":
        lines.append("self.train()")
    use = ctx.pick(["buffer", "read", "none", "train_again"])
    if use == "buffer":
        lines.append(f'self.register_buffer("y{i}", y{i}.detach().clone())')
    elif use == "read":
        lines += [f"if float(y{i}.sum()) > {ctx.value()}:", f"    {net}[0].weight.data.mul_(0.5)"]
    elif use == "train_again":
        lines += [f"{net}.train()", f"_ = {net}({x})"]
    return lines


def _dead_sampler(ctx: Context, i: int) -> List[str]:
    """A value read, then rejection samplers (trunc_normal_, poisson) on temporaries whose values
    nothing keeps, then default-generator draws that follow them."""
    rows, cols = ctx.shape()
    lines = [f"x{i} = torch.randn({rows}, {cols})"]
    read = ctx.pick([f"float(x{i}.sum())", f"x{i}.abs().max().item()", f"float(x{i}.mean())"])
    read_first = ctx.rng.random() < 0.7
    if read_first:
        lines.append(f"v{i} = {read}")
    glines, g = _generator(ctx, i, "self")
    lines += glines
    for _ in range(ctx.rng.randint(1, 2)):
        k, m = ctx.shape()
        mean, std, a, b = ctx.pick(_TRUNC)
        gen = f", generator={g}" if g and ctx.rng.random() < 0.5 else ""
        lines.append(ctx.pick([
            f"nn.init.trunc_normal_(torch.empty({k}, {m}), mean={mean}, std={std}, a={a}, b={b}{gen})",
            f"t{i} = torch.empty({k}); nn.init.trunc_normal_(t{i}, std={std}{gen}); _ = t{i} * 2",
            f"_ = torch.poisson(torch.rand({k}) * 3{gen})",
            f"nn.init.trunc_normal_(x{i}.clone(), std={std}{gen})",
        ]))
    if not read_first:
        lines.append(f"v{i} = {read}")
    if ctx.rng.random() < 0.3:
        lines.append(f"w{i} = float(torch.randn(3).sum())")
    r2, c2 = ctx.shape()
    lines.append(f"self.d{i} = nn.Parameter(torch.randn({r2}, {c2}))")
    use = ctx.pick(["branch", "buffer", "none"])
    if use == "branch":
        lines += [f"if v{i} > {ctx.value()}:", f"    self.d{i}.data.mul_(0.5)"]
    elif use == "buffer":
        lines.append(f'self.register_buffer("v{i}", torch.tensor(v{i}))')
    return lines


def _data_real(ctx: Context, i: int) -> List[str]:
    """`.data =` a real tensor (torch.tensor of a list) on a recorded parameter, then writes
    through its views: p.data[0].fill_, p[1:].mul_ under no_grad, a column drawn."""
    rows, cols = ctx.rng.randint(2, 9), ctx.rng.randint(1, 5)
    values = [[ctx.value() for _ in range(cols)] for _ in range(rows)]
    kind = ctx.pick(["parameter", "linear", "vector"])
    if kind == "vector":
        real = f"torch.tensor({[row[0] for row in values]})"
        lines = [f"self.p{i} = nn.Parameter(torch.randn({ctx.rng.randint(1, 6)}))"]
        target = f"self.p{i}"
    elif kind == "linear":
        real = f"torch.tensor({values})"
        lines = [f"self.l{i} = nn.Linear({cols}, {rows})"]
        target = f"self.l{i}.weight"
    else:
        real = f"torch.tensor({values})"
        r0, c0 = ctx.pick([(rows, cols), ctx.shape()])
        lines = [f"self.p{i} = nn.Parameter(torch.randn({r0}, {c0}))"]
        target = f"self.p{i}"
    lines.append(f"{target}.data = {real}")
    writes = [
        f"{target}.data[0].fill_({ctx.value()})",
        f"{target}[1:].mul_({ctx.value()})",
        f"{target}.data[-1].normal_()",
        f"{target}[{ctx.rng.randrange(rows)}].uniform_(-1, 1)",
    ]
    if kind != "vector":
        writes += [f"{target}.data[:, 0].normal_()", f"{target}[:, -1:].add_(torch.randn({rows}, 1))"]
    lines.append("with torch.no_grad():")
    for _ in range(ctx.rng.randint(1, 3)):
        lines.append("    " + ctx.pick(writes))
    return lines


def _root_to_empty(ctx: Context, i: int, when: str) -> List[str]:
    """to_empty on the whole model, in the constructor or in after(m) (torchtitan's meta-device
    flow), then every parameter and buffer initialized again (in after(m) from a generator of its
    own: tensors built under the meta device are real there once to_empty ran)."""
    owner = "self" if when == "during" else "m"
    glines, g = _generator(ctx, i, owner, needed=owner == "m")
    gen = f", generator={g}" if g else ""
    init = ctx.pick([f"nn.init.trunc_normal_(_p, std=0.02{gen})", f"nn.init.normal_(_p, std=0.1{gen})",
                     f"nn.init.uniform_(_p, -0.1, 0.1{gen})"])
    body = [f'{owner}.to_empty(device="cpu")'] + glines + [
        f"for _p in {owner}.parameters():",
        f"    {init} if _p.is_floating_point() else _p.data.zero_()",
        f"for _b in {owner}.buffers():",
        "    _b.zero_()",
    ]
    ctx.bounds.clear()  # everything is written again (the loop's own bounds are not tracked)
    if when == "during":
        return body
    ctx.after_rewrites_all = True
    ctx.after.extend(body)
    return []


def trainer_flows(ctx: Context) -> List[str]:
    """What trainer code does around construction (issue 29): meta-device builds with to_empty
    at any depth and init after it, explicit generators given to every random op, forwards
    through norm layers in eval and train mode, dead rejection samplers after a value read,
    `.data =` real tensors written through views."""
    i = ctx.fresh()
    kind = ctx.pick(["meta", "meta", "meta_after", "draws", "norm", "dead", "data_real", "root"])
    if kind == "meta":
        return _meta_tree(ctx, i, "during")
    if kind == "meta_after":
        return _meta_tree(ctx, i, "after")
    if kind == "draws":
        return _draws(ctx, i)
    if kind == "norm":
        return _norm_forward(ctx, i)
    if kind == "dead":
        return _dead_sampler(ctx, i)
    if kind == "data_real":
        return _data_real(ctx, i)
    if ctx.rng.random() < 0.5:  # the whole model: rarer than the rest
        return _root_to_empty(ctx, i, ctx.pick(["during", "after"]))
    return _meta_tree(ctx, i, "after")


FAMILIES: Dict[str, Snippet] = {
    "basics": basics,
    "init": init,
    "modules": modules,
    "element_writes": element_writes,
    "bool_mask": bool_mask,
    "where_scalar": where_scalar,
    "unused_random": unused_random,
    "size_zero": size_zero,
    "real_written": real_written,
    "attributes": attributes,
    "ambient": ambient,
    "data_assign": data_assign,
    "tensor_of_0d": tensor_of_0d,
    "aliasing": aliasing,
    "generators": generators,
    "parametrizations": parametrizations,
    "deepcopies": deepcopies,
    "norm_train": norm_train,
    "conj_views": conj_views,
    "value_reads": value_reads,
    "after_init": after_init,
    "trainer_flows": trainer_flows,
}


@dataclass(frozen=True)
class Program:
    seed: int
    families: Tuple[str, ...]  # the family of each snippet, in order
    source: str
    # Context.bounds: (name, a, b) of tensors a trunc_normal_ wrote last (the counter check).
    bounds: Tuple[Tuple[str, float, float], ...] = ()
    # Context.fakes: tensors that must be fake when deferred_init returns (the torch check).
    fakes: Tuple[str, ...] = ()

    def namespace(self) -> Dict[str, object]:
        """Executes the source and returns its globals: M, after, GENERATORS."""
        namespace: Dict[str, object] = {}
        exec(compile(self.source, f"<fuzz program {self.seed}>", "exec"), namespace)
        return namespace

    def build(self) -> Tuple[type, Callable[[object], None]]:
        """Executes the source and returns the module class M and the function after(m) it
        defines."""
        namespace = self.namespace()
        return namespace["M"], namespace["after"]  # type: ignore[return-value]


def generate(seed: int, families: Sequence[str]) -> Program:
    """The program of `seed`: 1 to 4 snippets, each from one of `families`."""
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown fuzz families {unknown}; known: {sorted(FAMILIES)}")
    rng = random.Random(seed)
    ctx = Context(rng)
    chosen = tuple(ctx.pick(list(families)) for _ in range(rng.randint(1, 4)))
    body: List[str] = []
    for family in chosen:
        body.append(f"# {family}")
        body.extend(FAMILIES[family](ctx))
    lines = [HEADER, "", "class M(nn.Module):", "    def __init__(self):", "        super().__init__()"]
    lines += ["        " + line for line in body]
    lines += ["", "", "def after(m):"]
    lines += ["    " + line for line in ctx.after] if ctx.after else ["    pass"]
    if ctx.bounds:
        lines += ["", "", "# counter mode keeps these within [a, b] (trunc_normal_ wrote them last):"]
        lines += [f"# {name}: [{a}, {b}]" for name, a, b in ctx.bounds]
    if ctx.fakes:
        lines += ["", "", "# fake when deferred_init returns (to_empty inside the constructor made them):"]
        lines += [f"# {name}" for name in ctx.fakes]
    return Program(seed, chosen, "\n".join(lines) + "\n", tuple(ctx.bounds), tuple(ctx.fakes))
