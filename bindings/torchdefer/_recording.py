"""What deferred_init and fake_mode change in torch's Python layer while they run.

Note [What recording changes, and where]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Importing torchdefer changes nothing in torch. What fakes need from torch's Python layer (below)
is done by stand-ins for a few of torch's Python entry points, installed while any
:func:`torchdefer.deferred_init`, ``deferred()`` block or :func:`torchdefer.fake_mode` is open on
any thread (:class:`FakeTensorFunctions`, a count under a lock: the first to open installs them,
the last to close, by return or by exception, puts torch's own objects back, so that afterwards
torch is as it was, but for the caches and patches said below). Each stand-in acts only for a
fake (one ``_C.is_fake`` test), or for ``deepcopy`` and unpickling of any tensor, and only on a
thread that has one of them open (a thread-local list, so threads a recording starts, and every
other thread, get torch's behaviour); otherwise it calls torch's own object, handing a tensor
subclass's or torch-function mode's ``__torch_function__`` torch's own object as ``func``, as
torch does (``torch.overrides.handle_torch_function``). The stand-ins, the ``recording`` column
of the one table of stand-ins in ``_stand_ins.py`` (Note [One table of stand-ins]):

* ``torch.Tensor.__repr__``: ``repr``/``str``/``format`` of a fake describe it (shape, dtype,
  device, "fake") instead of reading values it does not have (``__format__`` of a fake with
  dimensions is ``str``; of a 0-dim one, its value read as ``item()`` reads it);
* ``tolist`` and ``numpy``, shadowed on ``torch.Tensor`` (torch's are ``TensorBase``'s; numpy's
  ``__array__`` calls ``numpy()``), and ``torch.tensor``/``torch.as_tensor`` of data holding fakes
  (``torch.tensor([f / 2 for f in freqs])``), read the fakes' values the way ``item()`` does (Note
  [Reading values while recording]); torch implements them by reading memory without the
  dispatcher, where the recorder cannot answer;
* ``new``/``new_tensor``, shadowed on ``torch.Tensor``: on a fake they return a fake of its dtype
  and device (torch derives their options from the dispatch keys, which name no device for fakes);
* ``data``, shadowed on ``torch.Tensor`` by a property: ``p.data = fake`` on a real tensor is
  refused, since it would leave ``p`` neither real nor fake. The C++ layer cannot refuse it: the
  recorder sees ``aten::set_data`` only for recorded fakes, and ``fake_mode``'s fakes reach torch's
  composite kernel, which checks no more than that the two tensors are both dense;
* ``torch.Tensor.__deepcopy__``: ``copy.deepcopy`` of a tensor copies its storage with recorded
  ops (Note [Deep copies of fakes] in ``_deepcopy.py``): torch's own copy goes through
  ``untyped_storage()``;
* ``torch.nn.init._no_grad_trunc_normal_``, the sampler that ``trunc_normal_`` looks up as a
  module global at each call, so that every reference to ``trunc_normal_`` reaches it (Hugging
  Face keeps its own): for a fake it runs ``torchdefer::trunc_normal_`` on the tensor instead,
  with the same ``generator``, one recorded operator (Note [trunc_normal_ as one operator] in
  recorder/src/trunc_normal.cpp) with the same bits (the operator's kernel is the same sequence
  of ATen calls) and torch's warning. For a real or meta tensor the sampler runs as torch wrote
  it;
* ``torch._utils._rebuild_tensor``, which ``pickle.loads`` and ``torch.load`` (also with
  ``weights_only``; ``_rebuild_tensor_v2`` and ``_rebuild_parameter`` reach it as a module global)
  call to put a loaded storage into a tensor: torch's makes that tensor with ``torch.empty``, a
  factory, so a fake, which cannot hold the real storage (Note [Loading real tensors while
  recording]).

Note [Loading real tensors while recording]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The storage of an unpickled or loaded tensor is real (its bytes come from the file or the pickle,
not from a factory), and eager gives a real tensor; so does a recording or ``fake_mode``: the
stand-in makes the empty tensor by an op on a real tensor (``to`` with ``copy=True`` of an empty
real tensor made at import), which computes for real as every op on real tensors alone does, and
then runs torch's ``set_``, which the recorder sees as any write into a real tensor. The loaded
tensor is then one of the real tensors construction makes (Note [Real tensors written while
recording] in recorder/src/recording.cpp): registered as a buffer, copied into a fake
(``load_state_dict``) or read by recorded ops, it holds eager's values. It acts for every call on
a thread with a recording or fake mode open (a loaded storage is never a fake's), and calls
torch's function elsewhere.

Conjugate views of complex fakes (``.mH``, ``.H``, ``adjoint()``) need nothing here: the recorder
refuses them by the op table's BitView column (Note [Conjugate and negative views of fakes],
recorder/src/recording.cpp). Under ``fake_mode``, which records nothing to materialize, they are
made, as ``conj()`` is.

Why stand-ins, and not a ``torch.overrides.TorchFunctionMode`` (which this once was): a mode
is per thread and touches no torch object, but torch then hands every call into its Python API
on that thread to the mode (about 1 µs a call written in C, 2–2.5 µs one written in Python,
nearly all torch's own dispatch), for the few calls above: 0.3 of a Hugging Face Llama-70B's meta
construction time (docs/results.md, "Hugging Face recording"). The stand-ins cost nothing for
other calls. What they change while one is open, for every thread: the identity of those
attributes (``torch.Tensor.tolist is torch._C.TensorBase.tolist`` does not hold, and
``torch.Tensor.data`` is a property), and each call of them on a real tensor costs a Python
call more and runs torch's own: +0.21 µs for ``p.data``, +0.37 µs for ``p.data = t``, +0.55 µs
for ``t.tolist()``, +0.11 µs for ``torch.tensor([1.0, 2.0])`` (interleaved ``timeit`` A/B in one
process, another thread holding ``fake_mode`` open or not; median of 3, load 4.8). A subclass or
mode sees torch's own function as ``func``, through torch's Python ``handle_torch_function``; a
mode that was entered inside the recording now sees such a call after the stand-in acted, not
before. So a ``__torch_function__`` that compares ``func is torch.Tensor.tolist`` finds them
different while the stand-ins are installed, on every thread; nothing here can change that.
A reference taken while the stand-ins are installed (``f = torch.Tensor.tolist``) keeps the
stand-in, and works, with torch's behaviour once they are gone.

What torch derives from those attributes must not keep the stand-ins. Torch's caches of them
(``torch.utils._device._device_constructors``, which ``with torch.device(...)`` and
``set_default_device`` use to reroute ``torch.tensor``; ``torch.overrides``'
``get_ignored_functions``, ``get_overridable_functions``, ``get_testing_overrides`` and
``_get_tensor_methods``) are filled before the first install, once a process (about 15 ms).
Dynamo's caches (``trace_rules.get_torch_obj_rule_map`` and ``get_tensor_method``,
``variables.torch.get_overridable_functions``, ``TorchInGraphFunctionVariable._get_handlers``)
are imported only with dynamo: one that was filled while installed (a first ``torch.compile`` on
any thread) is emptied when the stand-ins go, to be filled again with torch's objects.
TorchScript finds an operator by the identity of the Python object a name refers to: the
stand-ins for ``torch.tensor`` and ``torch.as_tensor`` are registered as ``aten::tensor`` and
``aten::as_tensor`` to it, at the first install, for the life of the process.

An attribute that someone else replaced while the stand-ins were installed (a library's patch,
on any thread) keeps the replacement when they go: only a stand-in still in place is put back.
A patch that saved the stand-in and puts it back after the recording closed leaves the stand-in
installed until the next recording closes; it acts as torch's own meanwhile (no recording is
open), at a Python call more.
A child forked while the stand-ins are installed keeps only the forking thread: its count
becomes that thread's open recordings, and torch is restored at once where it has none.

Torch's Python factories also call ``torch.cuda._lazy_init()`` for a CUDA device before the
dispatcher sees the call, which fails where CUDA is unavailable, although a fake needs no CUDA.
Torch's C++ layer skips that call for a device type it considers initialized
(``torch::utils::set_requires_device_init``, a process-wide flag). Where CUDA is unavailable,
CUDA is marked initialized while a recording or fake mode is open (the first to open clears the
flag, the last to close sets it again; a handed-out fake's ``new_tensor`` counts as one for its
call, so that it never sets the flag under a recording on another thread; ``_cuda_init.py``),
instead of replacing ``torch.cuda._lazy_init``. Another
thread that asks for a real CUDA tensor during that window, on a machine without CUDA, gets the
dispatcher's error ("Could not run ... with arguments from the 'CUDA' backend") instead of
torch's "Torch not compiled with CUDA enabled"; its call fails either way. Where CUDA is
available nothing is changed, and CUDA initializes as usual.

Outside (after ``deferred_init`` returned, after ``fake_mode`` exited, on other threads) torch's
own methods run on fakes. The fakes deferred_init hands out, and the fakes computed from them,
keep ``repr``, ``new``/``new_tensor``, the reads and ``trunc_normal_`` until they are real,
through a class of their own (Note [Handed-out fakes after deferred_init] in
``_stand_ins.py``), the table's ``handed_out`` column. Other
fakes (``fake_mode``'s, those held only as plain attributes): ``repr`` raises torch's value read
error, which says how to print one (docs/python.md), and ``tolist``/``numpy``/``new_tensor`` raise
the fake's "no data" error. ``torchdefer.describe(t)`` describes a fake anywhere.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.utils._device

from torchdefer import _cuda_init, _stand_ins

_GETSET_DESCRIPTOR = type(torch._C.TensorBase.__dict__["data"])
_has_torch_function_unary = torch._C._has_torch_function_unary
_handle_torch_function = torch.overrides.handle_torch_function


class _ThisThread(threading.local):
    def __init__(self) -> None:
        # The FakeTensorFunctions open on this thread, innermost last.
        self.open: List["FakeTensorFunctions"] = []


_this_thread = _ThisThread()


def _as_torch_calls(original: Callable) -> Callable:
    """``original`` (a torch.Tensor method) called as torch calls it: a subclass's or mode's
    ``__torch_function__`` gets ``original`` as ``func``, not the stand-in installed in its place,
    which torch's own lookup of ``torch.Tensor.<name>`` would find."""

    def call(self, *args, **kwargs):
        if _has_torch_function_unary(self):
            return _handle_torch_function(original, (self,), self, *args, **kwargs)
        return original(self, *args, **kwargs)

    return call


