"""A ``torch.distributed.checkpoint`` directory as a checkpoint for ``materialize_module``: every
box of a call read in one ``dcp.load``, and of each stored chunk only the bytes the boxes need.

Note [Reading boxes of a DCP checkpoint]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
DCP's own planning decides which stored chunks overlap a box: a load planner turns every
requested box of the call (Note [One read for every tensor of a call] in
api/src/materialization.cpp) into the read items of the chunks it overlaps, and one
``dcp.load(..., no_dist=True)`` performs them all, each file opened once. ``no_dist``: each rank
reads its own boxes, so the load needs no collective, and ranks need not ask for the same names.

DCP's FileSystemReader reads a stored chunk whole (``torch.load`` of its bytes) before
narrowing it, so a rank reading 1/8 of a tensor saved as one chunk would read, and hold, all
of it. Here a chunk that ``torch.save`` wrote as a single contiguous tensor, in the file
untransformed and uncompressed, is located instead: its zip record's central directory and
``data.pkl`` (a few hundred bytes, unpickled with an unpickler that knows only the tensor
rebuild function, the storage classes and ``OrderedDict``) give the dtype, shape, strides and
byte offset of its elements, and just the rows of the box are read with ``os.preadv``: straight
into the destination when its part is contiguous and of the stored dtype, otherwise through a
staging buffer of at most 64 MB that is cast and copied. A chunk in any other form (a transform
such as compression, a view saved with a larger storage, a layout this does not recognise) is
read by FileSystemReader as before; the values are the same either way.

Note [Faulting in the destination step by step in Python]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The destinations are fresh memory, whose first touch costs more than the copy (Note [Touching
the destination just ahead of the read] in api/src/safetensors_file.cpp), so a run of at least
2 MB read straight into one is read as the C++ reader reads it: 2 MB at a time, each step
faulted in with ``madvise(MADV_POPULATE_WRITE)`` (through ctypes; Linux 5.14+; elsewhere, or
where the kernel refuses it, the preadv faults the pages in as before) just before its preadv.
A read that casts stages through one buffer that every item of a ``read_data`` shares, so that
its pages are faulted in once rather than for every slab (Note [One staging buffer for a
batch] in the same file).
"""

from __future__ import annotations

import collections
import ctypes
import io
import itertools
import math
import os
import pickle
import struct
import sys
import warnings
import zipfile
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.futures import Future

_MAX_BUFFER_BYTES = 64 << 20
_TOUCH_STEP = 2 << 20
_MADV_POPULATE_WRITE = 23  # linux/mman.h, Linux 5.14+
_PAGE = os.sysconf("SC_PAGESIZE") if hasattr(os, "sysconf") else 4096
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # a zip local file header, 30 bytes


