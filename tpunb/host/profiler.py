"""The host side of %tpu_profile: jax.profiler start/stop on a side thread, the trace summarised
where it was recorded, and the files sent back to the kernel as the reply's blob.

Shipped to hosts: standard library only (see the package docstring). jax is imported inside
functions, only when the host has it; the kernel imports ``summarize`` too, to parse saved traces.

Requests (``profile_start``, ``profile_stop``, ``profile_status``) are answered on their own
thread, never the main one, so a recording can start and stop while a cell runs there (that is
how a capture during a long training cell works): the profiler records every thread of the process.
Each host records into its own new folder, since hosts of a simulated slice share one hostname
and several processes writing one folder break JAX's trace export.
"""
from __future__ import annotations

import glob
import importlib.util
import io
import os
import shutil
import sys
import tarfile
import tempfile
import threading
import time

from .io import quiet_thread

OPS = ("profile_start", "profile_stop", "profile_status")
#: events of the trace a summary carries for the kernel's table and view; the files keep all
DEFAULT_EVENT_CAP = 200_000


def has_jax() -> str:
    """'' when this Python can import jax, else why not (one line)."""
    if "jax" in sys.modules and sys.modules["jax"] is not None:
        return ""
    try:
        found = importlib.util.find_spec("jax") is not None
    except (ImportError, ValueError):  # sys.modules['jax'] = None, or a broken finder
        found = False
    return "" if found else f"no JAX on this host ({sys.executable}, Python {sys.version.split()[0]})"


