"""The frame format spoken between the session (in the kernel) and the agent (on each host).

A frame is a fixed header (body length, blob length), a body holding one dict, then an optional
binary blob (pickled values for push/pull, compiled cells). The body is UTF-8 JSON, readable and
independent of the Python version on either side, or, between peers that run the same Python
(every simulated host, most SSH ones), ``marshal``: a cold process decodes and encodes it in a
fraction of JSON's time, which is most of what a trivial cell costs a host on a 256-host slice.
The header's top bit tells which. The agent's ``hello`` carries its ``MAGIC``; the kernel's
``init`` says whether it matched, and only then do both sides send marshal.

This module is shipped to hosts next to the agent, so it must import only the standard library.
"""
from __future__ import annotations

import importlib.util
import json
import marshal
import struct

PROTOCOL_VERSION = 5  # 5: values as pickle 5 segments in ``part`` frames or a memfd; 3: stream frames carry at most MAX_TEXT characters, hosts cap values; 4: heartbeat (``beat`` frames, ``heartbeat`` at init), watchdog
HEADER = struct.Struct("!II")
MAX_JSON = 256 * 1024 * 1024
#: set in the header's first field: the body is marshal data, not JSON
MARSHAL_BIT = 1 << 31
#: this interpreter's bytecode magic: equal on both sides, marshal data and code objects are shared
MAGIC = importlib.util.MAGIC_NUMBER.hex()
MAX_BLOB = 2**32 - 1
#: the most text one stream frame carries: larger output is split across frames
MAX_TEXT = 1 << 20


#: which thread answers each op a kernel sends a host. MAIN: a request the agent's main thread runs,
#: one at a time (a host running one is busy: the kernel's Session.holding); SIDE: answered at once
#: by whichever thread reads the frame, beside a running cell. The agent dispatches by this table
#: and the kernel reads it; tests/test_agent.py checks the agent has a handler for each.
MAIN, SIDE = "main", "side"
OPS = {
    "exec": MAIN, "shell": MAIN, "push": MAIN, "relay_push": MAIN, "pull": MAIN, "gather": MAIN, "reset": MAIN,
    "part": SIDE, "interrupt": SIDE, "release": SIDE, "start_jax": SIDE, "heartbeat": SIDE, "idle": SIDE,
    "metrics_interval": SIDE, "diagnose": SIDE, "profile_start": SIDE, "profile_stop": SIDE,
    "profile_status": SIDE, "relay_listen": SIDE, "relay_cancel": SIDE, "environ": SIDE,
    "fetch": SIDE, "fetch_probe": SIDE, "fetch_unmark": SIDE, "fetch_chunk": SIDE, "fetch_ack": SIDE,
    "fetch_cancel": SIDE, "fetch_token": SIDE, "cache_stats": SIDE, "cache_list": SIDE, "cache_stage": SIDE,
}
#: the requests that take a host's main thread
MAIN_THREAD_OPS = frozenset(op for op, thread in OPS.items() if thread == MAIN)


#: one encoder for every frame (json.dumps with options builds a new one per call)
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


class FrameTooLarge(ValueError):
    """A frame the other side would refuse: the sender must shrink it, never send it."""


def encode(message: dict, blob: bytes = b"", fast: bool = False) -> bytes:
    """One frame as bytes, ready to write; FrameTooLarge if the reader could not take it.
    ``fast``: a marshal body, for a peer that runs this same Python (JSON where marshal refuses a
    value, such as a float subclass like numpy's float64: the header says which)."""
    return encode_head(message, len(blob), fast) + blob


def encode_head(message: dict, blob_len: int, fast: bool = False) -> bytes:
    """A frame's header and body: written before its blob, which need not be copied after them."""
    body = None
    if fast:
        try:
            body, flag = marshal.dumps(message, 4), MARSHAL_BIT
        except ValueError:
            pass
    if body is None:
        body, flag = _ENCODER.encode(message).encode("utf-8", "replace"), 0
    if len(body) > MAX_JSON or blob_len > MAX_BLOB:
        raise FrameTooLarge(f"a {message.get('op')} frame of {len(body) + blob_len:,} bytes is over the limit")
    return HEADER.pack(len(body) | flag, blob_len) + body


def decode_header(header: bytes) -> tuple[int, int, bool]:
    """(body length, blob length, whether the body is marshal) of a frame; ValueError on nonsense."""
    body_len, blob_len = HEADER.unpack(header)
    fast = body_len >= MARSHAL_BIT
    if fast:
        body_len -= MARSHAL_BIT
    if body_len > MAX_JSON:
        raise ValueError(f"frame of {body_len} bytes is not a tpunb frame")
    return body_len, blob_len, fast


