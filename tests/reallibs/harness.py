"""The checks every real-library case runs: eager construction against deferred_init +
materialize_module in torch RNG mode, and counter-mode shards against the full counter model.

A case is a callable that builds one module from a small config; it must draw everything it
needs from the global generator (no weights, no network).

A trainer-flow case (`library_tests(FLOWS, trainer_flow=True)`) is a callable `flow(seed)` that
runs a library's trainer as it builds its model: on the meta device (`with torch.device("meta")`
or the library's own meta init), `to_empty(device="cpu")`, then the library's own init
(`init_weights()`, `reset_parameters()`), drawing from a `torch.Generator` of the library's own
seeded with `seed` where the library makes one (`seed` is ignored where it uses the default
generator). It returns the model and the library's generators by name (`{}` when it has none).
Such cases run two checks more: every tensor is fake after deferred_init, and counter mode keeps
what each init call promised (bounds, mean, std) and follows the generators' seeds."""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

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


Generators = Dict[str, torch.Generator]


def _split(result: Union[torch.nn.Module, Tuple[torch.nn.Module, Generators]]
           ) -> Tuple[torch.nn.Module, Generators]:
    """A case's result: a module, or a trainer flow's (module, its library's generators)."""
    return result if isinstance(result, tuple) else (result, {})


def _generator_states(generators: Generators) -> Dict[str, torch.Tensor]:
    return {name: g.get_state() for name, g in generators.items()}


def _compare_generators(when: str, eager: Dict[str, torch.Tensor], other: Dict[str, torch.Tensor],
                        problems: List[str]) -> None:
    for name, value in eager.items():
        if name not in other or not torch.equal(value, other[name]):
            problems.append(f"the library's generator {name!r} {when} differs from eager's")


def check_torch_mode(build: Build, seed: int = 0) -> None:
    """deferred_init + materialize_module (torch mode) equals eager construction bit for bit:
    every parameter and buffer, every tensor attribute, and the generator state afterwards. Right
    after deferred_init the generator is where eager leaves it with exact_generator=True; without
    it, a recorded value-dependent sampler (trunc_normal_) leaves it owed until materialization
    (Note [The generator after deferred_init]). A trainer flow's own generators are compared
    too: after deferred_init (with and without exact_generator) and after materialize_module."""
    torch.manual_seed(seed)
    eager, eager_generators = _split(build())
    eager_rng = torch.get_rng_state()
    eager_states = _generator_states(eager_generators)
    torch.manual_seed(seed)
    _, exact_generators = _split(torchdefer.deferred_init(build, exact_generator=True))
    recorded_rng = torch.get_rng_state()
    recorded_states = _generator_states(exact_generators)
    torch.manual_seed(seed)
    deferred, generators = _split(torchdefer.deferred_init(build))
    owed_states = _generator_states(generators)
    torchdefer.materialize_module(deferred)
    materialized_rng = torch.get_rng_state()
    materialized_states = _generator_states(generators)

    problems: List[str] = []
    if torchdefer.is_deferred(deferred):
        problems.append("is_deferred is still True after materialize_module")
    _compare("tensor", state(eager), state(deferred), problems)
    _compare("attribute", attribute_tensors(eager), attribute_tensors(deferred), problems)
    if not torch.equal(eager_rng, recorded_rng):
        problems.append("generator state after deferred_init(exact_generator=True) differs from eager's")
    if not torch.equal(eager_rng, materialized_rng):
        problems.append("generator state after materialize_module differs from eager's")
    _compare_generators("after deferred_init(exact_generator=True)", eager_states,
                        recorded_states, problems)
    _compare_generators("after deferred_init", eager_states, owed_states, problems)
    _compare_generators("after materialize_module", eager_states, materialized_states, problems)
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
        return _split(torchdefer.deferred_init(build))[0]

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


def check_fake_after_deferred_init(build: Build, seed: int = 0) -> None:
    """Right after deferred_init every parameter, buffer and tensor attribute is fake (nothing a
    trainer flow's to_empty or init allocated for real) and is_deferred is True."""
    torch.manual_seed(seed)
    model, _ = _split(torchdefer.deferred_init(build))
    problems: List[str] = []
    if not torchdefer.is_deferred(model):
        problems.append("is_deferred is False right after deferred_init")
    for kind, tensors in (("tensor", state(model)), ("attribute", attribute_tensors(model))):
        for name, value in tensors.items():
            if not torchdefer.is_fake(value):
                problems.append(f"{kind} {name} {tuple(value.shape)} {value.dtype} on "
                                f"{value.device} is real after deferred_init")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(sorted(problems)[:12])


# --- What an init call promises ------------------------------------------------------------------
# The eager run of a trainer flow is watched with sys.setprofile: each call of a torch.nn.init
# function below (however the library refers to it) is noted with its arguments, and the tensor's
# value when it returns. A parameter or buffer whose final eager value is that value (the call was
# its last writer) carries the call's promise, which its counter-mode value must keep too.

_PROMISING = ("trunc_normal_", "normal_", "uniform_", "constant_", "zeros_", "ones_",
              "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_")