def _while_open(torchs: Callable, handler: _stand_ins.Handler, like: Optional[Callable] = None) -> Callable:
    """A stand-in that runs ``handler`` on a thread with a recording or fake mode open, and
    ``torchs`` (torch's own object, called as torch calls it) otherwise."""

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        if _this_thread.open:
            return handler(torchs, args, kwargs)
        return torchs(*args, **kwargs)

    return stand_in if like is None else functools.wraps(like)(stand_in)


def _installed_object(owner: Any, name: str, handler: _stand_ins.Handler) -> Any:
    """What stands in for ``owner.name`` while open, running ``handler``: for a method, one calling
    torch's as torch calls it; for the ``data`` property, one whose setter is ``handler``."""
    torchs = _stand_ins.torchs_object(owner, name)
    if isinstance(torchs, _GETSET_DESCRIPTOR):
        get, set_ = _as_torch_calls(torchs.__get__), _as_torch_calls(torchs.__set__)

        def deleter(self: torch.Tensor) -> None:
            torchs.__delete__(self)  # torch's refusal

        return property(get, _while_open(set_, handler), deleter, doc=torchs.__doc__)
    if owner is torch.Tensor:
        return _while_open(_as_torch_calls(torchs), handler, like=torchs)
    return _while_open(torchs, handler, like=torchs)


