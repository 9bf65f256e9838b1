"""The frame format spoken between the session (in the kernel) and the agent (on each host).

A frame is a fixed header (JSON length, blob length), a UTF-8 JSON object, then an optional
binary blob (pickled values for push/pull). JSON keeps frames readable and independent of the
Python version on either side; the blob keeps large values out of JSON.

This module is shipped to hosts next to the agent, so it must import only the standard library.
"""
from __future__ import annotations

import json
import struct

PROTOCOL_VERSION = 4  # 3: stream frames carry at most MAX_TEXT characters, hosts cap values; 4: heartbeat (``beat`` frames, ``heartbeat`` at init), watchdog
HEADER = struct.Struct("!II")
MAX_JSON = 256 * 1024 * 1024
MAX_BLOB = 2**32 - 1
#: the most text one stream frame carries: larger output is split across frames
MAX_TEXT = 1 << 20


#: one encoder for every frame (json.dumps with options builds a new one per call)
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


class FrameTooLarge(ValueError):
    """A frame the other side would refuse: the sender must shrink it, never send it."""


def encode(message: dict, blob: bytes = b"") -> bytes:
    """One frame as bytes, ready to write; FrameTooLarge if the reader could not take it."""
    body = _ENCODER.encode(message).encode("utf-8", "replace")
    if len(body) > MAX_JSON or len(blob) > MAX_BLOB:
        raise FrameTooLarge(f"a {message.get('op')} frame of {len(body) + len(blob):,} bytes is over the limit")
    return HEADER.pack(len(body), len(blob)) + body + blob


def decode_header(header: bytes) -> tuple[int, int]:
    """(json length, blob length) of a frame; raises ValueError on nonsense."""
    json_len, blob_len = HEADER.unpack(header)
    if json_len > MAX_JSON:
        raise ValueError(f"frame of {json_len} bytes is not a tpunb frame")
    return json_len, blob_len


def read_frame(read_exact) -> tuple[dict, bytes] | None:
    """Read one frame with ``read_exact(n)``; None at a clean end of stream."""
    header = read_exact(HEADER.size)
    if not header:
        return None
    if len(header) < HEADER.size:
        raise EOFError("stream ended inside a frame header")
    json_len, blob_len = decode_header(header)
    body = read_exact(json_len)
    blob = read_exact(blob_len) if blob_len else b""
    if len(body) < json_len or len(blob) < blob_len:
        raise EOFError("stream ended inside a frame")
    return json.loads(body.decode("utf-8", "surrogatepass")), blob  # a str skips json's encoding sniffing