class Promise:
    """A distribution (normal, trunc_normal, uniform) or a constant, and whether its draws came
    from a generator of the library's own (`generator=` other than the default one)."""

    def __init__(self, kind: str, call: str, own_generator: bool, **params: float):
        self.kind, self.call, self.own_generator, self.params = kind, call, own_generator, params

    @property
    def random(self) -> bool:
        return self.kind != "constant"

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v:.4g}" for k, v in self.params.items())
        return f"{self.call}({args}{', own generator' if self.own_generator else ''})"

    def moments(self) -> Tuple[float, float]:
        p = self.params
        if self.kind == "normal":
            return p["mean"], p["std"]
        if self.kind == "uniform":
            return (p["a"] + p["b"]) / 2, (p["b"] - p["a"]) / math.sqrt(12)
        mu, sigma = p["mean"], p["std"]
        alpha, beta = (p["a"] - mu) / sigma, (p["b"] - mu) / sigma
        pdf = lambda x: 0.0 if math.isinf(x) else math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        cdf = lambda x: (1 + math.erf(x / math.sqrt(2))) / 2
        xpdf = lambda x: 0.0 if math.isinf(x) else x * pdf(x)
        mass = cdf(beta) - cdf(alpha)
        shift = (pdf(alpha) - pdf(beta)) / mass
        var = 1 + (xpdf(alpha) - xpdf(beta)) / mass - shift * shift
        return mu + sigma * shift, sigma * math.sqrt(var)

    def broken_by(self, value: torch.Tensor) -> Optional[str]:
        """What `value` does that the promise rules out, or None."""
        v = value.detach().double().reshape(-1)
        if v.numel() == 0:
            return None
        if self.kind == "constant":
            return None if bool((v == self.params["value"]).all()) else "not the constant"
        lo, hi = self.params.get("a", -math.inf), self.params.get("b", math.inf)
        if self.kind != "normal" and (float(v.min()) < lo or float(v.max()) > hi):
            return f"values outside [{lo:.4g}, {hi:.4g}]: min {float(v.min()):.4g}, max {float(v.max()):.4g}"
        if v.numel() < 32:
            return None
        # Six standard errors: a sample's mean and standard deviation stray further than that with
        # a probability of about 1e-9 each, so a tensor that does is not drawn as promised.
        mean, std = self.moments()
        n = v.numel()
        got_mean, got_std = float(v.mean()), float(v.std())
        slack = 1e-6 * max(std, abs(mean), 1e-12)
        if abs(got_mean - mean) > 6 * std / math.sqrt(n) + slack:
            return f"mean {got_mean:.4g}, promised {mean:.4g} (n={n})"
        if abs(got_std - std) > 6 * std / math.sqrt(2 * n) + slack:
            return f"std {got_std:.4g}, promised {std:.4g} (n={n})"
        return None


def _promise_of(call: str, args: Dict[str, Any]) -> Optional[Promise]:
    init = torch.nn.init
    generator = args.get("generator")
    own = generator is not None and generator is not torch.default_generator
    tensor = args["tensor"]
    if call == "trunc_normal_":
        return Promise("trunc_normal", call, own, mean=float(args["mean"]), std=float(args["std"]),
                       a=float(args["a"]), b=float(args["b"]))
    if call == "normal_":
        return Promise("normal", call, own, mean=float(args["mean"]), std=float(args["std"]))
    if call == "uniform_":
        return Promise("uniform", call, own, a=float(args["a"]), b=float(args["b"]))
    if call in ("constant_", "zeros_", "ones_"):
        return Promise("constant", call, False, value=float(args.get("val", call == "ones_")))
    if call.startswith("kaiming_"):
        fan = init._calculate_correct_fan(tensor, args["mode"])
        std = init.calculate_gain(args["nonlinearity"], args["a"]) / math.sqrt(fan)
    else:
        fan_in, fan_out = init._calculate_fan_in_and_fan_out(tensor)
        std = float(args["gain"]) * math.sqrt(2.0 / (fan_in + fan_out))
    if call.endswith("uniform_"):
        return Promise("uniform", call, own, a=-math.sqrt(3) * std, b=math.sqrt(3) * std)
    return Promise("normal", call, own, mean=0.0, std=std)


def _where(t: torch.Tensor) -> Tuple[Any, ...]:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def observe_promises(build: Build, seed: int = 0
                     ) -> Tuple[torch.nn.Module, Dict[str, Promise]]:
    """Runs `build` eagerly after torch.manual_seed(seed), noting each torch.nn.init call; returns
    the model and, by name, the promise of each tensor whose last writer was such a call."""
    codes = {getattr(torch.nn.init, name).__code__: name for name in _PROMISING}
    open_calls: List[Tuple[Any, str, Optional[Promise]]] = []
    notes: Dict[Tuple[Any, ...], Tuple[Promise, torch.Tensor]] = {}

    def profile(frame, event, arg):
        name = codes.get(frame.f_code)
        if name is None or event not in ("call", "return"):
            return
        if event == "call":
            args = frame.f_locals
            nested = bool(open_calls)  # kaiming_* and friends calling another: the outer one counts
            promise = None if nested or not isinstance(args.get("tensor"), torch.Tensor) else (
                _promise_of(name, args))
            open_calls.append((frame, name, promise))
        elif open_calls and open_calls[-1][0] is frame:
            _, _, promise = open_calls.pop()
            if promise is not None:
                tensor = frame.f_locals["tensor"].detach()
                notes[_where(tensor)] = (promise, tensor.clone())

    torch.manual_seed(seed)
    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        model, _ = _split(build())
    finally:
        sys.setprofile(previous)
    promises: Dict[str, Promise] = {}
    for name, value in state(model).items():
        note = notes.get(_where(value.detach()))
        if note is not None and bitwise_equal(note[1], value):
            promises[name] = note[0]
    return model, promises