# (owner, attribute name, stand-in) for each of torch's objects replaced while open.
_STAND_INS = [(row.owner, row.name, _installed_object(row.owner, row.name, row.recording))
              for row in _stand_ins.STAND_INS if row.recording is not None]
_MISSING = object()
# Torch's objects, read at import, when no stand-in is installed.
_TORCHS = {(owner, name): vars(owner).get(name, _MISSING) for owner, name, _ in _STAND_INS}


def _fill_torchs_caches() -> None:
    """Fills torch's caches that hold the objects the stand-ins replace, before the first install
    (Note [What recording changes, and where]): filled while they are installed, they would keep
    the stand-ins for the life of the process."""
    torch.utils._device._device_constructors()  # what `with torch.device(...)` reroutes
    torch.overrides.get_ignored_functions()
    torch.overrides.get_overridable_functions()
    torch.overrides.get_testing_overrides()
    torch.overrides._get_tensor_methods()


def _register_with_torchscript() -> None:
    """TorchScript finds torch's operators by the Python object a name refers to: the stand-ins
    for torch.tensor and torch.as_tensor are the same operators to it, for the life of the
    process (the stand-ins never die), also where another library's patch keeps one installed."""
    for owner, name, stand_in in _STAND_INS:
        if owner is torch:
            torch.jit._builtins._register_builtin(stand_in, f"aten::{name}")


