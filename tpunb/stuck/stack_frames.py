"""A host's threads and frames, parsed from faulthandler's dump or py-spy's JSON, with tpunb's own
frames taken out so a user reads their code first.

Kinds of frames: ``user`` (a cell, or a file of the user's: anything outside the standard
library and installed packages), ``library`` (the standard library, site-packages), ``native``
(C/C++, from py-spy --native) and ``tpunb`` (the agent and the bootstrap that runs it: hidden).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(.*)", line (\d+|\?\?\?) in (.*)$')
_CELL = re.compile(r"^<(?:ipython-input-(\d+)-[0-9a-f]+|cell-(\d+))>$")
_LIBRARY = re.compile(r"/(?:site|dist)-packages/|/lib/python3\.\d+/|^<frozen ")
_OURS = re.compile(r"^<tpunb:|/tpunb_host/|/tpunb/(?:host/)?[a-z_]+\.py$")


@dataclass(frozen=True)
class Frame:
    """One frame: where (file, line) and which function; ``kind`` as above."""

    file: str
    line: int
    function: str
    kind: str

    @property
    def place(self) -> str:
        """Where, short: ``In[3]:5`` for a cell, ``train.py:42``, ``jax/_src/pjit.py:1234``."""
        if self.kind == "native":
            return self.file.rsplit("/", 1)[-1]
        return f"{short_file(self.file, self.kind)}:{self.line}"

    @property
    def label(self) -> str:
        """``In[3]:5 stuck``; a native frame is its symbol and library."""
        if self.kind == "native":
            return f"{self.function} ({self.place})"
        return f"{self.place} {self.function}"


def short_file(path: str, kind: str = "user") -> str:
    """A cell as ``In[3]``, an installed module from its package on, a user's file by its name."""
    cell = _CELL.match(path)
    if cell:
        return f"In[{cell.group(1) or cell.group(2)}]"
    if path.startswith("<frozen ") and path.endswith(">"):  # a frozen standard module: <frozen genericpath>
        return path[len("<frozen "):-1] + ".py"
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    stdlib = re.search(r"/lib/python3\.\d+/(.*)$", path)
    if stdlib:
        return stdlib.group(1)
    return path.rsplit("/", 1)[-1] if kind == "user" else path


def kind_of(path: str) -> str:
    if _OURS.search(path):
        return "tpunb"
    if _CELL.match(path):
        return "user"
    return "library" if _LIBRARY.search(path) else "user"


@dataclass(frozen=True)
class ThreadStack:
    """One thread: its frames outermost first (tpunb's taken out), whether it is the agent's main
    thread (the one running cells), and its name where py-spy gave one."""

    ident: int
    frames: tuple[Frame, ...]
    main: bool = False
    name: str = ""

    @property
    def in_cell(self) -> bool:
        return any(f.kind == "user" for f in self.frames)

    @property
    def key(self) -> tuple:
        """What makes two threads' stacks the same, on one host or on several."""
        return (self.main, tuple((f.file, f.line, f.function, f.kind) for f in self.frames))

    @property
    def where(self) -> str:
        """One line: the user's frames, outermost first, then the library call they are in:
        ``In[3]:8 <module> -> In[3]:5 stuck -> sync_global_devices``."""
        return self._where(short=False)

    @property
    def short(self) -> str:
        """The innermost user frame and the library call it is in: ``In[3]:5 stuck -> sync_global_devices``."""
        return self._where(short=True)

    def _where(self, short: bool) -> str:
        if self.main and not self.in_cell:
            return "not in a cell (waiting for the next one)"
        python = [f for f in self.frames if f.kind != "native"]
        users = [i for i, f in enumerate(python) if f.kind == "user"]
        if not users:
            return python[-1].label if python else "no Python frame"
        parts = [python[i].label for i in (users[-1:] if short else users)]
        if users[-1] + 1 < len(python):
            parts.append(python[users[-1] + 1].function)
        return " -> ".join(parts)

    @property
    def title(self) -> str:
        """``main thread`` (the one running cells), ``thread 'name'`` (py-spy names them), else ``thread``."""
        return "main thread" if self.main else f"thread {self.name!r}" if self.name else "thread"


def clean(frames: list[Frame], main: bool) -> tuple[Frame, ...] | None:
    """The frames a user reads: from their first frame on (what started it, the bootstrap, the
    agent, IPython's run_cell, threading's start-up, is cut off), tpunb's frames anywhere dropped.
    None: a thread of tpunb's own (tpunb frames and no user frame), not shown."""
    outer = next((i for i, f in enumerate(frames) if f.kind != "native"), None)
    if main and outer is not None and frames[outer].file == "<string>":  # the bootstrap, python -c
        boot = frames[outer]
        frames = [*frames[:outer], Frame(boot.file, boot.line, boot.function, "tpunb"), *frames[outer + 1:]]
    first_user = next((i for i, f in enumerate(frames) if f.kind == "user"), None)
    if first_user is None:
        if any(f.kind == "tpunb" for f in frames):
            return () if main else None
        return tuple(frames)
    return tuple(f for f in frames[first_user:] if f.kind != "tpunb")


def parse_faulthandler(text: str, main_ident: int | None) -> list[ThreadStack]:
    """faulthandler's all-threads dump (most recent call first) -> threads, main thread first.
    Several dumps in one text (two readers at once): the first."""
    threads: list[ThreadStack] = []
    seen: set[int] = set()
    ident, frames = None, []

    def close() -> None:
        if ident is not None:
            main = ident == main_ident
            kept = clean(list(reversed(frames)), main)
            if kept is not None:
                threads.append(ThreadStack(ident, kept, main))

    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            close()
            ident, frames = int(head.group(2), 16), []
            if ident in seen:  # a second dump begins
                ident = None
                break
            seen.add(ident)
            continue
        frame = _FRAME.match(line)
        if frame and ident is not None:
            path = frame.group(1)
            number = int(frame.group(2)) if frame.group(2).isdigit() else 0
            frames.append(Frame(path, number, frame.group(3), kind_of(path)))
    close()
    return sorted(threads, key=lambda t: not t.main)


def parse_pyspy(threads: list[dict], main_ident: int | None) -> list[ThreadStack]:
    """py-spy's ``dump --json`` (innermost first; native frames carry their library as
    ``module``) -> threads, main thread first."""
    out = []
    for thread in threads:
        frames = []
        for raw in reversed(thread.get("frames") or []):
            path = str(raw.get("filename") or "")
            native = bool(raw.get("module")) or not path.endswith(".py") and not path.startswith("<")
            frames.append(Frame(path, int(raw.get("line") or 0), str(raw.get("name") or "?"),
                                "native" if native else kind_of(path)))
        ident = int(thread.get("thread_id") or 0)
        main = ident == main_ident
        kept = clean(frames, main)
        if kept is not None:
            out.append(ThreadStack(ident, kept, main, str(thread.get("thread_name") or "")))
    return sorted(out, key=lambda t: not t.main)
