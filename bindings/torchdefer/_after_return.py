"""The fakes deferred_init hands out, after it returned: torch's Python layer on them, until real.

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

The class goes back to what the model built (``nn.Parameter``, or ``torch.Tensor``) when the
tensor turns real: every materialization (``materialize_module``, ``materialize_tensor``,
torchdistX's, DTensor layouts) goes through :func:`materialize_named`, which restores the class
of each tensor it made real, so ``type(p) is nn.Parameter`` holds again and a real tensor never
pays for a Python ``__torch_function__``; one made real in place another way (``p.data = real``)
gets it back in the call that did it. Torch's own ``UninitializedParameter`` works the same way
(a Parameter subclass with its own ``__torch_function__``, whose ``materialize()`` sets the class
to ``Parameter``).

What this changes, until the tensor is real: ``type(p)`` is ``DeferredParameter`` (``isinstance(p,
nn.Parameter)`` and ``isinstance(p, torch.Tensor)`` hold, ``type(p) is nn.Parameter`` does not),
each torch call taking it costs a Python call, and a torch-function mode of the user's sees the
class in ``types`` (and handed-out fakes as results). Code that rebuilds a parameter through its
class, ``type(p)(data)`` (accelerate's ``set_module_tensor_to_device``), gets an
``nn.Parameter``, as before: a real tensor never gets the class. What model code does with parameters before materializing
(parametrizations, ``to(dtype)``, tying, ``load_state_dict``, hooks, optimizers) gives eager's
model with eager's classes (tests/python/test_after_return.py). Nothing in torch is patched and
no mode is active: other tensors, other threads and ``import torchdefer`` see nothing
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
``nn.Parameter(w * 2)``) it is materialized with it, through :func:`materialize_named`, and gets
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
from typing import Any, Dict, List, Tuple

import torch

from torchdefer import _C, _deepcopy, _recording

_TensorBase = torch._C.TensorBase
_IS_META = _TensorBase.__dict__["is_meta"]
_METHOD_WRAPPER = type(_IS_META.__get__)
_PARAMETER_NEW = torch.nn.Parameter.__new__.__code__


def _is_getter_of(func: Any, descriptor: Any) -> bool:
    return type(func) is _METHOD_WRAPPER and func.__self__ is descriptor and func.__name__ == "__get__"


def _torch_function(cls, func, types, args=(), kwargs=None):
    """The ``__torch_function__`` of handed-out fakes (Note [Handed-out fakes after deferred_init])."""
    kwargs = kwargs or {}
    with torch._C.DisableTorchFunctionSubclass():
        if _is_getter_of(func, _IS_META) and _recording.runs_trunc_normal(sys._getframe(1)):
            return True
        handler = _HANDLERS.get(func)
        if handler is not None:
            return handler(func, args, kwargs)
        result = func(*args, **kwargs)
        if args and type(args[0]) in _BUILT and not _C.is_fake(args[0]):
            _restore(args[0])  # made real in place: `p.data = real`, `p.set_(real)`
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


def _handing_out(maker):
    """The handler that makes a fake with ``maker`` (a recording handler) and hands it out."""

    def handler(func, args, kwargs):
        made = _making_a_fake(maker, func, args, kwargs)
        _hand_out_results(made)
        return made

    return handler


def _scalar(func, args, kwargs):
    """``float``, ``int``, ``index``, ``complex`` and ``bool`` of one element read it; torch refuses
    any other size before reading, with eager's error."""
    return _recording._read(func, args, kwargs) if args[0].numel() == 1 else func(*args, **kwargs)


def _repr(func, args, kwargs):
    """A fake describes itself, as inside deferred_init (Note [Printing a handed-out fake])."""
    self = args[0]
    return _recording.fake_repr(self) if _C.is_fake(self) else func(*args, **kwargs)


def _format(func, args, kwargs):
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


def _refuse_pickling(func, args, kwargs):
    raise RuntimeError(
        f"torchdefer: pickling {_C.describe(args[0])} (torch.save, pickle, copy.copy) would "
        "save values it does not have: it is a fake that deferred_init handed out. "
        "Materialize the module first (torchdefer.materialize_module), then save it; "
        "copy.deepcopy makes a deferred copy."
    )


def _deep_copy(func, args, kwargs):
    _deepcopy.copy_held_fakes(args[1] if len(args) > 1 else kwargs["memo"])
    copied = _deepcopy.deepcopy(func, args, kwargs, handed_out=True)
    hand_out_tensor(copied)
    return copied


