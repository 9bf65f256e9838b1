"""Values moving between the notebook and its hosts: pickled once, sent without copies.

A pushed value is pickled once for every host with protocol 5, its arrays kept out of band (not
copied). Up to ``transfer.INLINE`` bytes it travels in the request frame itself. Hosts on this
machine (a local slice) map one memfd the kernel writes once; other hosts get ``part`` frames
of at most 2 MB, one sending thread per host, so heartbeats, interrupts and other frames pass
between the pieces, and a Ctrl-C stops every sender after its current piece
(the hosts drop what arrived). Pulls come back the same two ways. Values over ``BAR_BYTES`` show
a progress bar (bytes, rate, ETA).
"""
from __future__ import annotations

import contextlib
import functools
import os
import pickle
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable

from tpunb.errors import TransportError, UsageError
from tpunb.host import transfer
from tpunb.host.transfer import Assembly

if TYPE_CHECKING:
    from tpunb.engine.connection import HostConnection

#: values this large or larger show a progress bar
BAR_BYTES = 16 << 20


def pack(values: dict) -> list[memoryview]:
    """``values`` as pickle 5 segments (cloudpickle when present: lambdas, notebook classes);
    jax.Arrays travel as numpy. A value that cannot be sent is named in a one-line UsageError."""
    keep: list = []  # arrays the segments view, alive until they are sent
    pickler = functools.partial(_pickler_class(), keep=keep)
    try:
        return _Segments(transfer.dumps(values, pickler), keep)
    except Exception:
        for name, value in values.items():
            try:
                transfer.dumps(value, pickler)
            except Exception as exc:
                raise UsageError(f"cannot send {name} to the hosts: {type(exc).__name__}: {exc} "
                                 "(send what it is made from, and rebuild it there)") from None
        raise


def code_by_value(values: dict) -> list[str]:
    """The names whose pickle carries a function or class by value (defined in the notebook, a
    lambda, a closure): cloudpickle loads those only on the same Python version."""
    try:
        import cloudpickle
    except ImportError:
        return []
    import io
    import types

    class Finder(cloudpickle.Pickler):
        found = False

        def reducer_override(self, obj):
            reduced = super().reducer_override(obj)
            if reduced is not NotImplemented and isinstance(obj, (types.FunctionType, type)):
                Finder.found = True
            return reduced

    names = []
    for name, value in values.items():
        Finder.found = False
        try:
            Finder(io.BytesIO(), protocol=5, buffer_callback=lambda buffer: None).dump(value)
        except Exception:  # pack() names a value that cannot be sent at all
            continue
        if Finder.found:
            names.append(name)
    return names
#: what a small value may be made of to be pickled by plain (C) pickle, in band
_SCALARS = frozenset({int, float, complex, bool, str, bytes, type(None)})


def pack_small(values: dict) -> bytes | None:
    """A small value of plain parts (numbers, strings, bytes, writable numpy arrays of numbers,
    and lists, tuples and dicts of them) as one in-band protocol 5 pickle: C pickle alone, not
    cloudpickle's reducers nor ``pack``'s segments (a small push costs the kernel about 15 us less).
    None for anything else, or over ``INLINE`` bytes: ``pack`` sends it."""
    numpy = sys.modules.get("numpy")
    if not all(_plain(v, numpy, 0) for v in values.values()):
        return None
    try:
        data = pickle.dumps(values, protocol=5)
    except Exception:  # pack says which value cannot be sent
        return None
    return data if len(data) <= transfer.INLINE else None


def _plain(value, numpy, depth: int) -> bool:
    kind = type(value)
    if kind in _SCALARS:
        return True
    if numpy is not None and kind is numpy.ndarray:  # read-only ones need pack: hosts get them writable
        return value.flags.writeable and not value.dtype.hasobject and value.nbytes <= transfer.INLINE
    if depth < 2 and kind in (list, tuple) and len(value) <= 64:
        return all(_plain(v, numpy, depth + 1) for v in value)
    if depth < 2 and kind is dict and len(value) <= 64:
        return all(type(k) is str and _plain(v, numpy, depth + 1) for k, v in value.items())
    return False


class _Segments(list):
    def __init__(self, segments: list, keep: list) -> None:
        super().__init__(segments)
        self.keep = keep


