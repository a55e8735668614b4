"""``copy.deepcopy`` of fakes while recording: what ``Tensor.__deepcopy__`` does for a real
tensor, made of recorded ops.

Note [Deep copies of fakes]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
Model code deep-copies modules while building them: PyTorch Geometric's ``BasicGNN`` builds one
normalization layer and ``copy.deepcopy``-s it for every layer, ``nn.TransformerEncoder`` clones
its layer. A parameter's ``__deepcopy__`` clones its data, which records; a plain tensor's (a
buffer such as BatchNorm's ``running_mean``) copies its storage through ``untyped_storage()``,
which a fake does not have. While recording, a fake's deep copy is built the way eager builds
the real one, from ops the recorder records:

* the storage is copied once per deepcopy call (keyed in ``memo`` by the fake's storage identity,
  as eager keys storage copies by the storage): a fake of the whole storage (``as_strided`` over
  its bytes) is cloned, so that fakes that shared a storage before share the copy afterwards,
  views and ``detach()``-ed aliases alike;
* the copy is a detached alias of that clone with the original's size, stride and offset (eager:
  ``new_empty([]).set_(storage, offset, size, stride)``), then ``requires_grad``, ``grad`` and
  ``__dict__`` are copied as eager copies them.

A real tensor's deep copy is made the same way: torch's own copies its storage through a new
``UntypedStorage`` and ``set_``, whose factory makes a fake while recording; here the clone of
its storage runs for real, as every op on real tensors does (Note [Ops on real tensors run for
real]), and holds the values the tensor holds at the copy, as in eager.

The storage is copied as bytes, so tensors that see one storage with different dtypes share the
copy as they do in eager. Conjugate or negative views and tensor subclasses other than
``Parameter`` (which clones, and needs nothing here) are refused with a message naming the
tensor.

Note [Deep copies after deferred_init returned]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Training code deep-copies a model it has built to make an EMA or teacher model, before
materializing it: ``m = deferred_init(...); ema = copy.deepcopy(m)``. The fakes deferred_init handed
out (Note [Handed-out fakes after deferred_init], ``_stand_ins.py``) copy themselves the same
way: a buffer's ``__deepcopy__`` reaches their ``__torch_function__``, which builds the copy here
from ops recorded into the original's recording (torch's own copy would read a storage the fake
does not have), and a parameter's is torch's clone. Each copy is handed out in turn, so the copy
is a deferred model like the original: init code run on it after the copy (``trunc_normal_``,
``init_weights``) records into it, and each model materializes on its own, in either order, to
what eager's copy holds (the values at the copy, sharing and tying kept as eager keeps them); in
counter mode both are the full counter model's, shard by shard.

Fakes held as plain attributes (``self.inv_freq = ...``, also in lists, tuples and dicts) are not
handed out (finding them costs a walk of every attribute, too slow for every deferred_init), so
torch's own copy would run on them and read a storage they do not have. The deep copy finds them
instead: the first handed-out fake it copies looks up the module the copy rebuilds (the outermost
``copy._reconstruct`` frame of an ``nn.Module`` on the stack: the module passed to
``copy.deepcopy``, or the first of several) and copies, into the copy's ``memo``, every recorded
fake of class ``torch.Tensor`` its tree holds, the way a buffer is copied above; ``copy.deepcopy``
then finds each in ``memo`` when it reaches it, as it finds an object it copied before. Copies are
handed out, and storages shared as in eager, since the storage copies are keyed the same way. This
costs a walk of the copied tree's attributes once per deepcopy call. It misses a plain-attribute
fake that the copy reaches before any parameter or buffer fake, since nothing of torchdefer runs
before that (a plain ``torch.Tensor`` has no ``__torch_function__`` to ask, and ``nn.Module`` no
``__deepcopy__``):

* one held by a module that comes, in the module's own order (parameters, buffers, children, then
  attributes), before every module holding a parameter or buffer fake, as in
  ``nn.Sequential(Rotary(), nn.Linear(...))`` where ``Rotary`` holds its tables only as attributes;
* one of a module copied on its own that holds fakes only as attributes
  (``copy.deepcopy(model.rotary)``);
* one listed before the model in what is copied (``copy.deepcopy({"rope": model.rotary.inv_freq,
  "model": model})``), or in a module the ``memo`` passed to ``copy.deepcopy`` already maps
  (``copy.deepcopy(model, {id(model.linear): model.linear})``: the copy never copies a parameter).

Torch's copy then raises the fake's "Cannot access the data or storage of fake ..." error, from
C++, where no Python of torchdefer can name the deepcopy. Registering the table as a buffer
(``persistent=False`` keeps it out of the state dict), which is handed out and copies itself, or
materializing first, avoids it. Handing out plain attributes too would close all three, at the
cost of a walk of every attribute of every module at the end of every deferred_init (Note
[Handed-out fakes after deferred_init]).
"""

