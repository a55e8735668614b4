"""The differential checks one fuzz program goes through (docs/fuzzing.md, "What it checks").

1. ``torch``: ``torch.manual_seed(seed); m = M(); after(m)`` (eager) against
   ``m = deferred_init(M); after(m)`` then ``materialize_module`` in torch RNG mode: every parameter, buffer and tensor attribute (also
   inside lists, tuples and dicts) bitwise, with its dtype, shape, strides, ``requires_grad`` and
   type; which tensors share storage (and which are the same object); the default generator's
   state after construction, and that of every torch.Generator the module holds or the program
   made with ``make_generator`` (its ``GENERATORS``); a tensor eager leaves on the meta device
   stays a meta tensor, and one ``to_empty`` moved off it inside the constructor
   (``Program.fakes``) is a fake when ``deferred_init`` returns. A program on which eager raises must make ``deferred_init`` raise
   the same exception type.
2. ``child_first``: the same, with the program's submodules materialized one by one in a random
   order before the root.
3. ``counter``: every rank of ``Shard(r, W, dim)`` for a random ``W`` in {1, 2, 3, 7}, or of
   ``Shard(r, W, dim, padded=True)`` for ``W`` in {2, 3, 4, 7}: each parameter is its
   ``torch.chunk`` slice of the full counter-mode materialization, bitwise (padded with zeros to
   the chunk size), and every other tensor is the whole full-model tensor (or the slice its
   ``shard_info`` names); the tensors a ``trunc_normal_`` wrote last (``Program.bounds``) hold
   values within its ``[a, b]`` in the full counter-mode model.
"""

from __future__ import annotations

import random
import re
import traceback
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torchdefer

from .programs import Program

CHECKS = ("torch", "child_first", "counter")
WORLD_SIZES = (1, 2, 3, 7)
# Shard(r, W, padded=True), as FSDP2 pads: every rank's local tensor has the chunk size.
PADDED_WORLD_SIZES = (2, 3, 4, 7)


# Programs torchdefer refuses by design, with a message, while deferred_init runs: each entry is
# the start of the refusal's message and the documentation that states the refusal. A refusal
# counts as a pass only if it names one of these; any other exception where eager raised none is a
# mismatch.
DOCUMENTED_REFUSALS = {
    "torchdefer: `.data = fake` on a real tensor": "docs/python.md, `.data = fake`",
    # Note [Conjugate and negative views of fakes]: the recorder's message names the op, the
    # Python mode's the property.
    "torchdefer: aten::_conj of": "docs/python.md, conjugate views",
    "torchdefer: aten::mH of": "docs/python.md, conjugate views",
    "torchdefer: aten::matrix_H of": "docs/python.md, conjugate views",
    "torchdefer: aten::adjoint of": "docs/python.md, conjugate views",
    "torchdefer: .mH of": "docs/python.md, conjugate views",
    "torchdefer: .H of": "docs/python.md, conjugate views",
    "torchdefer: adjoint() of": "docs/python.md, conjugate views",
    # Note [Inference mode while recording]: a view, named by its op, or a module tensor made in
    # inference mode, named by its attribute.
    re.compile(r"torchdefer: (\S+ was called|\S+ of \S+ was made) under torch\.inference_mode\(\)"): (
        "docs/python.md, torch.inference_mode()"
    ),
}


def _documented_refusal(error: BaseException) -> bool:
    text = str(error)
    return any(
        start.match(text) if isinstance(start, re.Pattern) else text.startswith(start)
        for start in DOCUMENTED_REFUSALS
    )


@dataclass
class Outcome:
    """How one program fared: ``ok``, ``eager_raises`` (and deferred_init raised the same
    type: a pass), ``refused`` (deferred_init refused it with a documented message: a pass), or
    ``mismatch`` in ``check`` with ``message``."""

    program: Program
    status: str
    check: str = ""
    message: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "mismatch"

    def report(self) -> str:
        """A self-contained reproducer: the failure as a comment, then the program."""
        header = [
            f"# fuzz program seed={self.program.seed} families={','.join(self.program.families)}",
            f"# check: {self.check}",
        ]
        header += ["# " + line for line in self.message.strip().splitlines()]
        return "\n".join(header) + "\n" + self.program.source


