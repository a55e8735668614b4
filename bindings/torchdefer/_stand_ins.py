"""The one table of stand-ins: what a fake does in place of those of torch's Python entry points
that cannot serve it, while a recording is open and after deferred_init returned.

Note [One table of stand-ins]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A fake has shape, dtype and device but no storage, and a few of torch's Python entry points read
memory past the dispatcher, or derive a device from dispatch keys, where the recorder cannot
answer. :data:`STAND_INS` lists each of them once, with what a fake does instead at the two times
torchdefer can act: ``recording``, while a deferred_init, ``deferred()`` block or fake_mode is open
on the thread (``_recording.py`` installs these in torch's place for that window: Note [What
recording changes, and where]), and ``handed_out``, for the fakes deferred_init handed out, after
it returned (their class's ``__torch_function__`` below: Note [Handed-out fakes after
deferred_init]). A handler is called as ``handler(func, args, kwargs)`` with ``func`` torch's own
object (called as torch calls it, so that a subclass's or mode's ``__torch_function__`` sees
torch's), and calls ``func`` itself for what is not its business (a real tensor, data with no
fake). None at one of the two times: torch's own object serves there.

Note [Handed-out fakes after deferred_init]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Training frameworks build a model first and initialize it afterwards: torchtitan's
``m = deferred_init(Transformer, args); m.init_weights(); materialize_module(m)``, where
``init_weights`` calls ``torch.nn.init.trunc_normal_`` on every weight. Operations on a recorded
fake after deferred_init returned are recorded by the dispatch key the fake carries, and value
reads replay privately; but torch's Python ``trunc_normal_`` fails before the dispatcher sees
anything: its sampler calls ``tensor.new_tensor(a, device="cpu")``, and torch's Python binding of
``new_tensor`` derives the new tensor's options from ``tensor``'s highest dispatch key, which for
a fake names no device ("DispatchKey DeferredInit doesn't correspond to a device"). While
recording, the stand-ins of Note [What recording changes, and where] (``_recording.py``) answer
those calls; after deferred_init returned they are gone, and leaving them installed would change
torch for every thread for as long as a fake lives.

So the recorded fakes deferred_init hands out carry the answer themselves, as a class: when it
returns (and when a ``deferred()`` block exits), every recorded fake parameter and buffer of the
modules it returned (what init code initializes), and every fake tensor it returned, whose class
is exactly ``nn.Parameter`` or ``torch.Tensor``, is switched to :class:`DeferredParameter` or
:class:`DeferredTensor`, subclasses of those. Tensors held as plain attributes are left out: they
are not what init code initializes, and finding them costs a walk of every attribute of every
module (materialize_module's): about 1 ms for a Hugging Face Llama-70B's 1,047 modules, 2% of
building it on the meta device, too slow for the end of every deferred_init (a deep copy finds
them when it needs them: Note [Deep copies after deferred_init returned]). Torch consults a
tensor subclass's ``__torch_function__`` for every call of its Python API that takes such a
tensor, on every thread, and for nothing else. Theirs does what the recording's stand-ins do
for fakes, and nothing more:

* ``new_tensor(data)``/``new(...)`` return a fake of the tensor's dtype and device, made from it
  with ``new_empty`` and ``copy_``, so that it is recorded in the tensor's recording and
  materializes to ``data`` (where CUDA is unavailable, with CUDA marked initialized for the
  duration of the call, as recording does, so that a fake CUDA tensor needs no CUDA);
* the first look of torch's trunc_normal_ sampler at the tensor (``is_meta``, from the sampler's
  own frame) runs it as one recorded ``torchdefer::trunc_normal_`` instead, with torch's bits
  (Note [trunc_normal_ as one operator]), exactly as while recording;
* ``tolist``, ``numpy`` and ``__array__``, which torch implements by reading memory past the
  dispatcher, read the values as ``item()`` does (Note [Reading values while recording]); so do
  ``float``, ``int``, ``index``, ``complex`` and ``bool`` of one, which ``torch.tensor`` and
  ``torch.as_tensor`` call for each tensor in the lists and tuples they are given (torch's own
  conversion there fails with the fake's "no storage" error, although ``float(t)`` elsewhere
  reaches the recorder), so that ``torch.tensor([w[0, 0] * 2, 1.0])`` is eager's real tensor, as
  inside deferred_init;
* ``copy.deepcopy`` makes a deferred copy (Note [Deep copies after deferred_init returned] in
  ``_deepcopy.py``), and pickling (``torch.save``, ``pickle``) is refused with a message that says
  to materialize first: a fake has no values to save;
* ``repr``, ``str`` and ``format`` describe the fake, as inside deferred_init (Note [Printing a
  handed-out fake]);
* fake results of every other call are handed out too (Note [Fakes computed after deferred_init
  returned]).

Everything else is forwarded to torch with subclass handling off. ``.data`` of a handed-out fake is
a fake result like any other (init code writes ``nn.init.trunc_normal_(p.data)``), and
``nn.Parameter(p)`` of one keeps the class for its ``detach``, which torch's ``Parameter``
requires of a subclass. Fakes from ``fake_mode``, fakes of a class the model defines, and fakes
computed only from fakes that were never handed out (a plain attribute's) are untouched.

The class goes back to what the model built (``nn.Parameter``, or ``torch.Tensor``) when the tensor
turns real: every materialization (``materialize_module``, ``materialize_tensor``, torchdistX's,
DTensor layouts) goes through the one entry point in ``_materialize.py``, which gives each tensor it
made real its class back (:func:`restore`), so ``type(p) is nn.Parameter`` holds again and a real
tensor never pays for a Python ``__torch_function__``; one made real in place another way (``p.data
= real``) gets it back in the call that did it. Torch's own ``UninitializedParameter`` works the
same way (a Parameter subclass with its own ``__torch_function__``, whose ``materialize()`` sets the
class to ``Parameter``).

What this changes, until the tensor is real: ``type(p)`` is ``DeferredParameter`` (``isinstance(p,
nn.Parameter)`` and ``isinstance(p, torch.Tensor)`` hold, ``type(p) is nn.Parameter`` does not),
each torch call taking it costs a Python call, and a torch-function mode of the user's sees the
class in ``types`` (and handed-out fakes as results). Code that rebuilds a parameter through its
class, ``type(p)(data)`` (accelerate's ``set_module_tensor_to_device``), gets an ``nn.Parameter``,
as before: a real tensor never gets the class. What model code does with parameters before
materializing (parametrizations, ``to(dtype)``, tying, ``load_state_dict``, hooks, optimizers) gives
eager's model with eager's classes (tests/python/test_after_return.py). Nothing in torch is patched
and no mode is active: other tensors, other threads and ``import torchdefer`` see nothing
(tests/python/test_torch_untouched.py).

Note [Fakes computed after deferred_init returned]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Init code computes from parameters before it reads or makes tensors: ``(w * 2).tolist()``,
``w[0].numpy()``, ``w.t().new_tensor(...)``, ``nn.init.trunc_normal_(w[0])``, a state dict's
``detach()``-ed values. In eager each works on any tensor; here each needs the class, so every
result of a call on a handed-out fake that is a recorded fake of class exactly ``torch.Tensor``
(alone, or in a tuple or list: ``chunk``, ``max(dim)``) gets :class:`DeferredTensor`, as torch's
own default ``__torch_function__`` gives results its subclass; real results (a value read's
``nonzero()``) stay plain. So what is computed from a handed-out fake reads values, makes new
tensors, samples ``trunc_normal_`` and deep-copies as the fake does, and ``p.tolist()`` and
``(p * 2).tolist()`` both give eager's values.

Such a result turns real like any fake: held by the model (a buffer, an attribute,
``nn.Parameter(w * 2)``) it is materialized with it, through ``_materialize.py``, and gets
back the class eager gives it; ``materialize_tensor`` does the same for one the user holds; one
never materialized stays a fake of that class until collected. FSDP's ``chunk`` of a parameter is
such a result too: DTensor layouts replace the local tensors of a deferred model by real ones
(Note [DTensor parameters of a deferred model], ``_dtensor.py``), so the class never reaches a
real DTensor.

The cost is the check of each result: about 0.3 µs per call on a handed-out fake (``type`` and
``_C.can_materialize`` of the result), next to the 2 to 3 µs the cheapest such call (``p.shape``)
already costs and the 100 µs or more of a recorded op; a torchtitan-style Llama-70B
``init_weights()`` makes 162 such calls and took 27.0 ms with it, 27.4 ms without
(bench/after_return_cost.py; docs/python.md gives the run).

Note [Printing a handed-out fake]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``repr(p)``, ``print(p)`` and ``f"{p}"`` of a handed-out fake print ``FakeTensor(fake Float[4, 3] on
cpu, requires_grad=True)`` (``Parameter containing:`` before it for a parameter), as inside
deferred_init, rather than the values eager prints. Reading values is supported after return, but a
print is not where it should happen: debuggers and loggers call ``repr`` on every tensor they show,
and each read replays the tensor's history (a 70B embedding computed whole to show six numbers),
while the description says at a glance that the model is not materialized yet, which a table of
plausible numbers would hide. Values are one call away, ``print(p.tolist())``, and print as in eager
once materialized. A 0-dim ``torch.Tensor`` formats its value as eager does (``f"{w.std():.3f}"``
in a log line), and a format spec on anything else raises eager's ``TypeError``.
"""

