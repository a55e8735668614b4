"""What deferred_init and fake_mode change in torch's Python layer, for their own thread only.

Note [What recording changes, and where]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Importing torchdefer changes nothing in torch: every ``torch.Tensor`` method, every
``torch.nn.init`` function and ``torch.cuda._lazy_init`` stay torch's own objects. What fakes
need from torch's Python layer is done by :class:`FakeTensorFunctions`, a
``torch.overrides.TorchFunctionMode`` that :func:`torchdefer.deferred_init` and
:func:`torchdefer.fake_mode` push for as long as they run. Torch keeps its mode stack per
thread, so other threads never see it, and it is gone when the call returns or raises. While
active, it sees every call into torch's Python API on this thread before torch runs it, and:

* ``repr``/``format`` of a fake describe it (shape, dtype, device, "fake") instead of reading
  values it does not have;
* ``tolist``, ``numpy`` and ``__array__`` of a fake, and ``torch.tensor``/``as_tensor`` of data
  holding fakes (``torch.tensor([f / 2 for f in freqs])``), read the fakes' values the way
  ``item()`` does (Note [Reading values while recording]); torch implements them by reading memory
  without the dispatcher, where the recorder cannot answer;
* ``new``/``new_tensor`` on a fake return a fake of its dtype and device (torch derives their
  options from the dispatch keys, which name no device for fakes);
* ``p.data = fake`` on a real tensor is refused: it would leave ``p`` neither real nor fake;
* ``copy.deepcopy`` of a tensor copies its storage with recorded ops (Note [Deep copies of
  fakes] in ``_deepcopy.py``): torch's own copy goes through ``untyped_storage()``;
* ``torch.nn.init.trunc_normal_`` becomes one recorded operator (Note [trunc_normal_ as one
  operator] in bindings/src/trunc_normal.cpp). Torch's ``trunc_normal_`` does not consult
  ``__torch_function__`` itself, so the mode takes the first call its sampler makes on the
  tensor, reading ``tensor.is_meta``: when the caller (past the torch-function modes above this
  one that forwarded the call, such as the ``torch.device(...)`` context Hugging Face builds
  models in) is the sampler's own code object (``torch.nn.init._no_grad_trunc_normal_``, however
  the user reached it: Hugging Face keeps its own reference to ``trunc_normal_``), the mode runs ``torchdefer::trunc_normal_`` on the tensor
  with the sampler's arguments and answers True, and the sampler returns the tensor as it does for
  meta tensors. Only that one frame sees the answer; the result is the tensor torch's sampler
  would have filled, with the same bits (the operator's kernel is the same sequence of ATen
  calls). With an explicit ``generator`` the sampler runs as torch wrote it.
  Why not another route: replacing ``_no_grad_trunc_normal_`` in ``torch.nn.init`` is visible to
  every thread while recording runs, and a trace function cannot replace a call's result.
  If a torch release reorders the sampler so that ``is_meta`` is not its first look at the
  tensor, the calls go through one by one and the recording holds value reads instead of one
  operator; tests/python/test_torchdefer.py checks that the recording holds the operator.

Torch's Python factories also call ``torch.cuda._lazy_init()`` for a CUDA device before the
dispatcher sees the call, which fails where CUDA is unavailable, although a fake needs no CUDA.
Torch's C++ layer skips that call for a device type it considers initialized
(``torch::utils::set_requires_device_init``, a process-wide flag). Where CUDA is unavailable, the
mode marks CUDA initialized while it is active (from its ``__enter__`` to its ``__exit__``; a
count kept under a lock, so that nested and concurrent modes clear it once and the last one out
sets it again), instead of replacing ``torch.cuda._lazy_init``. It once did so around each call it
forwarded: two calls into the extension per torch call (10,364 for a Hugging Face Llama-70B
``deferred_init``), for a window that covered most of the recording anyway. Another
thread that asks for a real CUDA tensor during that window, on a machine without CUDA, gets the
dispatcher's error ("Could not run ... with arguments from the 'CUDA' backend") instead of
torch's "Torch not compiled with CUDA enabled"; its call fails either way. Where CUDA is
available nothing is changed, and CUDA initializes as usual.

Outside the mode (after ``deferred_init`` returned, after ``fake_mode`` exited) torch's own
methods run on fakes: ``repr`` of a fake raises torch's value read error, which says how to
print one (docs/python.md), and ``tolist``/``numpy``/``new_tensor`` raise the fake's "no data"
error. ``torchdefer.describe(t)`` describes a fake anywhere. The fakes deferred_init hands out
keep this mode's ``new``/``new_tensor`` and ``trunc_normal_`` until they are real, through a
class of their own (Note [Handed-out fakes after deferred_init] in ``_after_return.py``).
"""