from __future__ import annotations

import copy
import sys
import types
from typing import Any, Callable, Dict, List, Optional

import torch

from torchdefer import _C, _module_tree

_RECONSTRUCT = copy._reconstruct.__code__


def _refuse(tensor: torch.Tensor, why: str) -> RuntimeError:
    return RuntimeError(
        f"torchdefer: copy.deepcopy of {_C.describe(tensor)} is not supported: {why}. Deep-copy "
        "the module before deferred_init or after materializing it, or build the copy with its "
        "own constructor call inside deferred_init."
    )


def _storage_copy(tensor: torch.Tensor, memo: Dict[Any, Any]) -> torch.Tensor:
    """The clone of `tensor`'s whole storage for this deepcopy call, made once per storage."""
    if _C.is_fake(tensor):
        identity, nbytes = _C._fake_storage(tensor)
    else:
        storage = tensor.untyped_storage()
        identity, nbytes = storage._cdata, storage.nbytes()
    key = ("torchdefer.storage", identity)
    if key not in memo:
        try:
            start = tensor.detach().as_strided((0,), (1,), 0).view(torch.uint8)
        except RuntimeError as error:  # a conjugate or negative view, whose bytes are not its values
            raise _refuse(tensor, "it is a conjugate or negative view") from error
        memo[key] = start.as_strided((nbytes,), (1,), 0).clone()
    # A storage seen with another dtype (a `view(dtype)`) is the same bytes, as in eager.
    return memo[key].view(tensor.dtype)


def deepcopy(func: Callable, args: tuple, kwargs: Dict[str, Any], handed_out: bool = False) -> Any:
    """The handler of ``Tensor.__deepcopy__`` (Note [Deep copies of fakes]): the recording's, and
    that of the fakes deferred_init handed out (``handed_out``: ``self``'s class is theirs, and the
    copy is a plain tensor, as eager's copy of a ``torch.Tensor`` is)."""
    self, memo = args[0], args[1] if len(args) > 1 else kwargs["memo"]
    if (not self.is_leaf or id(self) in memo or self.layout != torch.strided or self.is_quantized
            or self.is_meta):
        return func(*args, **kwargs)  # eager's own checks and memo, and its copies by clone()
    if type(self) is not torch.Tensor and not handed_out:
        raise _refuse(self, f"it is a {type(self).__name__}, a tensor subclass")
    with torch.no_grad():
        made = _storage_copy(self, memo).detach()
        made.as_strided_(self.size(), self.stride(), self.storage_offset())
        if self.requires_grad:
            made.requires_grad_()
        if self.grad is not None:
            made.grad = copy.deepcopy(self.grad, memo)
        made.__dict__ = copy.deepcopy(self.__dict__, memo)
    memo[id(self)] = made
    return made


def _module_being_copied(frame: Optional[types.FrameType]) -> Optional[torch.nn.Module]:
    """The outermost module that a ``copy.deepcopy`` enclosing ``frame`` is rebuilding, if any."""
    outermost = None
    while frame is not None:
        if frame.f_code is _RECONSTRUCT:
            rebuilt = frame.f_locals.get("x")
            if isinstance(rebuilt, torch.nn.Module):
                outermost = rebuilt
        frame = frame.f_back
    return outermost


def copy_held_fakes(memo: Dict[Any, Any]) -> List[torch.Tensor]:
    """Makes, into ``memo``, the deferred copies of the recorded fakes that the module being
    deep-copied holds as plain ``torch.Tensor`` attributes, so that the copy finds them there
    instead of running torch's copy, which reads their storage (Note [Deep copies after
    deferred_init returned]); returns them, for the caller to hand out. Once per module and
    deepcopy call; it changes nothing outside one."""
    root = _module_being_copied(sys._getframe(1))
    key = ("torchdefer.held fakes", id(root))
    if root is None or key in memo:
        return []
    memo[key] = True
    copies = []
    for _, tensor, _ in _module_tree.tree_tensors(root):
        if (type(tensor) is not torch.Tensor or id(tensor) in memo or not tensor.is_leaf
                or not _C.can_materialize(tensor)):
            continue  # handed out (copies itself), copied already, or torch's copy (which refuses)
        copies.append(deepcopy(torch.Tensor.__deepcopy__, (tensor, memo), {}))
        memo.setdefault(id(memo), []).append(tensor)  # its id stays its own, as copy keeps it
    return copies