from __future__ import annotations

import sys
import types
import warnings
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

from torchdefer import _C, _cuda_init, _deepcopy

# handler(func, args, kwargs), ``func`` being torch's own object (Note [One table of stand-ins]).
Handler = Callable[[Callable[..., Any], Tuple[Any, ...], Dict[str, Any]], Any]

_TensorBase = torch._C.TensorBase
_IS_META = _TensorBase.__dict__["is_meta"]
_METHOD_WRAPPER = type(_IS_META.__get__)
_PARAMETER_NEW = torch.nn.Parameter.__new__.__code__
_SAMPLER_CODE = torch.nn.init._no_grad_trunc_normal_.__code__
# Real: made at import, outside any recording (Note [Loading real tensors while recording]).
_REAL_EMPTY = torch.empty(0)


# --- Both times: reading values, making tensors, printing ----------------------------------------


def fake_repr(tensor: torch.Tensor) -> str:
    """What ``repr`` prints for a fake while recording or faking: shape, dtype, device, "fake"."""
    return f"FakeTensor({_C.describe(tensor)}, requires_grad={tensor.requires_grad})"


def _with_values(data: Any) -> Any:
    """``data`` (a tensor, or lists and tuples of them, nested) with every fake replaced by its
    values, read as ``item()`` reads them."""
    if isinstance(data, torch.Tensor):
        return _C.read_values(data) if _C.is_fake(data) else data
    if isinstance(data, (list, tuple)):
        # Plain lists, which torch reads as it reads any sequence: a tuple subclass (a namedtuple)
        # cannot be rebuilt from one iterable.
        return [_with_values(item) for item in data]
    return data


