"""What the harness runs: the strategies, and whether a strategy fits this machine for a model.

Whether a run fits is decided before it starts, from a computed estimate of its peak resident
memory, never by running into the out-of-memory killer (Note [Memory estimate]).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from typing import Dict, List

from bench.harness import models

GB = 1e9


@dataclasses.dataclass(frozen=True)
class Strategy:
    name: str
    runner: str  # "cpp": bench/strategy_main.cpp; "py": bench/harness/strategy.py
    description: str
    # Note [Memory estimate]
    # ~~~~~~~~~~~~~~~~~~~~~~
    # Peak RSS of one process = baseline + full * P + shard * S +
    # largest * L, where P is the model's parameter bytes, S one rank's shard of them (only for
    # the shard strategies, or when the eager ones slice: W > 1) and L its largest parameter;
    # py-broadcast's processes all run on this machine, so it needs that times
    # --broadcast-world. Baselines are the runners' resident size with their libraries loaded.
    # The factors were fitted to llama-125m runs (2026-11-21) and rounded up; the report prints
    # measured / estimated for every run, which says how far to trust them. What they encode:
    # torch.nn.init.trunc_normal_ (rejection sampling since PyTorch 2.13) holds about four
    # tensors' worth of temporaries where it runs eagerly. deferred_init records it as one op
    # without running it, and a shard computes only its slice (counter mode, by inverse CDF), so
    # py-deferred-shard needs its slice over the baseline (fitted 2026-11-23 to llama3-70b, rank 0
    # of 64: 4.75 GB peak for a 4.41 GB slice and a 0.32 GB baseline).
    baseline: float
    full: float = 0.0
    shard: float = 0.0
    largest: float = 0.0


STRATEGIES: List[Strategy] = [
    Strategy("cpp-eager", "cpp", "C++ torch::nn eager construction on the CPU (then slice to rank 0 of W)",
             baseline=0.13 * GB, full=1, shard=1),
    Strategy("cpp-deferred-full", "cpp", "C++ deferred_init + materialize_module (torch RNG mode)",
             baseline=0.13 * GB, full=1),
    Strategy("cpp-deferred-shard", "cpp", "C++ deferred_init + materialize rank 0 of W (counter RNG)",
             baseline=0.13 * GB, shard=1),
    Strategy("py-eager", "py", "torch.nn eager construction on the CPU (then slice to rank 0 of W)",
             baseline=0.25 * GB, full=1, shard=1, largest=4),
    Strategy("py-meta-reset", "py", "meta device + to_empty + init_weights (FSDP, torchtitan)",
             baseline=0.32 * GB, full=1, largest=4.5),
    Strategy("py-broadcast", "py", "rank 0 builds eagerly, others on meta + to_empty, broadcast over Gloo",
             baseline=0.32 * GB, full=1, largest=4),
    Strategy("py-deferred-full", "py", "torchdefer.deferred_init + materialize_module (torch RNG mode)",
             baseline=0.32 * GB, full=2.2),
    Strategy("py-deferred-shard", "py", "torchdefer.deferred_init + materialize rank 0 of W (counter RNG)",
             baseline=0.4 * GB, shard=1),
    Strategy("py-deferred-record", "py", "torchdefer.deferred_init alone: the record phase, nothing materialized",
             baseline=0.4 * GB),
    Strategy("py-flow-deferred-record", "py",
             "torchdefer.deferred_init of a trainer's flow (meta build + to_empty + init_weights) alone",
             baseline=0.4 * GB),
    Strategy("py-flow-deferred-shard", "py",
             "torchdefer.deferred_init of a trainer's flow + materialize rank 0 of W (counter RNG)",
             baseline=0.4 * GB, shard=1),
    Strategy("py-flow-seeded-deferred-record", "py",
             "torchdefer.deferred_init of a trainer's flow whose init_weights draws from a seeded torch.Generator "
             "(trunc_normal_(generator=g)) alone", baseline=0.4 * GB),
    Strategy("hf-from-config", "py", "transformers AutoModelForCausalLM.from_config (eager)",
             baseline=0.42 * GB, full=1, shard=1),
    Strategy("hf-init-empty", "py", "accelerate init_empty_weights + to_empty + the model's _init_weights",
             baseline=0.42 * GB, full=1),
    Strategy("hf-deferred-full", "py", "torchdefer.deferred_init(from_config) + materialize_module",
             baseline=0.42 * GB, full=1),
    Strategy("hf-deferred-shard", "py", "torchdefer.deferred_init(from_config) + materialize rank 0 of W",
             baseline=0.42 * GB, shard=1),
    Strategy("hf-deferred-record", "py", "torchdefer.deferred_init(from_config) alone: the record phase",
             baseline=0.42 * GB),
]
BY_NAME: Dict[str, Strategy] = {s.name: s for s in STRATEGIES}


def select(patterns: str) -> List[Strategy]:
    """Strategies matching comma-separated names or shell patterns ("cpp-*,hf-from-config")."""
    chosen: List[Strategy] = []
    for pattern in patterns.split(","):
        matches = [s for s in STRATEGIES if fnmatch.fnmatchcase(s.name, pattern.strip())]
        if not matches:
            raise ValueError(f"no strategy matches '{pattern}'; known: {', '.join(BY_NAME)}")
        chosen += [s for s in matches if s not in chosen]
    return chosen


def shard_bytes(config: models.LlamaConfig, world: int, rank: int = 0) -> int:
    """Bytes of fp32 parameters rank `rank` holds with torch.chunk semantics along dim 0."""
    total = 0
    for shape in models.parameter_shapes(config):
        chunk = -(-shape[0] // world)
        rows = max(0, min(chunk, shape[0] - rank * chunk))
        total += rows * math.prod(shape[1:]) * 4
    return total


def estimate_bytes(strategy: Strategy, config: models.LlamaConfig, world: int, broadcast_world: int) -> Dict[str, float]:
    """The estimated peak RSS of one process and of all of the strategy's processes together."""
    full = models.parameter_count(config) * 4
    largest = max(math.prod(shape) for shape in models.parameter_shapes(config)) * 4
    # Eager strategies slice only when there is more than one rank; shard strategies always do.
    sliced = world > 1 or strategy.name.endswith("-shard")
    shard = shard_bytes(config, world) if sliced else 0
    per_process = strategy.baseline + strategy.full * full + strategy.shard * shard + strategy.largest * largest
    processes = broadcast_world if strategy.name == "py-broadcast" else 1
    return {"per_process": per_process, "total": per_process * processes}


def mem_available_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


# A run may use this fraction of MemAvailable: the rest absorbs the estimate's error and what
# other processes allocate meanwhile.
HEADROOM = 0.85


def fits(estimate: Dict[str, float], available: int) -> bool:
    return estimate["total"] <= HEADROOM * available