class Mismatch(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Walking a module: every tensor reachable from it, by name.


def _tensors_in(value: Any, name: str) -> Iterator[Tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, (list, tuple)):
        for k, item in enumerate(value):
            yield from _tensors_in(item, f"{name}[{k}]")
    elif isinstance(value, dict):
        for k, item in value.items():
            yield from _tensors_in(item, f"{name}[{k!r}]")


def named_tensors(module: torch.nn.Module, prefix: str = "") -> Dict[str, Tuple[torch.Tensor, str]]:
    """name -> (tensor, role) for every parameter, buffer and tensor attribute of `module` and
    its children (shared ones under each of their names); role is parameter, buffer or attribute."""
    found: Dict[str, Tuple[torch.Tensor, str]] = {}
    for key, p in module._parameters.items():
        if p is not None:
            found[prefix + key] = (p, "parameter")
    for key, b in module._buffers.items():
        if b is not None:
            found[prefix + key] = (b, "buffer")
    for key, value in vars(module).items():
        if key.startswith("_"):
            continue
        for name, t in _tensors_in(value, prefix + key):
            found[name] = (t, "attribute")
    for key, child in module._modules.items():
        if child is not None:
            found.update(named_tensors(child, f"{prefix}{key}."))
    return found


def _bits(t: torch.Tensor) -> torch.Tensor:
    # A fresh copy: contiguous() keeps a tensor whose only odd stride is a size-1 dimension's,
    # which view(uint8) refuses.
    return torch.empty(t.shape, dtype=t.dtype).copy_(t.detach()).reshape(-1).view(torch.uint8)


def _describe(t: torch.Tensor) -> str:
    if torchdefer.is_fake(t):
        return repr(t)
    return f"{type(t).__name__} {t.dtype}{list(t.shape)} strides={t.stride()} requires_grad={t.requires_grad}"


def _significant_strides(t: torch.Tensor) -> Tuple[int, ...]:
    """The strides that address elements: those of dimensions longer than 1 (a dimension of size
    1 is never stepped along, and CPU and meta kernels may give it different strides)."""
    if t.numel() <= 1:
        return ()
    return tuple(stride for size, stride in zip(t.shape, t.stride()) if size > 1)


def _same_tensor(name: str, expected: torch.Tensor, got: torch.Tensor, strict: bool = True) -> None:
    if torchdefer.is_fake(got):
        raise Mismatch(f"{name}: still fake after materialize_module ({_describe(got)})")
    if expected.is_meta or got.is_meta:
        # Built on the meta device and never moved (no to_empty): meta in eager, so meta here.
        if not (expected.is_meta and got.is_meta) or expected.dtype != got.dtype or expected.shape != got.shape:
            raise Mismatch(f"{name}: expected {_describe(expected)} on {expected.device}, got {_describe(got)} "
                           f"on {got.device}")
        if strict and (type(expected) is not type(got) or expected.requires_grad != got.requires_grad):
            raise Mismatch(f"{name}: expected {_describe(expected)}, got {_describe(got)}")
        return
    if expected.dtype != got.dtype or expected.shape != got.shape:
        raise Mismatch(f"{name}: expected {_describe(expected)}, got {_describe(got)}")
    if not torch.equal(_bits(expected), _bits(got)):
        raise Mismatch(f"{name}: values differ\n  expected {expected.detach().flatten()[:8].tolist()}\n"
                       f"  got      {got.detach().flatten()[:8].tolist()}")
    if strict and (type(expected) is not type(got) or expected.requires_grad != got.requires_grad
                   or _significant_strides(expected) != _significant_strides(got)):
        raise Mismatch(f"{name}: expected {_describe(expected)}, got {_describe(got)}")


def _sharing(tensors: Dict[str, Tuple[torch.Tensor, str]]) -> Tuple[List[List[str]], List[List[str]]]:
    """Groups of names that share one storage (non-empty ones), and groups that are one object."""
    by_storage: Dict[int, List[str]] = {}
    by_object: Dict[int, List[str]] = {}
    for name, (t, _) in tensors.items():
        by_object.setdefault(id(t), []).append(name)
        if torchdefer.is_fake(t) or t.is_meta or t.untyped_storage().nbytes() == 0:
            continue
        by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(name)
    groups = lambda d: sorted(sorted(g) for g in d.values() if len(g) > 1)  # noqa: E731
    return groups(by_storage), groups(by_object)


def named_generators(module: torch.nn.Module) -> Dict[str, torch.Generator]:
    """name -> every torch.Generator held as an attribute of `module` or a descendant."""
    return {f"{prefix}.{key}" if prefix else key: value
            for prefix, sub in module.named_modules() for key, value in vars(sub).items()
            if isinstance(value, torch.Generator)}


def generator_states(made: List[torch.Generator]) -> List[torch.Tensor]:
    """The states of the generators the program made (its GENERATORS, make_generator's list)."""
    return [g.get_state() for g in made]


def _same_generators(when: str, expected: List[torch.Tensor], made: List[torch.Generator]) -> None:
    got = generator_states(made)
    if len(got) != len(expected):
        raise Mismatch(f"{when}: the program made {len(got)} generators, eager {len(expected)}")
    for k, (e, g) in enumerate(zip(expected, got)):
        if not torch.equal(e, g):
            raise Mismatch(f"{when}: generator {k} (GENERATORS[{k}]) is not where eager left it")


def compare_modules(eager: torch.nn.Module, deferred: torch.nn.Module) -> None:
    # Explicit generators (Note [Explicit generators]): where eager construction left them.
    expected_generators, got_generators = named_generators(eager), named_generators(deferred)
    for name, generator in expected_generators.items():
        if not torch.equal(generator.get_state(), got_generators[name].get_state()):
            raise Mismatch(f"generator {name}: not where eager construction left it")
    expected, got = named_tensors(eager), named_tensors(deferred)
    if expected.keys() != got.keys():
        raise Mismatch(f"tensor names differ: eager only {sorted(expected.keys() - got.keys())}, "
                       f"deferred only {sorted(got.keys() - expected.keys())}")
    for name, (t, _) in expected.items():
        _same_tensor(name, t, got[name][0])
    e_storage, e_object = _sharing(expected)
    d_storage, d_object = _sharing(got)
    if e_object != d_object:
        raise Mismatch(f"tied tensors differ: eager {e_object}, deferred {d_object}")
    if e_storage != d_storage:
        raise Mismatch(f"shared storages differ: eager {e_storage}, deferred {d_storage}")


# ---------------------------------------------------------------------------------------------
# The checks.


def _record(cls: type, after, seed: int, made: List[torch.Generator], exact_generator: bool = False,
            built: Optional[List[torch.Tensor]] = None, fakes: Tuple[str, ...] = ()) -> torch.nn.Module:
    """deferred_init of the program's M, then its after(m) on the returned model; with `built`,
    the generators the constructor made must be where eager's left them before after(m) runs,
    and the tensors named in `fakes` must be fake then."""
    made.clear()
    torch.manual_seed(seed)
    model = torchdefer.deferred_init(cls, exact_generator=exact_generator)
    if built is not None:
        _same_generators("after deferred_init", built, made)
    if fakes:
        tensors = named_tensors(model)
        for name in fakes:
            if not torchdefer.is_fake(tensors[name][0]):
                raise Mismatch(f"{name}: real when deferred_init returned ({_describe(tensors[name][0])} on "
                               f"{tensors[name][0].device}); to_empty inside the constructor made it, and only "
                               "recorded ops wrote it")
    after(model)
    return model


def _check_torch(cls: type, after, seed: int, made: List[torch.Generator], eager: torch.nn.Module,
                 built_state: torch.Tensor, eager_state: torch.Tensor, built_gens: List[torch.Tensor],
                 eager_gens: List[torch.Tensor], fakes: Tuple[str, ...] = ()) -> None:
    # Both generator policies (Note [The generator after deferred_init]): exact_generator=True
    # leaves the generator where eager does as deferred_init returns; by default a recording with
    # rejection samplers owes it until the first torch-mode materialization pays it. A rejection
    # sampler run after deferred_init returned (trunc_normal_ in after(m)) owes it by default, and
    # is resolved at once on a recording made with exact_generator=True.
    # The generators the program made (make_generator) move as eager moves them when the ops are
    # recorded, never owed (Note [Explicit generators]), and materializing moves none of them.
    made.clear()
    torch.manual_seed(seed)
    exact = torchdefer.deferred_init(cls, exact_generator=True)
    if not torch.equal(torch.get_rng_state(), built_state):
        raise Mismatch("the default generator after deferred_init(exact_generator=True) is not where "
                       "eager construction left it")
    _same_generators("after deferred_init(exact_generator=True)", built_gens, made)
    after(exact)
    if not torch.equal(torch.get_rng_state(), eager_state):
        raise Mismatch("the default generator after after(m) on a deferred_init(exact_generator=True) "
                       "model is not where eager's after(m) left it")
    _same_generators("after after(m) on a deferred_init(exact_generator=True) model", eager_gens, made)
    torchdefer.materialize_module(exact)
    if not torch.equal(torch.get_rng_state(), eager_state):
        raise Mismatch("materialize_module moved the default generator")
    _same_generators("after materialize_module", eager_gens, made)
    compare_modules(eager, exact)
    deferred = _record(cls, after, seed, made, built=built_gens, fakes=fakes)
    _same_generators("after after(m)", eager_gens, made)
    owed = not torch.equal(torch.get_rng_state(), eager_state)
    torchdefer.materialize_module(deferred)
    if not torch.equal(torch.get_rng_state(), eager_state):
        raise Mismatch("materialize_module did not pay the owed default generator" if owed else
                       "materialize_module moved the default generator")
    _same_generators("after materialize_module", eager_gens, made)
    compare_modules(eager, deferred)


def _check_child_first(cls: type, after, seed: int, made: List[torch.Generator], eager: torch.nn.Module,
                       rng: random.Random) -> None:
    deferred = _record(cls, after, seed, made)
    children = [m for name, m in deferred.named_modules() if name]
    rng.shuffle(children)
    for child in children[: rng.randint(1, max(1, len(children)))]:
        torchdefer.materialize_module(child)
    torchdefer.materialize_module(deferred)
    compare_modules(eager, deferred)


def _chunk_box(size: int, world: int, rank: int) -> Tuple[int, int]:
    chunk = -(-size // world)
    start = min(rank * chunk, size)
    return start, min(start + chunk, size)


def _padded_to(part: torch.Tensor, shape: Tuple[int, ...]) -> torch.Tensor:
    """`part` at the start of a zero tensor of `shape` (a padded shard: zero past the end)."""
    if tuple(part.shape) == tuple(shape):
        return part
    if part.is_meta:
        return torch.empty(shape, dtype=part.dtype, device="meta")
    out = torch.zeros(shape, dtype=part.dtype)
    region = out
    for d, size in enumerate(part.shape):
        region = region.narrow(d, 0, size)
    region.copy_(part)
    return out


def _check_bounds(bounds, full: Dict[str, Tuple[torch.Tensor, str]]) -> None:
    """Counter-mode truncated normals (Note [Counter-mode truncated normal]) within their [a, b]."""
    for name, a, b in bounds:
        if name not in full:
            raise Mismatch(f"{name}: the program's bounds name a tensor the model does not hold")
        t = full[name][0].detach()
        low, high = torch.tensor(a, dtype=t.dtype), torch.tensor(b, dtype=t.dtype)
        outside = (t < low) | (t > high) | t.isnan()
        if bool(outside.any()):
            raise Mismatch(f"{name}: counter mode put {int(outside.sum())} of {t.numel()} values outside "
                           f"trunc_normal_'s [{a}, {b}]: {t[outside].flatten()[:4].tolist()}")


def _check_counter(cls: type, after, seed: int, made: List[torch.Generator], rng: random.Random,
                   bounds=()) -> str:
    world, dim = rng.choice(WORLD_SIZES), rng.randint(0, 1)
    # Drawn after the others, so that the unpadded layouts are those of the runs before it.
    padded = rng.random() < 0.5
    if padded:
        world = rng.choice(PADDED_WORLD_SIZES)
    full_module = _record(cls, after, seed, made)
    torchdefer.materialize_module(full_module, rng="counter")
    full = named_tensors(full_module)
    _check_bounds(bounds, full)
    for rank in range(world):
        part_module = _record(cls, after, seed, made)
        torchdefer.materialize_module(part_module, shard=torchdefer.Shard(rank, world, dim=dim, padded=padded))
        part = named_tensors(part_module)
        for name, (whole, role) in full.items():
            local = part[name][0]
            where = f"{name} (rank {rank} of Shard(W={world}, dim={dim}{', padded' if padded else ''}), {role})"
            if torchdefer.is_fake(local):
                raise Mismatch(f"{where}: still fake after materialize_module")
            expected = whole
            info = torchdefer.shard_info(local)
            if role == "parameter" and whole.dim() > dim:
                start, stop = _chunk_box(whole.shape[dim], world, rank)
                expected = whole.narrow(dim, start, stop - start)
                if padded:
                    shape = list(whole.shape)
                    shape[dim] = -(-whole.shape[dim] // world)
                    expected = _padded_to(expected, tuple(shape))
            elif info is not None:
                for d, (start, stop) in enumerate(zip(*info["box"])):
                    expected = expected.narrow(d, start, stop - start)
                if info.get("padded"):
                    expected = _padded_to(expected, tuple(local.shape))
            _same_tensor(where, expected, local, strict=False)
    return f"W={world} dim={dim}{' padded' if padded else ''}"


def _exception_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def run_program(program: Program, checks: Tuple[str, ...] = CHECKS) -> Outcome:
    """Runs `program` through `checks` and says how it fared; never raises for a mismatch."""
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise ValueError(f"unknown fuzz checks {unknown}; known: {list(CHECKS)}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        namespace = program.namespace()
        cls, after = namespace["M"], namespace["after"]
        made: List[torch.Generator] = namespace.get("GENERATORS", [])  # type: ignore[assignment]
        rng = random.Random(program.seed ^ 0x5EED)
        try:
            torch.manual_seed(program.seed)
            eager = cls()
            built_state = torch.get_rng_state()
            built_gens = generator_states(made)
            after(eager)
            eager_state = torch.get_rng_state()
            eager_gens = generator_states(made)
        except Exception as eager_error:  # noqa: BLE001 (any exception eager raises is the reference)
            try:
                _record(cls, after, program.seed, made)
            except Exception as deferred_error:  # noqa: BLE001
                if type(deferred_error) is type(eager_error):
                    return Outcome(program, "eager_raises")
                if _documented_refusal(deferred_error):  # refused before eager's error point
                    return Outcome(program, "refused", "torch", _exception_line(deferred_error))
                return Outcome(program, "mismatch", "torch", f"eager raised {_exception_line(eager_error)}\n"
                               f"deferred_init raised {_exception_line(deferred_error)}")
            return Outcome(program, "mismatch", "torch",
                           f"eager raised {_exception_line(eager_error)}; deferred_init did not")
        for check in checks:
            try:
                if check == "torch":
                    _check_torch(cls, after, program.seed, made, eager, built_state, eager_state, built_gens,
                                 eager_gens, program.fakes)
                elif check == "child_first":
                    _check_child_first(cls, after, program.seed, made, eager, rng)
                else:
                    _check_counter(cls, after, program.seed, made, rng, program.bounds)
            except Mismatch as mismatch:
                return Outcome(program, "mismatch", check, str(mismatch))
            except Exception as error:  # noqa: BLE001 (eager did not raise, so torchdefer must not)
                if _documented_refusal(error):
                    return Outcome(program, "refused", check, _exception_line(error))
                frames = traceback.format_exception_only(type(error), error)
                return Outcome(program, "mismatch", check, "torchdefer raised (eager did not): "
                               + "".join(frames).strip())
    return Outcome(program, "ok")


def run_seed(seed: int, families: Tuple[str, ...], checks: Tuple[str, ...] = CHECKS) -> Outcome:
    from .programs import generate

    return run_program(generate(seed, families), checks)



def init_worker() -> None:
    """One thread per fuzzing process: the long run parallelizes across processes."""
    torch.set_num_threads(1)


def run_job(job: Tuple[int, Tuple[str, ...], Tuple[str, ...]]) -> Outcome:
    """run_seed on (seed, families, checks), for a process pool."""
    return run_seed(*job)