def _holds_fake(data: Any) -> bool:
    if isinstance(data, torch.Tensor):
        return _C.is_fake(data)
    if isinstance(data, (list, tuple)):
        return any(_holds_fake(item) for item in data)
    return False


def _read(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    self = args[0]
    if not _C.is_fake(self):
        return func(*args, **kwargs)
    # requires_grad kept, so that numpy() refuses (or, with force=True, accepts) as in eager.
    values = _C.read_values(self).requires_grad_(self.requires_grad)
    return func(values, *args[1:], **kwargs)


def _new_tensor_of(self: torch.Tensor, data: Any, dtype=None, device=None, requires_grad=False):
    # A tensor itself is copied through the dispatcher (recorded); only sequences are read.
    data = data if isinstance(data, torch.Tensor) else _with_values(data)
    values = torch.tensor(data, dtype=self.dtype if dtype is None else dtype)
    # Made from `self` by dispatcher ops, so that the result belongs to `self`'s recording also
    # after deferred_init returned (Note [Handed-out fakes after deferred_init]).
    device = self.device if device is None else device
    made = self.new_empty(values.shape, dtype=values.dtype, device=device)
    made.copy_(values)
    return made.requires_grad_(requires_grad)


def _new_tensor(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    if not _C.is_fake(args[0]):
        return func(*args, **kwargs)
    return _new_tensor_of(*args, **kwargs)


def _new(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    self, sizes = args[0], args[1:]
    if not _C.is_fake(self):
        return func(*args, **kwargs)
    device = kwargs.get("device") or self.device
    if len(sizes) == 1 and isinstance(sizes[0], torch.Size):
        sizes = tuple(sizes[0])
    if all(isinstance(size, int) for size in sizes):
        return self.new_empty(tuple(sizes) if sizes else (0,), dtype=self.dtype, device=device)
    not_data = (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)
    if len(sizes) == 1 and not isinstance(sizes[0], not_data):
        # Data as torch takes it: any sequence (a list, a range, an array), by Python's sequence
        # test; for anything else (a float), eager's own TypeError, which eager code may catch.
        if not hasattr(type(sizes[0]), "__getitem__") or isinstance(sizes[0], dict):
            raise TypeError(f"new(): data must be a sequence (got {type(sizes[0]).__name__})")
        return _new_tensor_of(self, sizes[0], device=device)
    # A RuntimeError, never a TypeError that library code may catch (Note [Refusals are
    # RuntimeErrors], core/src/fake_fallback.cpp).
    raise RuntimeError(
        "torchdefer: Tensor.new(tensor or storage) is not supported on a fake "
        f"({_C.describe(self)}); use new_tensor(data), new_empty(sizes) or the tensor itself"
    )


def _repr(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    """A fake describes itself (Note [Printing a handed-out fake])."""
    self = args[0]
    return fake_repr(self) if _C.is_fake(self) else func(*args, **kwargs)


# --- While recording ------------------------------------------------------------------------------


def _refuse_fake_into_real(self: torch.Tensor, value: Any) -> None:
    """``self.data = value``: refused when it would put a fake into a real tensor."""
    if isinstance(value, torch.Tensor) and _C.is_fake(value) and not _C.is_fake(self):
        raise RuntimeError(
            f"torchdefer: `.data = fake` on a real tensor ({tuple(self.shape)}, {self.dtype}, "
            f"{self.device}) would leave it neither real nor fake: it would carry the fake "
            f"{_C.describe(value)} without being one, and could be neither read nor materialized. "
            "Build the parameter from the fake instead (`module.weight = nn.Parameter(t)`), or "
            "create it under deferred_init so that it is fake too."
        )


def _set_data(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    """``self.data = value``, ``func`` being torch's setter."""
    self, value = args
    _refuse_fake_into_real(self, value)
    if _C.is_fake(self) and isinstance(value, torch.Tensor) and _C.is_fake(value):
        # Note [Assigning .data between fakes in inference mode]
        # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
        # torch's set_data first asks whether the two tensors are compatible
        # (_has_compatible_shallow_copy_type). Between an inference fake and another fake
        # the answer is no while inference mode is on (autograd's keys are excluded, so the
        # Fake layer answers on the two meta shadows, whose dispatch keys differ) and yes
        # outside it, where eager says yes for two CPU tensors in either case. set_data
        # does the same in and outside the mode: `self` takes `value`'s metadata and keys,
        # so it becomes an inference tensor exactly when eager's does; a module tensor
        # that ends up one is refused, naming it, as any other (Note [Inference mode while
        # recording] in recorder/src/recording.cpp).
        with torch.inference_mode(False):
            return func(self, value)
    return func(self, value)


def _tensor_from_data(func: Callable, data: Any, *args: Any, **kwargs: Any) -> Any:
    # A tensor itself goes through the dispatcher (detach, to), where fakes are recorded; only
    # sequences of tensors are read from memory.
    if isinstance(data, (list, tuple)) and _holds_fake(data):
        data = _with_values(data)
    return func(data, *args, **kwargs)


def _from_data(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    """``torch.tensor``/``torch.as_tensor`` of data holding fakes read their values."""
    return _tensor_from_data(func, *args, **kwargs)


def _sampler_arguments(tensor, mean, std, a, b, generator=None):
    return tensor, mean, std, a, b, generator


def _sample_trunc_normal(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    """torch's trunc_normal_ sampler, run on a fake as one recorded torchdefer::trunc_normal_."""
    tensor, mean, std, a, b, generator = _sampler_arguments(*args, **kwargs)
    if not _C.is_fake(tensor):
        return func(*args, **kwargs)
    # The warning names the caller of trunc_normal_: past this frame, the stand-in that called it
    # and trunc_normal_.
    _run_trunc_normal(tensor, mean, std, a, b, generator, stacklevel=4)
    return tensor


def _empty_set_to(storage: Any, storage_offset: int, size: Any, stride: Any) -> torch.Tensor:
    untyped = storage._untyped_storage
    empty = _REAL_EMPTY.to(dtype=storage.dtype, device=untyped.device, copy=True)
    return empty.set_(untyped, storage_offset, size, stride)


def _rebuild_tensor(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    """A loaded storage put into a real tensor (Note [Loading real tensors while recording])."""
    return _empty_set_to(*args, **kwargs)


def _run_trunc_normal(tensor: torch.Tensor, mean: float, std: float, a: float, b: float,
                      generator: Optional[torch.Generator], stacklevel: int) -> None:
    """Runs a trunc_normal_ call as one torchdefer::trunc_normal_ (Note [What recording changes,
    and where]); ``stacklevel`` points the warning at the caller of ``trunc_normal_``."""
    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn(
            "mean is more than 2 std from [a, b] in nn.init.trunc_normal_. "
            "The distribution of values may be incorrect.",
            stacklevel=stacklevel + 1,
        )
    if generator is not None:
        _C._follow_generator(generator)  # Note [Followed generators]
    with torch.no_grad():
        torch.ops.torchdefer.trunc_normal_(tensor, mean, std, a, b, generator=generator)


# --- After deferred_init returned -----------------------------------------------------------------


def _scalar(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    """``float``, ``int``, ``index``, ``complex`` and ``bool`` of one element read it; torch refuses
    any other size before reading, with eager's error."""
    return _read(func, args, kwargs) if args[0].numel() == 1 else func(*args, **kwargs)


def _format(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    """``format(t, spec)`` as eager formats the class the model built: a 0-dim ``torch.Tensor``
    formats its value (read as ``item()`` reads it); anything else is ``str(t)``, and takes no
    spec."""
    self, spec = args[0], args[1] if len(args) > 1 else kwargs.get("format_spec", "")
    built = _BUILT.get(type(self), type(self))
    if self.dim() == 0 and built is torch.Tensor:
        return self.detach().item().__format__(spec)
    if spec:
        raise TypeError(f"unsupported format string passed to {built.__name__}.__format__")
    prefix = "Parameter containing:\n" if built is torch.nn.Parameter else ""
    return prefix + _repr(torch.Tensor.__repr__, (self,), {})


def _refuse_pickling(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    raise RuntimeError(
        f"torchdefer: pickling {_C.describe(args[0])} (torch.save, pickle, copy.copy) would "
        "save values it does not have: it is a fake that deferred_init handed out. "
        "Materialize the module first (torchdefer.materialize_module), then save it; "
        "copy.deepcopy makes a deferred copy."
    )


def _copy_held_fakes(memo: Dict[Any, Any]) -> None:
    """The plain-attribute fakes of the module being copied, copied into ``memo`` and handed out
    (Note [Deep copies after deferred_init returned])."""
    for copied in _deepcopy.copy_held_fakes(memo):
        hand_out_tensor(copied)


def _deep_copy(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    _copy_held_fakes(args[1] if len(args) > 1 else kwargs["memo"])
    copied = _deepcopy.deepcopy(func, args, kwargs, handed_out=True)
    hand_out_tensor(copied)
    return copied


def _handing_out(maker: Handler) -> Handler:
    """The handler that makes a fake with ``maker`` and hands it out: where CUDA is unavailable,
    torch's Python binding must not try to initialize it for a fake CUDA tensor, as while
    recording."""

    def handler(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
        with _cuda_init.marked_initialized():
            made = maker(func, args, kwargs)
        _hand_out_results(made)
        return made

    return handler


# --- The table --------------------------------------------------------------------------------------


class StandIn(NamedTuple):
    """One of torch's objects, ``owner.name``, and what a fake does instead of it, while recording
    and once handed out (Note [One table of stand-ins])."""

    owner: Any
    name: str
    recording: Optional[Handler]
    handed_out: Optional[Handler]


STAND_INS: List[StandIn] = [
    # Printing describes a fake instead of reading values it does not have.
    StandIn(torch.Tensor, "__repr__", _repr, _repr),
    StandIn(torch.Tensor, "__format__", None, _format),
    # Deep copies made of recorded ops (Note [Deep copies of fakes]): while recording, of every
    # tensor; a handed-out fake's copy is handed out too.
    StandIn(torch.Tensor, "__deepcopy__", _deepcopy.deepcopy, _deep_copy),
    StandIn(torch.Tensor, "__reduce_ex__", None, _refuse_pickling),
    # Torch reads these from memory, past the dispatcher, where a fake has nothing: its values are
    # read as item() reads them (Note [Reading values while recording]). numpy's __array__ calls
    # numpy(), which recording stands in for; the scalar conversions are how torch.tensor and
    # torch.as_tensor store each tensor of a list, which recording stands in for whole.
    StandIn(torch.Tensor, "tolist", _read, _read),
    StandIn(torch.Tensor, "numpy", _read, _read),
    StandIn(torch.Tensor, "__array__", None, _read),
    StandIn(torch.Tensor, "__float__", None, _scalar),
    StandIn(torch.Tensor, "__int__", None, _scalar),
    StandIn(torch.Tensor, "__index__", None, _scalar),
    StandIn(torch.Tensor, "__complex__", None, _scalar),
    StandIn(torch.Tensor, "__bool__", None, _scalar),
    StandIn(torch, "tensor", _from_data, None),
    StandIn(torch, "as_tensor", _from_data, None),
    # A fake of the tensor's dtype and device (torch derives them from dispatch keys).
    StandIn(torch.Tensor, "new_tensor", _new_tensor, _handing_out(_new_tensor)),
    StandIn(torch.Tensor, "new", _new, _handing_out(_new)),
    # A property: the handler is its setter, which refuses `real.data = fake`.
    StandIn(torch.Tensor, "data", _set_data, None),
    # trunc_normal_'s sampler as one recorded operator; a handed-out fake answers the sampler's
    # first look at it (is_meta) instead, in its __torch_function__ (runs_trunc_normal).
    StandIn(torch.nn.init, "_no_grad_trunc_normal_", _sample_trunc_normal, None),
    StandIn(torch._utils, "_rebuild_tensor", _rebuild_tensor, None),
]


def torchs_object(owner: Any, name: str) -> Any:
    """Torch's own ``owner.name`` as stored (a class's from its MRO, undecorated by ``__get__``)."""
    for scope in getattr(owner, "__mro__", (owner,)):
        if name in vars(scope):
            return vars(scope)[name]
    raise AttributeError(f"{owner!r} has no {name}")


# --- The handed-out classes (Note [Handed-out fakes after deferred_init]) ---------------------------


def _is_getter_of(func: Any, descriptor: Any) -> bool:
    return type(func) is _METHOD_WRAPPER and func.__self__ is descriptor and func.__name__ == "__get__"


def _caller_outside_modes(frame: types.FrameType) -> types.FrameType:
    """The frame that made the call, past the torch-function modes (a device context, a user's
    mode) that forwarded it."""
    while frame.f_code.co_name == "__torch_function__" and frame.f_back is not None:
        frame = frame.f_back
    return frame


def runs_trunc_normal(caller: types.FrameType) -> bool:
    """Whether an ``is_meta`` read that ``caller`` made is the first look of torch's trunc_normal_
    sampler at a fake, which has then been run as one recorded torchdefer::trunc_normal_ (True
    is the sampler's answer)."""
    caller = _caller_outside_modes(caller)
    if caller.f_code is not _SAMPLER_CODE:
        return False
    arguments = caller.f_locals
    tensor, mean, std = arguments["tensor"], arguments["mean"], arguments["std"]
    # The warning names the caller of trunc_normal_: past this frame, the class's
    # __torch_function__, the sampler and trunc_normal_.
    _run_trunc_normal(tensor, mean, std, arguments["a"], arguments["b"], arguments["generator"],
                      stacklevel=5)
    return True


def _torch_function(cls, func, types, args=(), kwargs=None):
    """The ``__torch_function__`` of handed-out fakes (Note [Handed-out fakes after deferred_init])."""
    kwargs = kwargs or {}
    with torch._C.DisableTorchFunctionSubclass():
        if _is_getter_of(func, _IS_META) and runs_trunc_normal(sys._getframe(1)):
            return True
        handler = _HANDLERS.get(func)
        if handler is not None:
            return handler(func, args, kwargs)
        result = func(*args, **kwargs)
        if args and type(args[0]) in _BUILT and not _C.is_fake(args[0]):
            restore(args[0])  # made real in place: `p.data = real`, `p.set_(real)`
        elif func is _TensorBase.detach and _called_by_parameter_new(sys._getframe(1)):
            result.__class__ = type(args[0])  # Parameter.__new__ requires detach() to keep it
        else:
            _hand_out_results(result)
        return result


def _hand_out_results(result: Any) -> None:
    """Gives the recorded fakes among ``result`` (a tensor, or a tuple or list of them) whose class
    is exactly ``torch.Tensor`` the handed-out class: what is computed from a handed-out fake
    reads values and makes new tensors as the fake does."""
    if type(result) is torch.Tensor:
        if _C.can_materialize(result):
            result.__class__ = DeferredTensor
    elif isinstance(result, (tuple, list)) and type(result) is not torch.Size:
        for item in result:
            if type(item) is torch.Tensor and _C.can_materialize(item):
                item.__class__ = DeferredTensor


def _called_by_parameter_new(caller) -> bool:
    return _caller_outside_modes(caller).f_code is _PARAMETER_NEW


class DeferredTensor(torch.Tensor):
    """A recorded fake that deferred_init handed out (a buffer, a tensor it returned, a fake
    computed from a handed-out one), until it is real; then a ``torch.Tensor`` again (Note
    [Handed-out fakes after deferred_init])."""

    __torch_function__ = classmethod(_torch_function)


class DeferredParameter(torch.nn.Parameter):
    """A parameter of a module deferred_init returned, until it is real; then an
    ``nn.Parameter`` again (Note [Handed-out fakes after deferred_init])."""

    __torch_function__ = classmethod(_torch_function)

    def __new__(cls, data: Any = None, requires_grad: bool = True) -> torch.nn.Parameter:
        # Code that rebuilds a parameter through its class (accelerate's `type(p)(value)`) gets
        # the class the model built, as before the fake was handed out.
        return torch.nn.Parameter(data, requires_grad)

    def __deepcopy__(self, memo: Dict[int, Any]) -> torch.nn.Parameter:
        # torch's copy (a clone, through __new__ above), handed out as the original was: a copy of
        # a deferred model is a deferred model (Note [Deep copies after deferred_init returned]).
        _copy_held_fakes(memo)
        copied = torch.nn.Parameter.__deepcopy__(self, memo)
        hand_out_tensor(copied)
        return copied


_HANDED_OUT = {torch.Tensor: DeferredTensor, torch.nn.Parameter: DeferredParameter}
_BUILT = {handed_out: built for built, handed_out in _HANDED_OUT.items()}
# torch's method -> what a handed-out fake does instead (the table's ``handed_out`` column).
_HANDLERS = {
    torchs_object(row.owner, row.name): row.handed_out for row in STAND_INS if row.handed_out is not None
}


def hand_out_tensor(tensor: torch.Tensor) -> None:
    """Gives ``tensor`` its handed-out class if it is a recorded fake of a class that has one."""
    handed_out = _HANDED_OUT.get(type(tensor))
    if handed_out is not None and _C.can_materialize(tensor):
        tensor.__class__ = handed_out


def restore(tensor: torch.Tensor) -> None:
    """Gives a handed-out tensor that is real now the class the model built: ``nn.Parameter(t)``
    of a handed-out ``t`` marked it a parameter (``_is_param``), which an ``nn.Parameter`` is."""
    built = _BUILT.get(type(tensor))
    if built is None:
        return
    if vars(tensor).pop("_is_param", False):
        built = torch.nn.Parameter
    tensor.__class__ = built