def _dynamos_caches() -> List[Any]:
    """Dynamo's caches of torch's functions, of the modules imported so far (torch 2.11 and 2.13
    names; a cache a version lacks is not there)."""
    caches = []
    trace_rules = sys.modules.get("torch._dynamo.trace_rules")
    if trace_rules is not None:
        caches += [getattr(trace_rules, "get_torch_obj_rule_map", None),
                   getattr(trace_rules, "get_tensor_method", None)]
    torch_variables = sys.modules.get("torch._dynamo.variables.torch")
    if torch_variables is not None:
        in_graph = getattr(torch_variables, "TorchInGraphFunctionVariable", None)
        caches += [getattr(torch_variables, "get_overridable_functions", None),
                   getattr(in_graph, "_get_handlers", None)]
    return [cache for cache in caches if hasattr(cache, "cache_info")]


class _Installed:
    """The stand-ins (and CUDA marked initialized, where it is unavailable), while any
    FakeTensorFunctions is open on any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = 0
        self._caches_filled = False
        # (owner, name, stand-in, what owner.__dict__ held: torch's object, or _MISSING where
        # inherited).
        self._saved: List[Tuple[Any, str, Any, Any]] = []
        # Dynamo's caches, with their number of misses when the stand-ins were installed.
        self._dynamo_misses: Dict[Any, int] = {}

    def enter(self, skip_cuda_init: bool) -> None:
        with self._lock:
            if self._open == 0:
                self._install()
            self._open += 1
            if skip_cuda_init:
                _cuda_init.skip()

    def exit(self, skip_cuda_init: bool) -> None:
        with self._lock:
            if skip_cuda_init:
                _cuda_init.stop_skipping()
            self._open -= 1
            if self._open == 0:
                self._uninstall()

    def after_fork_in_child(self) -> None:
        """In a child forked while installed, only the forking thread goes on: the count becomes
        its own open recordings, and torch is restored if it has none."""
        self._lock = threading.Lock()
        open_here = _this_thread.open
        _cuda_init.after_fork_in_child(sum(1 for opened in open_here if opened._skip_cuda_init))
        self._open = len(open_here)
        if self._open == 0 and self._saved:
            self._uninstall()

    def _install(self) -> None:
        if not self._caches_filled:
            _fill_torchs_caches()
            _register_with_torchscript()
            self._caches_filled = True
        self._dynamo_misses = {cache: cache.cache_info().misses for cache in _dynamos_caches()}
        for owner, name, stand_in in _STAND_INS:
            found = vars(owner).get(name, _MISSING)
            # A stand-in that a patch put back after the last close is replaced by torch's object
            # when this window closes.
            torchs = _TORCHS[(owner, name)] if found is stand_in else found
            self._saved.append((owner, name, stand_in, torchs))
            setattr(owner, name, stand_in)

    def _uninstall(self) -> None:
        while self._saved:
            owner, name, stand_in, torchs = self._saved.pop()
            # Replaced by someone else while installed: the replacement stays.
            if vars(owner).get(name, _MISSING) is not stand_in:
                continue
            if torchs is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, torchs)
        # A cache that computed its answer while installed holds stand-ins: it is emptied, to be
        # filled again with torch's objects at its next use.
        for cache in _dynamos_caches():
            if cache.cache_info().misses != self._dynamo_misses.get(cache, 0):
                cache.cache_clear()
        self._dynamo_misses = {}


_installed = _Installed()
os.register_at_fork(after_in_child=_installed.after_fork_in_child)


class FakeTensorFunctions:
    """What deferred_init, a deferred() block and fake_mode open on their thread (Note [What
    recording changes, and where]). ``skip_cuda_init`` is whether CUDA is unavailable, so that
    torch's factories must not try to initialize it for a fake."""

    def __init__(self, skip_cuda_init: bool) -> None:
        self._skip_cuda_init = skip_cuda_init
        self._open_on: Optional[List["FakeTensorFunctions"]] = None

    def __enter__(self) -> "FakeTensorFunctions":
        _installed.enter(self._skip_cuda_init)
        self._open_on = _this_thread.open
        self._open_on.append(self)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        # From the list of the thread that opened it, wherever it is (an exit out of order, or on
        # another thread, closes this one and no other).
        open_on, self._open_on = self._open_on, None
        for i in range(len(open_on) - 1, -1, -1):
            if open_on[i] is self:
                del open_on[i]
                break
        _installed.exit(self._skip_cuda_init)


def mode() -> FakeTensorFunctions:
    """A new FakeTensorFunctions for this thread's deferred_init or fake_mode."""
    return FakeTensorFunctions(skip_cuda_init=not torch.cuda.is_available())


def innermost() -> Optional[FakeTensorFunctions]:
    """The innermost FakeTensorFunctions open on this thread, if any."""
    open_here = _this_thread.open
    return open_here[-1] if open_here else None