@functools.lru_cache(maxsize=None)
def _pickler_class():
    """cloudpickle's Pickler (else pickle's) that sends jax.Arrays as numpy, and read-only
    arrays as arrays the hosts may write to."""
    try:
        import cloudpickle
        base = cloudpickle.Pickler
    except ImportError:
        import pickle
        base = pickle.Pickler

    class Pickler(base):
        def __init__(self, *args, keep: list, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.keep = keep

        def reducer_override(self, obj):
            numpy = sys.modules.get("numpy")
            jax = sys.modules.get("jax")
            if jax is not None and isinstance(obj, jax.Array):
                obj = numpy.asarray(obj)
            if numpy is not None and type(obj) is numpy.ndarray and not obj.flags.writeable and obj.flags.c_contiguous:
                return obj.__reduce_ex__(5)[0], (*_writable_args(obj, self.keep, numpy),)
            parent = getattr(super(), "reducer_override", None)
            return parent(obj) if parent is not None else NotImplemented

    return Pickler


def _writable_args(array, keep: list, numpy) -> tuple:
    """numpy's own pickle 5 arguments for a read-only array (jax's are), over a writable view of
    the same memory: pickle marks a read-only buffer so, and the host's copy would be read-only
    too. The view is only read here."""
    import ctypes

    keep.append(array)
    raw = (ctypes.c_char * max(array.nbytes, 1)).from_address(array.ctypes.data)
    view = numpy.frombuffer(raw, numpy.uint8, array.nbytes).view(array.dtype).reshape(array.shape)
    return view.__reduce_ex__(5)[1]


def shares_memory(host: HostConnection) -> bool:
    """The host's agent runs on this machine (a local slice): it can map this process's memfds."""
    return (host.transport.same_machine and transfer.can_share() and bool(host.info.get("pid"))
            and not host.info.get("unshared"))


def memfd_owner() -> int:
    """The process whose memfds hosts open (through /proc/PID/fd)."""
    return os.getpid()


class Meter:
    """Bytes moved by a request, from any thread; a tqdm.auto bar once a value of BAR_BYTES or
    more is seen (never for smaller ones)."""

    def __init__(self, description: str) -> None:
        self.description = description
        self.done = self.total = 0
        self._lock = threading.Lock()
        self._stack = contextlib.ExitStack()
        self._update = None

    def expect(self, nbytes: int, value_bytes: int) -> None:
        with self._lock:
            self.total += nbytes
            if self._update is None and value_bytes >= BAR_BYTES:
                from tpunb.widgets.copy_progress import byte_progress
                self._update = self._stack.enter_context(byte_progress(self.description))
            self._show()

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.done += nbytes
            self._show()

    def _show(self) -> None:
        if self._update is not None:
            self._update(min(self.done, self.total), self.total)

    def close(self) -> None:
        with self._lock:
            self._stack.close()
            self._update = None


class Incoming:
    """Values hosts send back (a pull, a gather): in their reply's blob, a memfd they lend, or
    part frames assembled here as they arrive."""

    def __init__(self, meter: Callable[[], Meter]) -> None:
        self._meter = meter  # the request's, made when a value first arrives in parts or a memfd
        self._arriving: dict[int, Assembly] = {}

    def take_part(self, index: int, message: dict, blob: bytes) -> None:
        """A piece of a host's reply."""
        if "sizes" in message:
            self._arriving[index] = Assembly(message["sizes"])
            total = sum(message["sizes"])
            self._meter().expect(total, total)
        assembly = self._arriving.get(index)
        if assembly is not None:
            self._meter().add(assembly.add(message["at"], blob))

    def value(self, host: HostConnection, reply: dict, blob: bytes) -> Any:
        """The value a host's ``done`` reply carries (in its blob, its memfd or its parts)."""
        if reply.get("inline"):
            return transfer.loads(transfer.views(bytearray(blob), reply["sizes"]))
        if "shm" in reply:
            pid, fd = reply["shm"]
            try:
                segments = transfer.map_memfd(pid, fd, reply["sizes"])
            except OSError as exc:
                raise TransportError(f"cannot map host {host.index}'s value here ({exc}): "
                                     "check that this kernel may read /proc of its host processes") from None
            finally:
                try:
                    host.send({"op": "release", "fd": fd})
                except Exception:  # a host gone since: its memfd went with it
                    pass
            total = sum(reply["sizes"])
            meter = self._meter()
            meter.expect(total, total)
            meter.add(total)
            return transfer.loads(segments)
        assembly = self._arriving.pop(host.index, None)
        if assembly is None or not assembly.complete:
            raise TransportError(f"host {host.index}'s value did not arrive whole: pull it again")
        return transfer.loads(assembly.segments())
