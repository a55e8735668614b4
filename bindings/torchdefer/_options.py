"""The options of a materialization, and the one place that checks them: the Python face of the
C++ ``MaterializeOptions`` (api/include/torchdefer/materialize.h), which every front end
(``materialize_module``, ``materialize_tensor``, ``distributed.materialize_fully_sharded``,
torchdistX's ``materialize_module``) fills and ``_materialize.py`` carries out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from typing import Any, Callable, Iterator, Optional, Union

import torch

from torchdefer._C import Shard

DeviceLike = Union[str, torch.device, None]
# Called after each step of a materialization as progress(done, total, name) (Note [Progress] in
# replay/include/torchdefer/materialize.h): `name` is the replayed op, or the tensor when sharding.
ProgressFn = Callable[[int, int, str], None]
CheckFn = Callable[[torch.nn.Module], bool]
# A .safetensors file, a directory save_pretrained or torch.distributed.checkpoint wrote (a str or
# os.PathLike), or a mapping of names to tensors (docs/checkpoints.md).
Checkpoint = Any


@dataclasses.dataclass
class Options:
    """What a materialization is asked to do; :func:`check` says whether it can be."""

    device: DeviceLike = None
    shard: Optional[Shard] = None
    rng: Optional[str] = None
    check_fn: Optional[CheckFn] = None
    # torchdistX's check_fn: whether check_fn(m) decides for m's own tensors (the root's
    # included), every module still visited, instead of leaving out m's subtree.
    check_fn_per_module: bool = False
    buffers_only: bool = False
    counter_seed: Optional[int] = None
    progress: Union[bool, ProgressFn, None] = None
    checkpoint: Checkpoint = None
    strict: bool = True
    checkpoint_prefix: str = ""


def device(device: DeviceLike) -> Optional[torch.device]:
    """``device`` as a torch.device (None stays None), refusing what is not a device."""
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"torchdefer: device must be a str or torch.device such as \"cpu\" or \"cuda:0\", "
            f"got {type(device).__name__}"
        )
    return torch.device(device)


def target_device(options: Options) -> Optional[torch.device]:
    """The device to materialize on: a real one. Meta tensors hold no values, so materializing
    there would spend the recording and give nothing."""
    target = device(options.device)
    if target is not None and target.type == "meta":
        raise ValueError(
            'torchdefer: cannot materialize on device="meta": a meta tensor has no values, and '
            "materializing consumes the recording, so the values would be lost. Materialize on a "
            "real device, or keep the fakes (they already have every shape, dtype and stride)"
        )
    return target


def check(options: Options, who: str = "torchdefer", dtensors: bool = False) -> None:
    """Raises TypeError or ValueError for options that cannot be carried out, naming ``who`` (the
    front end); ``dtensors``: for a module holding DTensors, whose placements say what each rank
    computes (Note [DTensor parameters of a deferred model] in ``_dtensor.py``)."""
    if dtensors:
        applied = (("shard", options.shard), ("check_fn", options.check_fn),
                   ("buffers_only", options.buffers_only or None))
        for argument, value in applied:
            if value is not None:
                raise ValueError(
                    f"torchdefer.materialize_module: {argument} does not apply to a module holding "
                    "DTensors (their placements say what each rank computes); drop it"
                )
    progress, shard, rng, counter_seed = options.progress, options.shard, options.rng, options.counter_seed
    if not isinstance(progress, bool) and progress is not None and not callable(progress):
        raise TypeError(
            f"{who}: progress must be True, False, None or a callable(done, total, name), "
            f"got {type(progress).__name__}"
        )
    if shard is not None and not isinstance(shard, Shard):
        raise TypeError(
            f"{who}: shard must be a torchdefer.Shard(rank, world_size), got {type(shard).__name__}"
        )
    if rng is not None and rng not in ("torch", "counter"):
        raise ValueError(f'{who}: rng must be "torch" or "counter", got {rng!r}')
    if options.check_fn is not None and not callable(options.check_fn):
        raise TypeError(
            f"{who}: check_fn must be a callable(module) -> bool, got {type(options.check_fn).__name__}"
        )
    if counter_seed is None:
        return
    if isinstance(counter_seed, bool) or not isinstance(counter_seed, int):
        raise TypeError(f"{who}: counter_seed must be an int in [0, 2**64), got {counter_seed!r}")
    if not 0 <= counter_seed < 2**64:
        raise ValueError(f"{who}: counter_seed must be an int in [0, 2**64), got {counter_seed!r}")
    if rng == "torch" or (rng is None and shard is None):
        raise ValueError(
            f"{who}: counter_seed only applies to the counter RNG mode, and this call uses torch "
            'mode; pass rng="counter" (or a shard, which defaults to it), or drop counter_seed'
        )


@contextlib.contextmanager
def progress_callback(progress: Union[bool, ProgressFn, None], unit: str) -> Iterator[Optional[ProgressFn]]:
    """The callback for ``progress``: None for None/False, the callable itself, or for True a
    tqdm bar (a line on stderr at most once a second where tqdm is not installed)."""
    if progress is None or progress is False:
        yield None
        return
    if progress is not True:
        yield progress
        return
    try:
        from tqdm.auto import tqdm  # optional: only a progress bar needs it
    except ImportError:
        yield _stderr_progress(unit)
        return
    bar = tqdm(desc="materializing", unit=unit)

    def update(done: int, total: int, name: str) -> None:
        if bar.total != total:
            bar.reset(total=total)
        bar.set_postfix_str(name, refresh=False)
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        bar.close()


def _stderr_progress(unit: str) -> ProgressFn:
    last = [0.0]

    def report(done: int, total: int, name: str) -> None:
        now = time.monotonic()
        if done != total and now - last[0] < 1.0:
            return
        last[0] = now
        print(f"torchdefer: materialized {done}/{total} {unit}s ({name})", file=sys.stderr, flush=True)

    return report
