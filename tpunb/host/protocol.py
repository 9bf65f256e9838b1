"""The frame format spoken between the session (in the kernel) and the agent (on each host).

A frame is a fixed header (JSON length, blob length), a UTF-8 JSON object, then an optional
binary blob (pickled values for push/pull). JSON keeps frames readable and independent of the
Python version on either side; the blob keeps large values out of JSON.

This module is shipped to hosts next to the agent, so it must import only the standard library.
"""
from __future__ import annotations

import json
import struct

PROTOCOL_VERSION = 2
HEADER = struct.Struct("!II")
MAX_JSON = 256 * 1024 * 1024


def encode(message: dict, blob: bytes = b"") -> bytes:
    """One frame as bytes, ready to write."""
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
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
    return json.loads(body), blob
