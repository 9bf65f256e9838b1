"""Values as they travel, on either side: pickled once with out-of-band buffers, then either
written once to a memfd that a process on the same machine maps copy-on-write, or cut into
``part`` frames of at most ``PART`` bytes so heartbeats and interrupts pass between them.

Shipped to hosts (and used by the kernel): standard library only.

Layout: the pickle's head and each out-of-band buffer are segments laid end to end, each starting
at a multiple of ``ALIGN`` (numpy wants aligned data). A ``part`` frame says where its bytes go
(``at``); the first also carries every segment's size, so the receiver allocates once.
"""
from __future__ import annotations

import mmap
import os
import pickle

#: bytes in one part frame: small enough that a beat or an interrupt waits at most one of them
PART = 2 << 20
ALIGN = 64
#: values up to this size travel in one frame (a memfd or parts cost more than they save)
INLINE = 256 << 10
#: memfds are written in pieces this large, so a Ctrl-C is seen between them
WRITE_PIECE = 8 << 20


def dumps(value, pickler=pickle.Pickler) -> list[memoryview]:
    """``value`` as segments: the protocol 5 pickle, then each buffer it keeps out of band (not
    copied: views of the caller's arrays)."""
    import io

    buffers: list = []
    out = io.BytesIO()
    pickler(out, protocol=5, buffer_callback=buffers.append).dump(value)
    return [out.getbuffer(), *(_raw(b) for b in buffers)]


def _raw(buffer: pickle.PickleBuffer) -> memoryview:
    try:
        return buffer.raw()
    except BufferError:  # not contiguous: copied once, as in-band pickling would
        return memoryview(bytes(memoryview(buffer)))


def loads(segments: list[memoryview]):
    """The value whose segments these are (buffers are used in place: no copy)."""
    return pickle.loads(segments[0], buffers=segments[1:])


def layout(sizes: list[int]) -> tuple[list[int], int]:
    """Where each segment starts, and the total length."""
    offsets, at = [], 0
    for size in sizes:
        offsets.append(at)
        at += -(-size // ALIGN) * ALIGN
    return offsets, at


def views(buffer, sizes: list[int]) -> list[memoryview]:
    """The segments laid out in ``buffer``."""
    whole = memoryview(buffer).cast("B")
    offsets, _ = layout(sizes)
    return [whole[at:at + size] for at, size in zip(offsets, sizes)]


def join(segments: list[memoryview]) -> bytearray:
    """The segments laid out in one buffer: a small value travels in one frame."""
    offsets, total = layout([len(s) for s in segments])
    out = bytearray(total)
    for at, segment in zip(offsets, segments):
        out[at:at + len(segment)] = segment.cast("B") if segment.format != "B" or segment.ndim != 1 else segment
    return out


def pieces(segments: list[memoryview]):
    """(offset, bytes) of at most PART bytes each, in order, covering every segment."""
    offsets, _ = layout([len(s) for s in segments])
    for at, segment in zip(offsets, segments):
        segment = segment.cast("B") if segment.format != "B" or segment.ndim != 1 else segment
        for start in range(0, len(segment), PART):
            yield at + start, segment[start:start + PART]


def clipped(segments: list[memoryview], lo: int, hi: int):
    """``pieces`` cut to the layout's bytes [lo, hi): one stripe of a value."""
    for at, piece in pieces(segments):
        start, end = max(at, lo), min(at + len(piece), hi)
        if start < end:
            yield start, piece[start - at:end - at]


# -- same machine: one memfd ----------------------------------------------------------------
def can_share() -> bool:
    return hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


def write_memfd(segments: list[memoryview], stop=lambda: False, progress=lambda n: None) -> int | None:
    """A memfd holding the segments (its fd), or None if ``stop()`` said so between pieces. No
    file name ever exists: the memory is freed once the last fd and mapping of it are gone."""
    fd = os.memfd_create("tpunb-value", os.MFD_CLOEXEC)
    try:
        offsets, total = layout([len(s) for s in segments])
        os.ftruncate(fd, total)
        for at, segment in zip(offsets, segments):
            segment = segment.cast("B") if segment.format != "B" or segment.ndim != 1 else segment
            for start in range(0, len(segment), WRITE_PIECE):
                if stop():
                    os.close(fd)
                    return None
                piece, done = segment[start:start + WRITE_PIECE], 0
                while done < len(piece):
                    done += os.pwrite(fd, piece[done:], at + start + done)
                progress(len(piece))
    except BaseException:
        os.close(fd)
        raise
    return fd


def map_memfd(pid: int, fd: int, sizes: list[int]) -> list[memoryview]:
    """Another process's memfd mapped copy-on-write: writable, private to this process."""
    _, total = layout(sizes)
    if not total:
        return [memoryview(bytearray(0)) for _ in sizes]
    own = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        area = _map_private(own, total)
    finally:
        os.close(own)
    return views(area, sizes)


def _map_private(fd: int, size: int):
    """``fd`` mapped copy-on-write, holding no fd of its own (Python's mmap keeps a dup of it
    until 3.13's trackfd=False: one open fd per live value); unmapped when its last view goes."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.munmap.restype = ctypes.c_void_p, ctypes.c_int
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    address = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), f"cannot map a value of {size:,} bytes: {os.strerror(ctypes.get_errno())}")

    class Area(ctypes.c_char * size):
        def __del__(self, munmap=libc.munmap) -> None:
            munmap(address, size)

    return Area.from_address(address)


# -- over a stream: part frames ---------------------------------------------------------------
class Assembly:
    """One value arriving as part frames, written straight into one buffer."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.total = sum(sizes)
        self.buffer = bytearray(layout(sizes)[1])
        self.received = 0

    def place(self, at: int, size: int) -> memoryview | None:
        """Where a part of ``size`` bytes at ``at`` is written as it is read (None if out of bounds)."""
        if at < 0 or at + size > len(self.buffer):
            return None
        return memoryview(self.buffer)[at:at + size]

    def add(self, at: int, blob) -> int:
        """Place one part (already in place if read there); how many bytes it brought."""
        if not (isinstance(blob, memoryview) and blob.obj is self.buffer):
            self.buffer[at:at + len(blob)] = blob
        self.received += len(blob)
        return len(blob)

    @property
    def complete(self) -> bool:
        return self.received >= self.total

    def segments(self) -> list[memoryview]:
        return views(self.buffer, self.sizes)