class _Window(io.RawIOBase):
    """Bytes [offset, offset + length) of an open file, read with os.pread: what zipfile needs
    to find the records of one stored chunk without reading its data."""

    def __init__(self, fd: int, offset: int, length: int) -> None:
        super().__init__()
        self._fd, self._offset, self._length, self._pos = fd, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = base + pos
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self._length - self._pos))
        data = os.pread(self._fd, n, self._offset + self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


class _Stored:
    """Where a stored chunk's elements lie: an absolute byte offset, its dtype and shape."""

    def __init__(self, offset: int, dtype: torch.dtype, sizes: Tuple[int, ...]) -> None:
        self.offset, self.dtype, self.sizes = offset, dtype, sizes


class _Rebuilt:
    def __init__(self, storage: Tuple[str, torch.dtype], offset: int, size: Any, stride: Any) -> None:
        self.key, self.dtype = storage
        self.storage_offset, self.size, self.stride = offset, tuple(size), tuple(stride)


def _rebuild_tensor_v2(storage: Any, storage_offset: int, size: Any, stride: Any, *rest: Any) -> _Rebuilt:
    return _Rebuilt(storage, storage_offset, size, stride)


class _LayoutUnpickler(pickle.Unpickler):
    """Reads a tensor's data.pkl into a _Rebuilt, refusing anything else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name.endswith("Storage") and name != "UntypedStorage":
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Tuple[str, torch.dtype]:
        kind, storage_type, key, _location, _numel = pid
        if kind != "storage":
            raise pickle.UnpicklingError(str(kind))
        return key, storage_type._dtype  # .dtype warns that TypedStorage is deprecated


def _contiguous_strides(sizes: Sequence[int]) -> Tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _locate(fd: int, offset: int, length: int) -> Optional[_Stored]:
    """The elements of the torch.save record at [offset, offset + length), or None when it is
    not one contiguous tensor stored uncompressed (Note [Reading boxes of a DCP checkpoint])."""
    try:
        archive = zipfile.ZipFile(_Window(fd, offset, length))
        records = {info.filename.split("/", 1)[-1]: info for info in archive.infolist()}
        if "data.pkl" not in records or (
            "byteorder" in records and archive.read(records["byteorder"]) != b"little"
        ):
            return None
        rebuilt = _LayoutUnpickler(io.BytesIO(archive.read(records["data.pkl"]))).load()
    except (zipfile.BadZipFile, pickle.UnpicklingError, ValueError, KeyError, TypeError, AttributeError, EOFError):
        return None
    if not isinstance(rebuilt, _Rebuilt) or rebuilt.stride != _contiguous_strides(rebuilt.size):
        return None
    info = records.get(f"data/{rebuilt.key}")
    if info is None or info.compress_type != zipfile.ZIP_STORED:
        return None
    itemsize = torch.empty((), dtype=rebuilt.dtype).element_size()
    if info.file_size < (rebuilt.storage_offset + math.prod(rebuilt.size)) * itemsize:
        return None
    header = os.pread(fd, _LOCAL_HEADER.size, offset + info.header_offset)
    if len(header) != _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
        return None
    name_length, extra_length = _LOCAL_HEADER.unpack(header)[-2:]
    data = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
    return _Stored(offset + data + rebuilt.storage_offset * itemsize, rebuilt.dtype, rebuilt.size)


def _madvise() -> Optional[Callable[[int, int, int], int]]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_MADVISE = _madvise()


def _populate_for_write(address: int, nbytes: int) -> None:
    """Faults in the whole pages of [address, address + nbytes) (Note [Faulting in the
    destination step by step in Python]); a refusal leaves them to the read's own faults."""
    first = (address + _PAGE - 1) // _PAGE * _PAGE
    last = (address + nbytes) // _PAGE * _PAGE
    if _MADVISE is not None and first < last:
        _MADVISE(first, last - first, _MADV_POPULATE_WRITE)


def _preadv_exact(fd: int, view: memoryview, offset: int) -> None:
    while len(view):
        got = os.preadv(fd, [view], offset)
        if got <= 0:
            raise OSError(f"the file ends at byte {offset}")
        view, offset = view[got:], offset + got


def _preadv_fresh(fd: int, view: memoryview, offset: int, address: int) -> None:
    """_preadv_exact into fresh memory at ``address``, faulted in a step at a time just ahead
    of the read (Note [Faulting in the destination step by step in Python])."""
    for done in range(0, len(view), _TOUCH_STEP):
        step = view[done : done + _TOUCH_STEP]
        _populate_for_write(address + done, len(step))
        _preadv_exact(fd, step, offset + done)


class _Staging:
    """The staging buffer the items of one read_data share: grown to the largest slab asked
    for (at most 64 MB unless one index is larger) and kept."""

    def __init__(self) -> None:
        self._buffer = torch.empty(0, dtype=torch.uint8)

    def take(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if nbytes > self._buffer.numel():
            self._buffer = torch.empty(0, dtype=torch.uint8)
            self._buffer = torch.empty(nbytes, dtype=torch.uint8)
        return self._buffer[:nbytes].view(dtype).view(shape)


def _runs(strides: Sequence[int], offsets: Sequence[int], lengths: Sequence[int], inner: int) -> Any:
    """(first element, element count) of each contiguous run of a box, in the box's order."""
    count = lengths[inner] * strides[inner]
    base = offsets[inner] * strides[inner]
    outer = (range(o, o + n) for o, n in zip(offsets[:inner], lengths[:inner]))
    for index in itertools.product(*outer):
        yield base + sum(i * s for i, s in zip(index, strides)), count


def _read_box(
    fd: int, stored: _Stored, offsets: Sequence[int], lengths: Sequence[int], dest: torch.Tensor, staging: _Staging
) -> None:
    """Reads the box [offsets, offsets + lengths) of a stored chunk into ``dest``, a slab of whole
    indices of its first dimension (at most 64 MB unless one index is larger) at a time, run by
    run: a run is the innermost dimension the box does not cover whole, with every dimension
    inside it. Runs read straight into ``dest`` fault it in step by step; others stage through
    ``staging``."""
    itemsize = torch.empty((), dtype=stored.dtype).element_size()
    if not stored.sizes:
        staged = torch.empty(1, dtype=stored.dtype)
        _preadv_exact(fd, memoryview(staged.view(torch.uint8).numpy()), stored.offset)
        dest.copy_(staged[0])
        return
    strides = _contiguous_strides(stored.sizes)
    inner = len(stored.sizes) - 1
    while inner > 0 and offsets[inner] == 0 and lengths[inner] == stored.sizes[inner]:
        inner -= 1
    rows = max(1, _MAX_BUFFER_BYTES // max(1, math.prod(lengths[1:]) * itemsize))
    direct = dest.is_contiguous() and dest.dtype == stored.dtype and dest.device.type == "cpu"
    for first in range(0, lengths[0], rows):
        count = min(rows, lengths[0] - first)
        part = dest.narrow(0, first, count)
        target = part if direct else staging.take(part.shape, stored.dtype)
        buffer = memoryview(target.reshape(-1).view(torch.uint8).numpy())
        position = 0
        slab = [offsets[0] + first, *offsets[1:]], [count, *lengths[1:]]
        for element, elements in _runs(strides, *slab, inner):
            size = elements * itemsize
            run = buffer[position : position + size]
            if direct and size >= _TOUCH_STEP:
                _preadv_fresh(fd, run, stored.offset + element * itemsize, target.data_ptr() + position)
            else:
                _preadv_exact(fd, run, stored.offset + element * itemsize)
            position += size
        if not direct:
            part.copy_(target)


def box_reader_class() -> Any:
    """FileSystemReader reading only the boxes' bytes (imported lazily: DCP is optional)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan

    class BoxReader(FileSystemReader):
        def read_data(self, plan: LoadPlan, planner: Any) -> Future:
            rest = []
            staging = _Staging()
            located: Dict[Any, Optional[_Stored]] = {}
            per_file: Dict[str, List[Any]] = {}
            for item in plan.items:
                per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
            for relative_path, items in per_file.items():
                fd = os.open(self.fs.concat_path(self.path, relative_path), os.O_RDONLY)
                try:
                    for item in items:
                        info = self.storage_data[item.storage_index]
                        if item.type != LoadItemType.TENSOR or info.transform_descriptors:
                            rest.append(item)
                            continue
                        if item.storage_index not in located:
                            located[item.storage_index] = _locate(fd, info.offset, info.length)
                        stored = located[item.storage_index]
                        if stored is None or len(stored.sizes) != len(item.lengths):
                            rest.append(item)
                            continue
                        dest = planner.resolve_tensor(item).detach()
                        _read_box(fd, stored, item.storage_offsets, item.lengths, dest, staging)
                        planner.commit_tensor(item, dest)
                finally:
                    os.close(fd)
            if rest:
                super().read_data(LoadPlan(rest), planner).wait()
            done: Future = Future()
            done.set_result(None)
            return done

    return BoxReader


def _read_metadata(reader: Any, path: str) -> Any:
    """The Metadata of the DCP directory ``path``, refusing a ``.metadata`` that DCP's save did
    not write before anything is read (otherwise it fails in unpickling, or later, with an error
    that names neither the file nor what it should hold)."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        metadata = reader.read_metadata()
    except OSError:
        raise  # it names the file, and the file is not at fault
    except Exception as error:
        found = f"reading it fails with {type(error).__name__}: {error}"
    else:
        if isinstance(metadata, Metadata):
            return metadata
        found = f"it holds a {type(metadata).__name__}"
    raise RuntimeError(
        f"torchdefer: {os.path.join(path, '.metadata')} is not a torch.distributed.checkpoint "
        f"metadata file ({found}): a directory holding .metadata is read as a DCP checkpoint, and "
        "its .metadata must be the Metadata that torch.distributed.checkpoint.save writes; save the "
        "checkpoint again with it, or remove the stray .metadata. Nothing was loaded"
    )


def dcp_reader(path: str, python_checkpoint: Any) -> Any:
    """The C++ reader for the DCP directory ``path`` (Note [Reading boxes of a DCP checkpoint])."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata
    from torch.distributed.checkpoint.planner import LoadPlan
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

    reader_class = box_reader_class()
    metadata = _read_metadata(reader_class(path), path)
    stored = {
        name: item
        for name, item in metadata.state_dict_metadata.items()
        if isinstance(item, TensorStorageMetadata)
    }
    tensors = {name: (list(item.size), item.properties.dtype) for name, item in stored.items()}

    class BoxesPlanner(dcp.DefaultLoadPlanner):
        """Reads each requested box: the read items of the stored chunks that overlap it."""

        def __init__(self, boxes: Dict[str, Tuple[List[int], List[int], torch.Tensor]]) -> None:
            super().__init__()
            self._boxes = boxes

        def create_local_plan(self) -> LoadPlan:
            items = []
            for name, (start, stop, _) in self._boxes.items():
                chunk = ChunkStorageMetadata(
                    offsets=torch.Size(start), sizes=torch.Size(b - a for a, b in zip(start, stop))
                )
                items += create_read_items_for_chunk_list(name, stored[name], [chunk])
            return LoadPlan(items)

        def resolve_tensor(self, read_item: Any) -> torch.Tensor:
            # The item's part of its box; its offsets are relative to the box.
            part = self._boxes[read_item.dest_index.fqn][2]
            for dim, (offset, length) in enumerate(zip(read_item.dest_offsets, read_item.lengths)):
                part = part.narrow(dim, offset, length)
            return part

    def read_all(batch: List[Tuple[str, List[int], List[int], torch.Tensor]]) -> None:
        boxes = {name: (start, stop, out) for name, start, stop, out in batch if out.numel()}
        if not boxes:
            return
        with torch.no_grad(), warnings.catch_warnings():
            # no_dist is meant: each rank reads its own boxes (no warning that it is assumed).
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(
                {name: out for name, (_, _, out) in boxes.items()},
                storage_reader=reader_class(path),
                planner=BoxesPlanner(boxes),
                no_dist=True,
            )

    def read(name: str, start: List[int], stop: List[int], out: torch.Tensor) -> None:
        read_all([(name, start, stop, out)])

    return python_checkpoint(tensors, read, read_all)