def check_counter_promises(flow: Callable[[int], Any], library_seeds: Tuple[int, int] = (1, 2)
                           ) -> None:
    """Counter mode keeps each init call's promise (truncated normals inside [a, b], the
    distribution's mean and std; the eager model keeps it too, or the tolerance is at fault), and
    follows the seeds as eager does: a tensor drawn from the library's own generator changes with
    that generator's seed and not with the default generator's; one drawn from the default
    generator the other way round."""
    s1, s2 = library_seeds
    eager, promises = observe_promises(lambda: flow(s1))
    problems: List[str] = []
    if not promises:
        problems.append("no init call of torch.nn.init was the last writer of any tensor")

    real: List[str] = []

    def counter(default_seed: int, library_seed: int) -> Dict[str, torch.Tensor]:
        torch.manual_seed(default_seed)
        model, _ = _split(torchdefer.deferred_init(flow, library_seed))
        real[:] = [name for name, value in state(model).items() if not torchdefer.is_fake(value)]
        torchdefer.materialize_module(model, rng="counter")
        return state(model)

    base, other_library, other_default = counter(0, s1), counter(0, s2), counter(1, s1)
    eager_state = state(eager)
    for name, promise in sorted(promises.items()):
        broken = promise.broken_by(eager_state[name])
        if broken:
            problems.append(f"{name}: eager breaks {promise} too ({broken}): the check is wrong")
        if name in real:  # eager's values, drawn while recording: nothing here is counter mode's
            problems.append(f"{name}: real after deferred_init, so counter mode filled nothing")
            continue
        value = base.get(name)
        if value is None or torchdefer.is_fake(value):
            problems.append(f"{name}: missing or fake in the counter model")
            continue
        broken = promise.broken_by(value)
        if broken:
            problems.append(f"{name}: counter mode breaks {promise}: {broken}")
        if not promise.random or value.numel() < 2:
            continue
        same_library = bitwise_equal(value, other_library[name])
        same_default = bitwise_equal(value, other_default[name])
        if promise.own_generator and same_library:
            problems.append(f"{name} ({promise}): the same counter values for the library's "
                            f"generator seeded {s1} and {s2}")
        if promise.own_generator and not same_default:
            problems.append(f"{name} ({promise}): the counter values change with the default "
                            "generator's seed, which eager's do not")
        if not promise.own_generator and same_default:
            problems.append(f"{name} ({promise}): the same counter values for default seeds 0 and 1")
        if not promise.own_generator and not same_library:
            problems.append(f"{name} ({promise}): the counter values change with the library "
                            "generator's seed, which eager's do not")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:16])


# The library seed a trainer flow's torch mode, shard and fake checks run it with.
FLOW_SEED = 1


def library_tests(cases: Dict[str, Callable[..., Any]],
                  world_sizes: Optional[Dict[str, Tuple[int, ...]]] = None,
                  trainer_flow: bool = False):
    """A library file's two tests, parametrized over its cases: torch mode against eager, and
    shards against the full counter model (over `world_sizes[case]` where a case names its own).
    A file binds them to the names pytest collects:

        test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
            library_tests(CASES))

    With trainer_flow=True the cases are trainer flows, `flow(seed) -> (module, generators)`
    (module docstring), run with the library seed FLOW_SEED, and two tests more are returned:
    test_every_tensor_is_fake_after_deferred_init and test_counter_mode_keeps_the_init_promise.
    """
    own_world_sizes = world_sizes or {}
    build = (lambda case: lambda: cases[case](FLOW_SEED)) if trainer_flow else cases.__getitem__

    @pytest.mark.parametrize("case", list(cases))
    def test_torch_mode_equals_eager(case):
        check_torch_mode(build(case))

    @pytest.mark.parametrize("case", list(cases))
    def test_shards_concatenate_to_the_full_counter_model(case):
        check_shards(build(case), world_sizes=own_world_sizes.get(case, WORLD_SIZES))

    if not trainer_flow:
        return test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model

    @pytest.mark.parametrize("case", list(cases))
    def test_every_tensor_is_fake_after_deferred_init(case):
        check_fake_after_deferred_init(build(case))

    @pytest.mark.parametrize("case", list(cases))
    def test_counter_mode_keeps_the_init_promise(case):
        check_counter_promises(cases[case])

    return (test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model,
            test_every_tensor_is_fake_after_deferred_init, test_counter_mode_keeps_the_init_promise)
