"""Frames for many hosts: a request encoded once per kind of host."""
from __future__ import annotations

import marshal
import sys
import threading
import warnings
from typing import TYPE_CHECKING

from tpunb.host import protocol
from tpunb.host.runners import cell_filename, compile_cell

if TYPE_CHECKING:
    from tpunb.engine.connection import HostConnection


class Broadcast:
    """One request for many hosts, encoded once for each kind of host: JSON, marshal, and for
    hosts that run cells with plain ``exec`` in this same Python, marshal with the cell compiled
    here (once for the slice, where every host would compile it again).

    Only on the kernel's main thread: CPython keeps ast.parse's recursion depth per interpreter,
    so a parse on another thread (a background cell's) racing IPython's parse of the next cell
    fails one of them with "SystemError: AST constructor recursion depth mismatch" (gh-106905; a
    CI run's pytest died of it). A background cell's hosts compile it themselves."""

    def __init__(self, message: dict, blob: bytes = b"") -> None:
        self.message, self.blob = message, blob
        self._frames: dict[tuple[bool, bool], bytes] = {}
        self._compiled: bytes | None = None

    def for_host(self, host: HostConnection) -> bytes:
        precompile = (host.fast and self.message.get("op") == "exec" and host.info.get("runner") == "plain"
                      and host.info.get("optimize") == sys.flags.optimize  # -O strips asserts when compiling
                      and threading.current_thread() is threading.main_thread())
        key = (host.fast, precompile)
        frame = self._frames.get(key)
        if frame is None:
            compiled = self._compile() if precompile else b""
            message = {**self.message, "compiled": True} if compiled else self.message
            frame = self._frames[key] = protocol.encode(message, compiled or self.blob, host.fast)
        return frame

    def _compile(self) -> bytes:
        """The cell compiled as a plain host would (b"" if it does not compile: the hosts report that)."""
        if self._compiled is None:
            self._compiled = b""
            count = self.message.get("count")
            if count is not None:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")  # a cell that warns is compiled where the warning shows
                    try:
                        self._compiled = marshal.dumps(compile_cell(self.message["code"], cell_filename(count)))
                    except (SyntaxError, Warning, ValueError, OverflowError, RecursionError, MemoryError):
                        pass
        return self._compiled