from __future__ import annotations

import sys
import threading
import types
import warnings
from typing import Any, Callable, Dict

import torch
from torch.overrides import TorchFunctionMode

from torchdefer import _C, _bit_views, _deepcopy

_TensorBase = torch._C.TensorBase
_IS_META = _TensorBase.__dict__["is_meta"]
_DATA = _TensorBase.__dict__["data"]
_SAMPLER_CODE = torch.nn.init._no_grad_trunc_normal_.__code__


def fake_repr(tensor: torch.Tensor) -> str:
    """What ``repr`` prints for a fake while recording or faking: shape, dtype, device, "fake"."""
    return f"FakeTensor({_C.describe(tensor)}, requires_grad={tensor.requires_grad})"


def _with_values(data: Any) -> Any:
    """``data`` (a tensor, or lists and tuples of them, nested) with every fake replaced by its
    values, read as ``item()`` reads them."""
    if isinstance(data, torch.Tensor):
        return _C.read_values(data) if _C.is_fake(data) else data
    if isinstance(data, (list, tuple)):
        return type(data)(_with_values(item) for item in data)
    return data


def _holds_fake(data: Any) -> bool:
    if isinstance(data, torch.Tensor):
        return _C.is_fake(data)
    if isinstance(data, (list, tuple)):
        return any(_holds_fake(item) for item in data)
    return False