class Profiler:
    """At most one recording per host; a forgotten one ends by itself after its limit."""

    def __init__(self, agent) -> None:
        self.agent = agent
        self.lock = threading.Lock()
        self.folder: str | None = None
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self.limit: float | None = None
        self.note = ""
        self.stop_s = 0.0
        self._timer: threading.Timer | None = None

    # -- requests (each on its own thread) ---------------------------------------------------
    def handle(self, message: dict) -> None:
        quiet_thread(self._answer, "tpunb-profiler", message)

    def _answer(self, message: dict) -> None:
        blob = b""
        try:
            op = message.get("op")
            if op == "profile_start":
                reply = self.start(bool(message.get("python_tracer")), message.get("limit"))
            elif op == "profile_stop":
                reply, blob = self.stop(int(message.get("cap") or DEFAULT_EVENT_CAP))
            else:
                reply = self.status()
        except Exception as exc:  # one line back to the kernel, whatever broke
            reply = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
        self.agent.send({"op": "done", "id": message.get("id"), **reply}, blob)

    def status(self) -> dict:
        return {"status": "ok", "recording": self.folder is not None and self.stopped_at is None,
                "started_at": self.started_at, "note": self.note}

    def start(self, python_tracer: bool, limit: float | None) -> dict:
        missing = has_jax()
        if missing:
            return {"status": "error", "error": missing, "no_jax": True}
        with self.lock:
            if self.folder is not None:
                return {"status": "error", "error": "a recording already runs on this host: stop it first "
                                                    "(%tpu_profile stop)", "busy": True}
            import jax  # joins jax.distributed through the agent's import hook, as a cell would

            options = jax.profiler.ProfileOptions()
            options.python_tracer_level = 1 if python_tracer else 0
            folder = tempfile.mkdtemp(prefix="tpunb-profile-")
            try:
                jax.profiler.start_trace(folder, profiler_options=options)
            except Exception:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            self.folder, self.started_at, self.stopped_at, self.note = folder, time.time(), None, ""
            self.limit = float(limit) if limit else None
            if self.limit:
                self._timer = threading.Timer(self.limit, self._time_up)
                self._timer.daemon = True
                self._timer.start()
        return {"status": "ok", "started_at": self.started_at}

    def _time_up(self) -> None:
        with self.lock:
            if self.folder is None or self.stopped_at is not None:
                return
            self._stop_trace()
            self.note = (f"the recording ended by itself after {self.limit:g} s (its limit); "
                         "what ran later is not in it")

    def _stop_trace(self) -> None:
        import jax

        self.stopped_at = time.time()
        jax.profiler.stop_trace()  # writes the xplane (and trace.json.gz): the profiler's own cost
        self.stop_s = time.time() - self.stopped_at

    def stop(self, cap: int) -> tuple[dict, bytes]:
        """Stop (unless the limit did), summarise, and pack the folder; the host keeps no copy."""
        with self.lock:
            if self.folder is None:
                return {"status": "error", "error": "no recording runs on this host", "idle": True}, b""
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            folder, note = self.folder, self.note
            try:
                if self.stopped_at is None:
                    self._stop_trace()
                started, stopped = self.started_at, self.stopped_at
            finally:
                self.folder = None
        try:
            found = sorted(glob.glob(os.path.join(folder, "plugins", "profile", "*", "*.xplane.pb")))
            if not found:
                return {"status": "error", "error": "jax.profiler wrote no trace on this host"}, b""
            began = time.perf_counter()
            summary = summarize(found[-1], cap)
            summary.update(note=note, started_at=started, stopped_at=stopped, stop_trace_s=self.stop_s,
                           summarize_s=time.perf_counter() - began)
            return {"status": "ok", "summary": summary}, pack(folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def pack(folder: str) -> bytes:
    """The folder as a gzip tar (relative paths: plugins/profile/<run>/...)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        tar.add(os.path.join(folder, "plugins"), arcname="plugins")
    return buffer.getvalue()


def _kind(name: str, stats: dict) -> str:
    if name.startswith("PjitFunction(") or name.startswith("jit_"):
        return "jit"
    if "hlo_op" in stats:
        return "op"
    if name.startswith("$"):
        return "python"
    return "other"


def summarize(xplane_path: str, cap: int = DEFAULT_EVENT_CAP) -> dict:
    """One host's trace as plain data: every event's (name, thread, device, start, duration) up
    to ``cap`` events (the earliest), and totals per name over all events.

    Times are ns since the epoch (the recording's start plus the event's offset), so hosts'
    timelines align as far as their clocks agree.
    """
    from jax.profiler import ProfileData  # noqa: I001 - jaxlib's own xplane reader

    data = ProfileData.from_file(xplane_path)
    origin = 0
    for plane in data.planes:
        if plane.name == "Task Environment":
            origin = int(dict(plane.stats).get("profile_start_time", 0) or 0)
    names: dict[str, int] = {}
    threads: dict[str, int] = {}
    devices: dict[str, int] = {}
    kinds: list[str] = []
    events: list[list] = []
    totals: dict[str, list] = {}
    seen = 0
    for plane in data.planes:
        if plane.name in ("Task Environment", "/host:metadata"):
            continue
        device = devices.setdefault(plane.name, len(devices))
        for line in plane.lines:
            thread = threads.setdefault(line.name, len(threads))
            stack: list = []  # (end, name) of the events enclosing the current one
            for event in sorted(line.events, key=lambda e: (e.start_ns, -e.duration_ns)):
                name = event.name
                start, duration = int(event.start_ns), int(event.duration_ns)
                while stack and stack[-1][0] <= start:
                    stack.pop()
                if stack and stack[-1][1] == name:  # JAX nests a call's event in one of the same name: one call
                    continue
                stack.append((start + duration, name))
                index = names.get(name)
                if index is None:
                    index = names[name] = len(names)
                    kinds.append(_kind(name, dict(event.stats)))
                total = totals.get(name)
                if total is None:
                    total = totals[name] = [0, 0]
                total[0] += 1
                total[1] += duration
                seen += 1
                events.append([index, thread, device, origin + start, duration])
    kept = events
    if len(events) > cap:
        events.sort(key=lambda e: e[3])
        kept = events[:cap]
    file = os.path.basename(xplane_path)
    return {"hostname": file[: -len(".xplane.pb")], "file": file,
            "origin_ns": origin, "names": list(names), "kinds": kinds, "threads": list(threads),
            "devices": list(devices), "events": kept, "total_events": seen, "totals": totals}
