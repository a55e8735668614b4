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
     runs whatever an op costs it;
  D  C's recording scope alone, without FakeTensorFunctions (the stand-ins of Note [What
     recording changes, and where] and the CUDA flag) and without what deferred_init does with
     its result (a measurement only: the stand-ins are what make repr, trunc_normal_ and the other
     calls of that Note right);
  S  what deferred_init does with its result after the constructor (Note [One walk over a
     returned module]), timed on its own after a recording like C's.

C − D − S is then what FakeTensorFunctions costs: installing and removing the stand-ins, and
the Python call each stand-in adds to the torch calls it stands in for. (It was a torch-function
mode, which torch handed every call: about 0.28 of A for Llama-70B.) calls_C_python counts the
calls of C whose function is written in Python.

With --per-call it prints instead what one call of each kind that C makes costs (µs of CPU, the
minimum over 5 loops) in three settings: on the meta device as A builds (its torch.device mode
active), recorded by the scope alone (D's setting) and recorded as deferred_init records (C's).

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
import types
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
        self.python_calls = 0  # calls of torch functions written in Python (torch.nn.init.*)

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        start = time.perf_counter()
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1
            self.python_calls += isinstance(func, types.FunctionType)


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
        # deferred_init's body (bindings/torchdefer/_deferred_init.py) with the clock innermost.
        with _recording.mode(), _C._RecordingScope("timed", False), clock:
            result = build()
        returned = getattr(torchdefer, "_deferred_init", None) or getattr(torchdefer, "_returned", None)
        if returned is not None:
            returned.settle(result)
        else:  # a build from before Note [One walk over a returned module]
            torchdefer._guard.guard(result)
            torchdefer._dtensor.remember(result)
            torchdefer._after_return.hand_out(result)

    out["C_timed"] = timed(recorded_timed)
    out["T_C"], out["calls_C"], out["calls_C_python"] = clock.seconds, clock.calls, clock.python_calls

    def recorded_by_the_scope_alone():
        with _C._RecordingScope("the scope alone", False):
            build()

    out["D"] = timed(recorded_by_the_scope_alone)

    with _recording.mode(), _C._RecordingScope("settled", False):
        result = build()
    out["S"] = timed(lambda: torchdefer._deferred_init.settle(result))
    del result

    built = meta()  # init skipped: the walk below is its first
    with init_primitives_untouched():
        out["W"] = timed(built.initialize_weights)
    return out


def per_call(side: int = 1024) -> Dict[str, Dict[str, float]]:
    """µs of CPU per call of the kinds of torch call C makes, in A's, D's and C's settings."""
    from torchdefer import _C, _recording

    def settings():
        yield "meta", contextlib.ExitStack(), torch.device("meta")
        yield "recorded, scope only", contextlib.ExitStack(), _C._RecordingScope("per call", False)
        yield "recorded", _recording.mode(), _C._RecordingScope("per call", False)

    out: Dict[str, Dict[str, float]] = {}
    for name, outer, inner in settings():
        with outer, inner:
            t = torch.empty(side, side)
            calls = {
                "_set_grad_enabled": (2000, lambda: torch._C._set_grad_enabled(True)),
                "torch.empty": (1000, lambda: torch.empty(side, side)),
                "nn.Parameter(t)": (1000, lambda: torch.nn.Parameter(t)),
                "Tensor.detach": (1000, t.detach),
                "Tensor.fill_": (1000, lambda: t.fill_(1.0)),
                "nn.init.normal_": (100, lambda: torch.nn.init.normal_(t, 0.0, 0.02)),
                "nn.init.kaiming_uniform_": (100, lambda: torch.nn.init.kaiming_uniform_(t, a=5**0.5)),
            }
            for call, (n, fn) in calls.items():
                best = float("inf")
                for _ in range(5):
                    start = time.process_time()
                    for _ in range(n):
                        fn()
                    best = min(best, (time.process_time() - start) / n * 1e6)
                out.setdefault(call, {})[name] = round(best, 2)
    return out


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama3-70b", choices=list(models.CONFIGS))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--per-call", action="store_true", help="per-call costs instead (above)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    if args.per_call:
        print(json.dumps(dict(load_average=list(__import__("os").getloadavg()), per_call_us=per_call())))
        return
    measure(models.config("tiny"))
    runs = []
    for _ in range(args.reps):
        torch.manual_seed(0)
        runs.append(measure(models.config(args.model)))

    def med(key: str, clock: str = "wall") -> float:
        return statistics.median(r[key][clock] if isinstance(r[key], dict) else r[key] for r in runs)

    a, b, c, w, t_a, t_c = med("A"), med("B"), med("C"), med("W"), med("T_A"), med("T_C")
    d, s = med("D"), med("S")
    floors = [(r["A"]["wall"] - r["T_A"] + r["W"]["wall"]) / r["A"]["wall"] for r in runs]
    summary = dict(
        model=args.model, reps=args.reps, load_average=list(__import__("os").getloadavg()),
        A_s=a, B_s=b, C_s=c, W_s=w, T_A_s=t_a, T_C_s=t_c, D_s=d, S_s=s,
        A_cpu_s=med("A", "cpu"), B_cpu_s=med("B", "cpu"), C_cpu_s=med("C", "cpu"), W_cpu_s=med("W", "cpu"),
        D_cpu_s=med("D", "cpu"), S_cpu_s=med("S", "cpu"),
        calls_A=med("calls_A"), calls_C=med("calls_C"), calls_C_python=med("calls_C_python"),
        stand_ins_over_A=statistics.median((r["C"]["wall"] - r["D"]["wall"] - r["S"]["wall"]) / r["A"]["wall"] for r in runs),
        D_over_A=statistics.median(r["D"]["wall"] / r["A"]["wall"] for r in runs),
        S_over_A=statistics.median(r["S"]["wall"] / r["A"]["wall"] for r in runs),
        C_over_A=statistics.median(r["C"]["wall"] / r["A"]["wall"] for r in runs),
        C_over_B=statistics.median(r["C"]["wall"] / r["B"]["wall"] for r in runs),
        C_over_A_cpu=statistics.median(r["C"]["cpu"] / r["A"]["cpu"] for r in runs),
        floor_over_A=statistics.median(floors), floor_over_A_range=[min(floors), max(floors)],
        runs=runs,
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