def _repr(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    if _C.is_fake(args[0]):
        return fake_repr(args[0])
    return func(*args, **kwargs)


def _format(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    self, spec = args[0], args[1] if len(args) > 1 else kwargs.get("format_spec", "")
    if not _C.is_fake(self) or self.dim() == 0:
        return func(*args, **kwargs)  # a 0-dim fake formats its value, read as item() reads it
    # Torch formats a tensor with dimensions as object.__format__ does: str(self), no spec. The
    # mode is entered again for the repr, which runs in this handler, where torch popped it.
    if spec:
        raise TypeError(f"unsupported format string passed to {type(self).__name__}.__format__")
    with mode():
        return str(self)


def _read(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    self = args[0]
    if not _C.is_fake(self):
        return func(*args, **kwargs)
    # requires_grad kept, so that numpy() refuses (or, with force=True, accepts) as in eager.
    values = _C.read_values(self).requires_grad_(self.requires_grad)
    return func(values, *args[1:], **kwargs)


def _from_data(func: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
    # A tensor itself goes through the dispatcher (detach, to), where fakes are recorded; only
    # sequences of tensors are read from memory.
    if args and isinstance(args[0], (list, tuple)) and _holds_fake(args[0]):
        args = (_with_values(args[0]),) + tuple(args[1:])
    return func(*args, **kwargs)


def _new_tensor_of(self: torch.Tensor, data: Any, dtype=None, device=None, requires_grad=False):
    # A tensor itself is copied through the dispatcher (recorded); only sequences are read.
    data = data if isinstance(data, torch.Tensor) else _with_values(data)
    values = torch.tensor(data, dtype=self.dtype if dtype is None else dtype)
    # Made from `self` by dispatcher ops, so that the result belongs to `self`'s recording also
    # after deferred_init returned (Note [Handed-out fakes after deferred_init], _after_return.py).
    made = self.new_empty(values.shape, dtype=values.dtype, device=self.device if device is None else device)
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
    if len(sizes) == 1 and not isinstance(sizes[0], (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)):
        return _new_tensor_of(self, sizes[0], device=device)
    # A RuntimeError, never a TypeError that library code may catch (Note [Refusals are
    # RuntimeErrors], core/src/fake_fallback.cpp).
    raise RuntimeError(
        "torchdefer: Tensor.new(tensor or storage) is not supported on a fake "
        f"({_C.describe(self)}); use new_tensor(data), new_empty(sizes) or the tensor itself"
    )


_HANDLERS: Dict[Any, Callable[[Callable, tuple, Dict[str, Any]], Any]] = {
    torch.Tensor.__repr__: _repr,
    torch.Tensor.__format__: _format,
    _TensorBase.tolist: _read,
    _TensorBase.numpy: _read,
    torch.Tensor.__array__: _read,
    torch.tensor: _from_data,
    torch.as_tensor: _from_data,
    _TensorBase.new_tensor: _new_tensor,
    _TensorBase.new: _new,
    torch.Tensor.__deepcopy__: _deepcopy.deepcopy,  # Note [Deep copies of fakes]
    torch.adjoint: _bit_views.adjoint,
    _TensorBase.adjoint: _bit_views.adjoint,
}


def _data_setter(args: tuple) -> None:
    """``self.data = value``: refused when it would put a fake into a real tensor."""
    self, value = args[0], args[1]
    if isinstance(value, torch.Tensor) and _C.is_fake(value) and not _C.is_fake(self):
        raise RuntimeError(
            f"torchdefer: `.data = fake` on a real tensor ({tuple(self.shape)}, {self.dtype}, "
            f"{self.device}) would leave it neither real nor fake: it would carry the fake "
            f"{_C.describe(value)} without being one, and could be neither read nor materialized. "
            "Build the parameter from the fake instead (`module.weight = nn.Parameter(t)`), or "
            "create it under deferred_init so that it is fake too."
        )


def _recorded_trunc_normal(frame: types.FrameType) -> bool:
    """Runs the trunc_normal_ call whose sampler frame is `frame` as torchdefer::trunc_normal_;
    False (changing nothing) when it has an explicit generator."""
    arguments = frame.f_locals
    if arguments.get("generator") is not None:
        return False
    tensor, mean, std = arguments["tensor"], arguments["mean"], arguments["std"]
    a, b = arguments["a"], arguments["b"]
    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn(
            f"torchdefer: trunc_normal_ with mean {mean} more than 2 std ({std}) outside [{a}, {b}]: "
            "the values drawn may not follow the intended distribution.",
            stacklevel=5,
        )
    with torch.no_grad():
        torch.ops.torchdefer.trunc_normal_(tensor, mean, std, a, b)
    return True


def runs_trunc_normal(caller: types.FrameType) -> bool:
    """Whether an ``is_meta`` read that ``caller`` made is the first look of torch's trunc_normal_
    sampler at a fake, which has then been run as one recorded torchdefer::trunc_normal_ (True
    is the sampler's answer)."""
    caller = _caller_outside_modes(caller)
    return caller.f_code is _SAMPLER_CODE and _recorded_trunc_normal(caller)


def _caller_outside_modes(frame: types.FrameType) -> types.FrameType:
    """The frame that made the call, past the torch-function modes above this one (the device
    context fake_mode enters, a user's mode) that forwarded it."""
    while frame.f_code.co_name == "__torch_function__" and frame.f_back is not None:
        frame = frame.f_back
    return frame


class _CudaMarkedInitialized:
    """The modes that need CUDA marked initialized (Note [What recording changes, and where]):
    the flag is cleared when the first one enters and set again when the last one exits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0

    def enter(self) -> None:
        with self._lock:
            if self._active == 0:
                _C._set_requires_cuda_init(False)
            self._active += 1

    def exit(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                _C._set_requires_cuda_init(True)


_cuda_marked_initialized = _CudaMarkedInitialized()


class FakeTensorFunctions(TorchFunctionMode):
    """The torch-function mode of deferred_init and fake_mode (Note [What recording changes, and
    where]). ``skip_cuda_init`` is whether CUDA is unavailable, so that torch's factories must not
    try to initialize it for a fake."""

    def __init__(self, skip_cuda_init: bool) -> None:
        super().__init__()
        self._skip_cuda_init = skip_cuda_init

    def __enter__(self):
        if self._skip_cuda_init:
            _cuda_marked_initialized.enter()
        try:
            return super().__enter__()
        except BaseException:
            if self._skip_cuda_init:
                _cuda_marked_initialized.exit()
            raise

    def __exit__(self, exc_type, exc_value, traceback):
        try:
            return super().__exit__(exc_type, exc_value, traceback)
        finally:
            if self._skip_cuda_init:
                _cuda_marked_initialized.exit()

    # Every call into torch's Python API on this thread passes here while recording, so the
    # common case (no handler, not a descriptor) is kept to one dictionary lookup and one test.
    def __torch_function__(self, func, types, args=(), kwargs=None):
        handler = _HANDLERS.get(func)
        if handler is not None:
            return handler(func, args, kwargs or {})
        if type(func) is _METHOD_WRAPPER:
            descriptor = func.__self__
            if descriptor is _IS_META:
                if runs_trunc_normal(sys._getframe(1)):
                    return True
            elif descriptor is _DATA and func.__name__ == "__set__":
                _data_setter(args)
            elif descriptor in _bit_views.GETTERS:
                _bit_views.refuse_if_conjugating(f".{descriptor.__name__}", args[0])
        return func(*args, **kwargs) if kwargs else func(*args)


_METHOD_WRAPPER = type(_IS_META.__get__)


def mode() -> FakeTensorFunctions:
    """A new mode for this thread's deferred_init or fake_mode."""
    return FakeTensorFunctions(skip_cuda_init=not torch.cuda.is_available())
