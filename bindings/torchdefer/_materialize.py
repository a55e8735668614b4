"""Materialization: the one entry point that every front end calls (``materialize_module``,
``materialize_tensor``, the DTensor layouts of ``torchdefer.distributed``, torchdistX's
``materialize_module`` in ``torchdefer.compat``), which checks the options in their one place
(``_options.py``), finds what to make real and makes it real in one all-or-nothing call of the
C++ orchestrator.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union

import torch

from torchdefer import _C, _checkpoint, _dtensor, _guard, _module_tree, _options, _stand_ins
from torchdefer._C import Shard
from torchdefer._inspect import check_tensor
from torchdefer._options import CheckFn, Checkpoint, DeviceLike, Options, ProgressFn

Stats = List[Dict[str, Any]]


def materialize(
    what: Union[torch.nn.Module, torch.Tensor],
    options: Options,
    who: str = "torchdefer",
    before: Optional[Callable[[], None]] = None,
    dtensors: Optional[bool] = None,
) -> Stats:
    """Makes the fakes of ``what`` (a module's tree, or one tensor) real in place as ``options``
    say, all or nothing, and returns one stats dict per tensor made real. ``who`` names the front
    end in errors; ``before()`` runs just before anything is computed (torchdistX's FSDP1 units
    give the heap back there: Note [FSDP1 units and the heap]); ``dtensors`` is whether to take
    the DTensor layouts' path (Note [DTensor parameters of a deferred model]), by default where
    the module holds a DTensor with a fake local tensor."""
    if isinstance(what, torch.Tensor):
        _options.check(options, who)
        return _run([("tensor", what, True)], options, None, None)
    reader = None if options.checkpoint is None else _checkpoint.open_checkpoint(options.checkpoint)
    if dtensors is None:
        dtensors = _dtensor.holds_deferred_dtensors(what)
    if dtensors and options.rng is None:
        options.rng = "counter"  # Note [Counter mode for a module with DTensors]
    _options.check(options, who, dtensors=dtensors)
    if dtensors:
        stats = _dtensor.materialize(
            what, lambda entries, regions, found: _run(entries, options, reader, found, regions, "tensor")
        )
    else:
        stats = _materialize_tree(what, options, reader, before)
    # What the package keeps about the module's fakes once they are real: the forward check
    # (Note [Forgetting to materialize]) and the fakes remembered for DTensor layouts, which would
    # otherwise keep tensors alive that FSDP or the user let go of.
    _guard.release(what)
    _dtensor.forget_settled(what)
    return stats


def _materialize_tree(
    module: torch.nn.Module, options: Options, reader: Any, before: Optional[Callable[[], None]]
) -> Stats:
    target = _options.target_device(options)
    _dtensor.forget_settled(module)
    check_fn = options.check_fn
    if options.check_fn_per_module:
        modules = [
            (prefix, m) for prefix, m in _module_tree.children_first(module, remove_duplicate=True)
            if check_fn is None or check_fn(m)
        ]
    else:
        modules = _module_tree.children_first(module, enter=check_fn)
    real = options.shard is not None or reader is not None
    entries = _module_tree.to_materialize(_module_tree.tensors(modules, options.buffers_only), real)
    if not entries:
        return []
    if before is not None:
        before()
    found = None if reader is None else _checkpoint.module_entries(module)
    unit = "tensor" if options.shard is not None else "op"
    return _run(entries, options, reader, found, None, unit, target)


def _run(
    entries: List[_module_tree.Entry],
    options: Options,
    reader: Any,
    module_entries: Optional[List[_module_tree.Entry]],
    regions: Optional[_dtensor.Boxes] = None,
    unit: str = "op",
    target: Optional[torch.device] = None,
) -> Stats:
    """The one call of the C++ orchestrator, after which each tensor it made real has the class
    the model built (Note [Handed-out fakes after deferred_init])."""
    if target is None:
        target = _options.target_device(options)
    loading: Dict[str, Any] = {}
    if reader is not None:
        loading = dict(checkpoint=reader, strict=bool(options.strict),
                       checkpoint_prefix=options.checkpoint_prefix, module_entries=module_entries)
    with _options.progress_callback(options.progress, unit) as callback:
        stats = _C.materialize_named(entries, target, options.rng, options.counter_seed, options.shard,
                                     regions, progress=callback, **loading)
    for _, tensor, _ in entries:
        if not _C.is_fake(tensor):
            _stand_ins.restore(tensor)
    return stats


def materialize_module(
    module: torch.nn.Module,
    *,
    device: DeviceLike = None,
    shard: Optional[Shard] = None,
    rng: Optional[str] = None,
    check_fn: Optional[CheckFn] = None,
    buffers_only: bool = False,
    counter_seed: Optional[int] = None,
    progress: Union[bool, ProgressFn, None] = None,
    checkpoint: Optional[Checkpoint] = None,
    strict: bool = True,
    checkpoint_prefix: str = "",
) -> List[Dict[str, Any]]:
    """Turns the fake parameters, buffers and tensor attributes of ``module`` real, in place.

    Every ``nn.Parameter`` stays the same Python object (attributes and hooks survive), tied
    parameters stay tied, and tensors that are already real are never touched (so calling it
    again does nothing). ``device`` overrides the device each fake reports. ``check_fn(child)``
    returning False skips a child's subtree (as FSDP does). ``shard=Shard(rank, world_size)``
    makes each parameter this rank's slice, one that was real at record time (built from Python
    numbers or read values) included: it is sliced in place and reported with ``fallback``
    "real at record time"; buffers and tensor attributes stay whole. ``rng`` is ``"torch"``
    (default without a shard: the
    values eager construction gives) or ``"counter"`` (default with a shard: the same values for
    every world size), ``counter_seed`` the counter mode's seed (by default derived from the
    seed at recording). ``buffers_only`` leaves parameters fake. ``progress=True`` shows a tqdm
    bar (or a line on stderr without tqdm); a callable gets ``(done, total, name)`` after each
    replayed op (each tensor when sharding).

    ``checkpoint`` (a ``.safetensors`` file, a directory ``save_pretrained`` or
    ``torch.distributed.checkpoint`` wrote, or a mapping of names to tensors) supplies tensors by
    qualified name, read (only this rank's box when sharding), cast to the recorded dtype and
    placed on the target device; the rest is initialized as without it. ``strict=False`` ignores
    checkpoint names that match no parameter or buffer; tensors the checkpoint lacks are
    initialized either way. ``checkpoint_prefix`` is prepended to the module's names (a child
    materialized on its own). See docs/checkpoints.md.

    Returns one dict per materialized tensor: ``name``, ``global_shape``, ``box`` (the shard's
    ``(start, stop)``, or None), ``sliced``, ``fallback``, ``bytes_computed``, ``bytes_kept``,
    ``source`` (``"checkpoint"`` or ``"init"``).
    Raises TypeError/ValueError for bad arguments, RuntimeError naming the tensor or op when
    materializing fails; then (or if ``check_fn`` or ``progress`` raises) every tensor is as it
    was: nothing is half-materialized.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"torchdefer.materialize_module expects an nn.Module, got {type(module).__name__}"
        )
    options = Options(device=device, shard=shard, rng=rng, check_fn=check_fn, buffers_only=buffers_only,
                      counter_seed=counter_seed, progress=progress, checkpoint=checkpoint,
                      strict=strict, checkpoint_prefix=checkpoint_prefix)
    return materialize(module, options)


def materialize_tensor(
    tensor: torch.Tensor, *, device: DeviceLike = None, rng: Optional[str] = None
) -> torch.Tensor:
    """Turns ``tensor`` real in place (the same object) and returns it; a real tensor is
    returned untouched. ``device`` and ``rng`` are as for :func:`materialize_module`."""
    check_tensor("materialize_tensor", tensor)
    materialize(tensor, Options(device=device, rng=rng))
    return tensor
