"""Messages from library code to the user: the one place that decides where they go.

By default information ("Launching ...", "Slice ... ready") goes to stdout, which notebooks show
as plain text, and warnings ("state was lost") to stderr, which they paint as a warning. A
caller that is not a notebook (the Jupyter server extension, a script, a test) collects them
instead with ``captured()``; threads it starts inherit nothing, so a background watch thread
always speaks through the defaults.
"""
from __future__ import annotations

import contextlib
import contextvars
import sys
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class Message:
    level: str  # "info" | "warning"
    text: str


_collector: contextvars.ContextVar[list[Message] | None] = contextvars.ContextVar("tpunb_report", default=None)
#: what this kernel said (or did) once already: see ``once``
_once: set[str] = set()


def once(key: str) -> bool:
    """True the first time this kernel asks for ``key``, then False: for what is said (or done)
    once per kernel, e.g. why a faster path cannot be used."""
    if key in _once:
        return False
    _once.add(key)
    return True


def _emit(level: str, text: str) -> None:
    collected = _collector.get()
    if collected is not None:
        collected.append(Message(level, text))
        return
    stream = sys.stdout if level == "info" else sys.stderr
    print(text, file=stream, flush=True)


def info(text: str) -> None:
    """Something the user should know, not a problem: shown as plain output."""
    _emit("info", text)


def warn(text: str) -> None:
    """Something that went wrong or was lost, and what to do: shown as a warning."""
    _emit("warning", text)


@contextlib.contextmanager
def captured() -> Iterator[list[Message]]:
    """Collect the messages of this block (this thread and context) instead of printing them."""
    messages: list[Message] = []
    token = _collector.set(messages)
    try:
        yield messages
    finally:
        _collector.reset(token)