def decode_body(body, fast: bool) -> dict:
    """The dict a frame's body holds (``body``: bytes, bytearray or memoryview)."""
    if fast:
        try:
            message = marshal.loads(body)
        except (EOFError, TypeError) as exc:
            raise ValueError(f"a frame's body is not marshal data: {exc}") from None
        if type(message) is not dict:
            raise ValueError("a frame's body is not a dict")
        return message
    return json.loads(bytes(body).decode("utf-8", "surrogatepass"))  # a str skips json's encoding sniffing


def read_frame(read_exact) -> tuple[dict, bytes] | None:
    """Read one frame with ``read_exact(n)``; None at a clean end of stream."""
    header = read_exact(HEADER.size)
    if not header:
        return None
    if len(header) < HEADER.size:
        raise EOFError("stream ended inside a frame header")
    body_len, blob_len, fast = decode_header(header)
    body = read_exact(body_len)
    blob = read_exact(blob_len) if blob_len else b""
    if len(body) < body_len or len(blob) < blob_len:
        raise EOFError("stream ended inside a frame")
    return decode_body(body, fast), blob


#: frames cut from a stream: (message, blob) each
Frames = list[tuple[dict, bytes]]


#: blobs this large or larger may be written straight where they belong (``FrameCutter.place``)
DIRECT_MIN = 1 << 16


class FrameCutter:
    """One host's byte stream cut into frames, whatever sizes its pieces arrive in.

    ``place(message, blob_len)``, if given, may return a writable view of ``blob_len`` bytes for a
    large frame's blob once its body is read: the blob is then written there as it arrives (read
    straight into it, see ``target``), never held, and the frame comes out with that view."""

    def __init__(self, place=None) -> None:
        self._buffer = bytearray()
        self.place = place
        self._direct: list | None = None  # [message, view, bytes filled] of a blob being placed

    def feed(self, data: bytes) -> Frames:
        """The frames ``data`` completes; raises ValueError on bytes that are not tpunb frames."""
        frames: Frames = []
        if self._direct is not None:
            data = self._fill(data, frames)
            if not len(data):
                return frames
        held = self._buffer
        if held:  # the rest of a frame that began in an earlier read
            held += data
            cut, end = _cut(held)
            del held[:end]
        else:  # the usual case (a cell's ``done`` from each host): cut from the read itself, no copy
            cut, end = _cut(data)
            if end < len(data):
                held += memoryview(data)[end:]
        frames.extend(cut)
        if held and self.place is not None:
            self._start_direct()
        return frames

    def _start_direct(self) -> None:
        held = self._buffer
        if len(held) < HEADER.size:
            return
        body_len, blob_len, fast = decode_header(held[:HEADER.size])
        start = HEADER.size + body_len
        if blob_len < DIRECT_MIN or len(held) < start:
            return
        message = decode_body(held[HEADER.size:start], fast)
        view = self.place(message, blob_len)
        if view is None:
            return
        got = len(held) - start
        view[:got] = held[start:]
        self._direct = [message, view, got]
        held.clear()

    def _fill(self, data, frames: Frames):
        """Write ``data`` into the blob being placed; what is left of it once that is whole."""
        message, view, filled = self._direct
        n = min(len(data), len(view) - filled)
        view[filled:filled + n] = memoryview(data)[:n]
        self.filled(n, frames)
        return memoryview(data)[n:]

    def target(self) -> memoryview | None:
        """Where the next bytes go when a blob is being placed (read straight into it), else None."""
        if self._direct is None:
            return None
        _, view, filled = self._direct
        return view[filled:]

    def filled(self, n: int, frames: Frames | None = None) -> Frames:
        """``n`` more bytes were written into ``target()``; the frame, once its blob is whole."""
        frames = [] if frames is None else frames
        self._direct[2] += n
        if self._direct[2] >= len(self._direct[1]):
            message, view, _ = self._direct
            self._direct = None
            frames.append((message, view))
        return frames

    @property
    def missing(self) -> int:
        """Bytes still to come to finish the frame begun (0 if none is, or its header is not whole):
        a blocking reader asks for that much at once."""
        held = self._buffer
        if len(held) < HEADER.size:
            return 0
        body_len, blob_len, _ = decode_header(held[:HEADER.size])
        return HEADER.size + body_len + blob_len - len(held)

    @property
    def inside_frame(self) -> bool:
        """Bytes of an unfinished frame are held (or placed): an end of stream now breaks a frame."""
        return bool(self._buffer) or self._direct is not None


def _cut(data: bytes | bytearray) -> tuple[Frames, int]:
    """The whole frames at the start of ``data``, and where the last of them ends."""
    frames, size, end = [], HEADER.size, 0
    while len(data) - end >= size:
        body_len, blob_len, fast = decode_header(data[end:end + size])
        stop = end + size + body_len + blob_len
        if stop > len(data):
            break
        frames.append((decode_body(data[end + size:end + size + body_len], fast),
                       bytes(data[end + size + body_len:stop]) if blob_len else b""))
        end = stop
    return frames, end
