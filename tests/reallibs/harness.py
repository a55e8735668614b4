"""The checks every real-library case runs: eager construction against deferred_init +
materialize_module in torch RNG mode, and counter-mode shards against the full counter model.

A case is a callable that builds one module from a small config; it must draw everything it
needs from the global generator (no weights, no network)."""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Optional, Tuple

import pytest
import torch
import torchdefer

Build = Callable[[], torch.nn.Module]
WORLD_SIZES = (1, 2, 3, 7)
_MODULE_SLOTS = ("_parameters", "_buffers", "_modules")


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    # A fresh flat copy: contiguous() keeps a size-1 dimension's stride (0 when expanded), which
    # view(uint8) refuses (BoTorch's KroneckerMultiTaskGP holds such a buffer).
    flat = dict(memory_format=torch.contiguous_format)
    return torch.equal(a.detach().reshape(-1).clone(**flat).view(torch.uint8),
                       b.detach().reshape(-1).clone(**flat).view(torch.uint8))


def state(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """Every parameter and buffer under every name it has (tied ones twice), persistent or not."""
    out: Dict[str, torch.Tensor] = {}
    out.update(module.named_parameters(remove_duplicate=False))
    out.update(module.named_buffers(remove_duplicate=False))
    return out


def _tensors_in(value, path: str, depth: int = 0) -> Iterator[Tuple[str, torch.Tensor]]:
    if isinstance(value, torch.nn.Parameter):
        return  # a parameter held as a plain attribute is also registered, and checked there
    if isinstance(value, torch.Tensor):
        yield path, value
    elif depth < 2 and isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _tensors_in(item, f"{path}[{i}]", depth + 1)
    elif depth < 2 and isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors_in(item, f"{path}[{key!r}]", depth + 1)


def attribute_tensors(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """Tensors a module holds as plain attributes (not parameters or buffers), also inside
    lists, tuples and dicts: rotary tables, position ids, masks kept for the forward."""
    out: Dict[str, torch.Tensor] = {}
    for name, sub in module.named_modules(remove_duplicate=False):
        for key, value in vars(sub).items():
            if key not in _MODULE_SLOTS:
                out.update(_tensors_in(value, f"{name}.{key}" if name else key))
    return out


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.numel() > 0 and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _compare(kind: str, eager: Dict[str, torch.Tensor], other: Dict[str, torch.Tensor],
             problems: List[str]) -> None:
    if eager.keys() != other.keys():
        eager_only = sorted(eager.keys() - other.keys())[:5]
        deferred_only = sorted(other.keys() - eager.keys())[:5]
        problems.append(f"{kind} names differ: eager only {eager_only}, "
                        f"deferred only {deferred_only}")
    for key in eager.keys() & other.keys():
        value = other[key]
        if torchdefer.is_fake(value):
            problems.append(f"{kind} {key} is still fake after materialize_module")
        elif _same_memory(eager[key], value):
            # A library's process-wide state (Pyro's parameter store) handed the eager model's
            # tensor to the deferred construction: equal, but nothing was recorded or replayed.
            problems.append(f"{kind} {key} is the eager model's own memory: the case keeps "
                            "state between constructions")
        elif not bitwise_equal(eager[key], value):
            problems.append(f"{kind} {key} {tuple(value.shape)} {value.dtype} differs from eager")


def check_torch_mode(build: Build, seed: int = 0) -> None:
    """deferred_init + materialize_module (torch mode) equals eager construction bit for bit:
    every parameter and buffer, every tensor attribute, and the generator state afterwards. Right
    after deferred_init the generator is where eager leaves it with exact_generator=True; without
    it, a recorded value-dependent sampler (trunc_normal_) leaves it owed until materialization
    (Note [The generator after deferred_init])."""
    torch.manual_seed(seed)
    eager = build()
    eager_rng = torch.get_rng_state()
    torch.manual_seed(seed)
    torchdefer.deferred_init(build, exact_generator=True)
    recorded_rng = torch.get_rng_state()
    torch.manual_seed(seed)
    deferred = torchdefer.deferred_init(build)
    torchdefer.materialize_module(deferred)
    materialized_rng = torch.get_rng_state()

    problems: List[str] = []
    if torchdefer.is_deferred(deferred):
        problems.append("is_deferred is still True after materialize_module")
    _compare("tensor", state(eager), state(deferred), problems)
    _compare("attribute", attribute_tensors(eager), attribute_tensors(deferred), problems)
    if not torch.equal(eager_rng, recorded_rng):
        problems.append("generator state after deferred_init(exact_generator=True) differs from eager's")
    if not torch.equal(eager_rng, materialized_rng):
        problems.append("generator state after materialize_module differs from eager's")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(sorted(problems)[:12])


def _place_shards(full: torch.Tensor, locals_: List[torch.Tensor], name: str,
                  problems: List[str]) -> None:
    """Each rank's piece is the box of the full tensor that shard_info names; together the boxes
    cover every element exactly once. A piece without shard_info must be the whole tensor."""
    covered = torch.zeros(full.shape, dtype=torch.int32)
    for rank, local in enumerate(locals_):
        info = torchdefer.shard_info(local)
        if info is None:
            if not bitwise_equal(full, local):
                problems.append(f"{name}: rank {rank} holds it whole, but not the full value")
            covered += 1
            continue
        if tuple(info["global_shape"]) != tuple(full.shape):
            problems.append(f"{name}: rank {rank} global shape {info['global_shape']}")
            return
        starts, stops = info["box"]
        index = tuple(slice(start, stop) for start, stop in zip(starts, stops))
        if not bitwise_equal(full[index], local):
            problems.append(f"{name}: rank {rank} box {info['box']} differs from the full model")
        covered[index] += 1
    once, everywhere = bool((covered == 1).all()), bool((covered == len(locals_)).all())
    if full.numel() and not once and not everywhere:
        problems.append(f"{name}: the ranks' boxes do not cover it exactly once")


def check_shards(build: Build, seed: int = 0, world_sizes=WORLD_SIZES) -> None:
    """Counter-mode shards on W ranks put together equal the full counter-mode model, for each W."""

    def record() -> torch.nn.Module:
        torch.manual_seed(seed)
        return torchdefer.deferred_init(build)

    full = record()
    torchdefer.materialize_module(full, rng="counter")
    full_state = state(full)
    problems: List[str] = []
    for world in world_sizes:
        ranks = []
        for rank in range(world):
            local = record()
            torchdefer.materialize_module(local, shard=torchdefer.Shard(rank, world))
            if torchdefer.is_deferred(local):
                problems.append(f"W={world} rank {rank}: is_deferred is still True")
            ranks.append(state(local))
        for name, value in full_state.items():
            pieces = [r.get(name) for r in ranks]
            if any(p is None for p in pieces):
                problems.append(f"W={world} {name}: missing on some rank")
            elif any(torchdefer.is_fake(p) for p in pieces):
                problems.append(f"W={world} {name}: still fake on some rank")
            else:
                _place_shards(value, pieces, f"W={world} {name}", problems)
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(sorted(problems)[:12])


def library_tests(cases: Dict[str, Build], world_sizes: Optional[Dict[str, Tuple[int, ...]]] = None):
    """A library file's two tests, parametrized over its cases: torch mode against eager, and
    shards against the full counter model (over `world_sizes[case]` where a case names its own).
    A file binds them to the names pytest collects:

        test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
            library_tests(CASES))
    """
    own_world_sizes = world_sizes or {}

    @pytest.mark.parametrize("case", list(cases))
    def test_torch_mode_equals_eager(case):
        check_torch_mode(cases[case])

    @pytest.mark.parametrize("case", list(cases))
    def test_shards_concatenate_to_the_full_counter_model(case):
        check_shards(cases[case], world_sizes=own_world_sizes.get(case, WORLD_SIZES))

    return test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model
