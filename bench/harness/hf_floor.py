"""Where a Hugging Face model's deferred_init time goes, next to meta construction: what any
recorder must spend, and what torchdefer spends (docs/results.md, "Hugging Face recording").

    python3 -m bench.harness.hf_floor --model llama3-70b --reps 5

One process, after a warm-up on the tiny shape, each repetition measures in turn (wall and CPU
time):

  A  meta construction, as the harness measures it (`with torch.device("meta"): from_config`);
  B  A followed by `initialize_weights()` under the meta device: the walk transformers skips on
     the meta device and eager construction runs (Note [What meta construction skips in
     transformers] in bench/harness/strategy.py);
  C  torchdefer.deferred_init(from_config);
  T_A, T_C  the time spent inside torch calls during A and C: a torch-function mode pushed
     innermost times every call that reaches torch's Python API (a call that torch's Python
     functions make inside another is part of the outer one);
  W  the walk alone, without any torch-function mode, on a meta-built model, with every
     transformers init primitive (transformers.initialization.TORCH_INIT_FUNCTIONS: normal_,
     ones_, ...) made to return its tensor untouched: transformers' own Python, which a recorder
     runs whatever an op costs it.

A − T_A is the Python of the constructor; C records the same constructor and the walk, so no
recorder, however cheap its ops, takes less than floor = A − T_A + W.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import time
from typing import Any, Callable, Dict, List

import torch
from torch.overrides import TorchFunctionMode

from bench.harness import models


class TorchTime(TorchFunctionMode):
    """Times the calls that reach torch's Python API while it is the innermost mode."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        start = time.perf_counter()
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1


@contextlib.contextmanager
def init_primitives_untouched():
    """transformers' init primitives return their tensor untouched, for the duration."""
    from transformers import initialization

    saved = dict(initialization.TORCH_INIT_FUNCTIONS)
    for name in saved:
        initialization.TORCH_INIT_FUNCTIONS[name] = lambda tensor, *args, **kwargs: tensor
    try:
        yield
    finally:
        initialization.TORCH_INIT_FUNCTIONS.update(saved)


def timed(fn: Callable[[], Any]) -> Dict[str, float]:
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return dict(wall=time.perf_counter() - wall, cpu=time.process_time() - cpu)


def measure(config: models.LlamaConfig) -> Dict[str, Any]:
    import transformers
    import torchdefer
    from torchdefer import _C, _recording

    hf_config = models.hf_config(config)

    def build():
        return transformers.AutoModelForCausalLM.from_config(hf_config)

    def meta():
        with torch.device("meta"):
            return build()

    def meta_with_init():
        with torch.device("meta"):
            build().initialize_weights()

    out: Dict[str, Any] = {}
    out["A"] = timed(meta)
    out["B"] = timed(meta_with_init)
    out["C"] = timed(lambda: torchdefer.deferred_init(build))

    clock = TorchTime()

    def meta_timed():
        with torch.device("meta"), clock:
            build()

    out["A_timed"] = timed(meta_timed)
    out["T_A"], out["calls_A"] = clock.seconds, clock.calls

    clock = TorchTime()

    def recorded_timed():
        # deferred_init's body (bindings/torchdefer/__init__.py) with the clock innermost.
        with _recording.mode(), _C._RecordingScope("timed", False), clock:
            result = build()
        returned = getattr(torchdefer, "_returned", None)
        if returned is not None:
            returned.settle(result)
        else:  # a build from before Note [One walk over a returned module]
            torchdefer._guard.guard(result)
            torchdefer._dtensor.remember(result)
            torchdefer._after_return.hand_out(result)

    out["C_timed"] = timed(recorded_timed)
    out["T_C"], out["calls_C"] = clock.seconds, clock.calls

    built = meta()  # init skipped: the walk below is its first
    with init_primitives_untouched():
        out["W"] = timed(built.initialize_weights)
    return out


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama3-70b", choices=list(models.CONFIGS))
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    measure(models.config("tiny"))
    runs = []
    for _ in range(args.reps):
        torch.manual_seed(0)
        runs.append(measure(models.config(args.model)))

    def med(key: str, clock: str = "wall") -> float:
        return statistics.median(r[key][clock] if isinstance(r[key], dict) else r[key] for r in runs)

    a, b, c, w, t_a, t_c = med("A"), med("B"), med("C"), med("W"), med("T_A"), med("T_C")
    floors = [(r["A"]["wall"] - r["T_A"] + r["W"]["wall"]) / r["A"]["wall"] for r in runs]
    summary = dict(
        model=args.model, reps=args.reps, load_average=list(__import__("os").getloadavg()),
        A_s=a, B_s=b, C_s=c, W_s=w, T_A_s=t_a, T_C_s=t_c,
        A_cpu_s=med("A", "cpu"), B_cpu_s=med("B", "cpu"), C_cpu_s=med("C", "cpu"), W_cpu_s=med("W", "cpu"),
        calls_A=med("calls_A"), calls_C=med("calls_C"),
        C_over_A=statistics.median(r["C"]["wall"] / r["A"]["wall"] for r in runs),
        C_over_B=statistics.median(r["C"]["wall"] / r["B"]["wall"] for r in runs),
        C_over_A_cpu=statistics.median(r["C"]["cpu"] / r["A"]["cpu"] for r in runs),
        floor_over_A=statistics.median(floors), floor_over_A_range=[min(floors), max(floors)],
        runs=runs,
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