def _making_a_fake(handler, func, args, kwargs):
    """``handler``, which makes a fake on the tensor's device: where CUDA is unavailable, torch's
    Python binding must not try to initialize it for a fake CUDA tensor, as while recording."""
    with _recording.cuda_marked_initialized():
        return handler(func, args, kwargs)


def _called_by_parameter_new(caller) -> bool:
    return _recording._caller_outside_modes(caller).f_code is _PARAMETER_NEW


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
        _deepcopy.copy_held_fakes(memo)
        copied = torch.nn.Parameter.__deepcopy__(self, memo)
        hand_out_tensor(copied)
        return copied


_HANDED_OUT = {torch.Tensor: DeferredTensor, torch.nn.Parameter: DeferredParameter}
_BUILT = {handed_out: built for built, handed_out in _HANDED_OUT.items()}

_HANDLERS = {
    torch.Tensor.__repr__: _repr,
    torch.Tensor.__format__: _format,
    _TensorBase.new_tensor: _handing_out(_recording._new_tensor),
    _TensorBase.new: _handing_out(_recording._new),
    # Torch reads these from memory, past the dispatcher, where a fake has nothing: its values are
    # read as item() reads them (Note [Reading values while recording]). The scalar conversions are
    # how torch.tensor/torch.as_tensor store each tensor of a list.
    _TensorBase.tolist: _recording._read,
    _TensorBase.numpy: _recording._read,
    torch.Tensor.__array__: _recording._read,
    _TensorBase.__float__: _scalar,
    _TensorBase.__int__: _scalar,
    _TensorBase.__index__: _scalar,
    _TensorBase.__complex__: _scalar,
    _TensorBase.__bool__: _scalar,
    torch.Tensor.__reduce_ex__: _refuse_pickling,
    torch.Tensor.__deepcopy__: _deep_copy,
}


def hand_out(result: Any) -> None:
    """Gives every recorded fake parameter and buffer of the modules in ``result`` (deferred_init's
    return value: a module, a tensor, or lists, tuples and dicts of them), and every recorded fake
    tensor in it, its handed-out class."""
    pending = [result]
    seen = set()
    while pending:
        value = pending.pop()
        if isinstance(value, torch.Tensor):
            hand_out_tensor(value)
        elif isinstance(value, torch.nn.Module):
            _hand_out_module(value)
        elif isinstance(value, (list, tuple, dict)) and id(value) not in seen:
            seen.add(id(value))
            pending.extend(value.values() if isinstance(value, dict) else value)


def _hand_out_module(root: torch.nn.Module) -> None:
    """Hands out the parameters and buffers of ``root``'s tree. The walk builds no names and
    hashes no module (a dataclass module is unhashable): it runs at the end of every deferred_init."""
    pending = [root]
    seen = set()
    while pending:
        module = pending.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        for tensor in module._parameters.values():
            if tensor is not None:
                hand_out_tensor(tensor)
        for tensor in module._buffers.values():
            if tensor is not None:
                hand_out_tensor(tensor)
        pending.extend(child for child in module._modules.values() if child is not None)


def hand_out_tensor(tensor: torch.Tensor) -> None:
    """Gives ``tensor`` its handed-out class if it is a recorded fake of a class that has one."""
    handed_out = _HANDED_OUT.get(type(tensor))
    if handed_out is not None and _C.can_materialize(tensor):
        tensor.__class__ = handed_out


def _restore(tensor: torch.Tensor) -> None:
    """Gives a handed-out tensor that is real now the class the model built: ``nn.Parameter(t)``
    of a handed-out ``t`` marked it a parameter (``_is_param``), which an ``nn.Parameter`` is."""
    built = _BUILT.get(type(tensor))
    if built is None:
        return
    if vars(tensor).pop("_is_param", False):
        built = torch.nn.Parameter
    tensor.__class__ = built


def materialize_named(entries: List[Tuple[str, torch.Tensor, bool]], *args: Any, **kwargs: Any) -> Any:
    """``_C.materialize_named``, after which each tensor it made real has the class the model built."""
    stats = _C.materialize_named(entries, *args, **kwargs)
    for _, tensor, _ in entries:
        if not _C.is_fake(tensor):
            _restore(tensor)
    return stats

