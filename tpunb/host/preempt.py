"""Snapshot armed names when this host's VM is being reclaimed (spot preemption, maintenance).

Shipped to hosts: standard library only (see the package docstring); jax is used only when a cell
started it.

The notice (see docs/cloud-facts.md for the sources): the GCE metadata server's
``instance/preempted`` turns TRUE (and ``instance/maintenance-event`` says
TERMINATE_ON_HOST_MAINTENANCE), read here with hanging GETs (``wait_for_change``); the guest's
shutdown sends SIGTERM, and about 30 s later the VM is off. Where the snapshot is taken:

- no request running on this host: at once, on the watcher thread, holding ``MAIN`` (the agent
  holds it while it runs a request, so the next one waits);
- a cell running: at a step boundary, when the cell calls ``tpunb.log`` (``metrics.STEP_HOOKS``).
  With several JAX processes every host must save at the same step, or their collective writes
  would pair with another host's training step: JAX's preemption sync manager picks it (the
  fastest host's step + 1, ``multihost_utils.reached_preemption_sync_point``), and its SIGTERM
  notifier is what a metadata notice triggers here;
- a cell that never calls ``tpunb.log``: when it ends, if that is within the window.

Host 0 writes the manifest once every host's record is there; a snapshot not finished in the
window has none and is never restored (``--recover`` says so and takes the last complete one).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.request

from . import metrics, snapshot

#: held by the agent while it runs a request; a preemption snapshot on the watcher thread takes it
MAIN = threading.RLock()
#: seconds from the notice to power-off on Compute Engine (the preemption window)
WINDOW = 30.0
KEYS = {"instance/preempted": "TRUE", "instance/maintenance-event": "TERMINATE_ON_HOST_MAINTENANCE"}

_armed: "Armed | None" = None


class Armed:
    """What to save, where, and how far the notice got."""

    def __init__(self, namespace: dict, args: dict) -> None:
        self.namespace = namespace
        self.names = list(args["names"])
        self.uri = args["uri"]
        self.host, self.hosts = int(args["host"]), int(args["hosts"])
        self.template = dict(args["manifest"])
        self.window = float(args.get("window") or WINDOW)
        self.steps = 0
        self.notice_at: float | None = None
        self.source = ""
        self.state = "armed"  # armed | noticed | saving | saved | failed
        self.done = threading.Event()
        self._lock = threading.Lock()
        self.stop = threading.Event()

    @property
    def deadline(self) -> float:
        return (self.notice_at or time.time()) + self.window


# -- arming --------------------------------------------------------------------------------------
def arm(namespace: dict, args: dict) -> dict:
    """Watch for the notice from now on (again: the names and place are replaced)."""
    global _armed
    if _armed is not None:
        _armed.stop.set()
    armed = _armed = Armed(namespace, args)
    watching = []
    if _metadata_host():
        for key in KEYS:
            threading.Thread(target=_watch, args=(armed, key), daemon=True, name=f"tpunb-preempt-{key}").start()
        watching.append("metadata")
    if not watching:  # no metadata server: no notice can come, and SIGTERM stays what it was
        return {"ok": True, "watching": []}
    if not _jax_processes():
        try:
            signal.signal(signal.SIGTERM, _on_sigterm)  # JAX's own notifier takes SIGTERM once it starts
            watching.append("SIGTERM")
        except ValueError:  # not the main thread
            pass
    else:
        watching.append("SIGTERM (JAX)")
    if "jax" in sys.modules:  # orbax's first import takes seconds of the window: take them now
        try:
            import orbax.checkpoint  # noqa: F401
        except ImportError:
            return {"ok": True, "watching": watching, "missing": "orbax-checkpoint"}
    return {"ok": True, "watching": watching}


def jax_ready() -> None:
    """JAX started on this host: while armed, import orbax now, on a side thread, not in the window
    (its first import takes seconds of CPU; a busy host's 8 s notice lost the snapshot to it)."""
    if _armed is None:
        return

    def warm() -> None:
        try:
            import orbax.checkpoint  # noqa: F401
        except Exception:  # missing: the save says so when it comes
            pass

    threading.Thread(target=warm, daemon=True, name="tpunb-preempt-orbax").start()


_probed: list = []  # whether metadata.google.internal answered, asked once


def _metadata_host() -> str | None:
    """The metadata server, where one answers (a Cloud TPU VM; the emulator's hosts)."""
    host = os.environ.get("GCE_METADATA_HOST") or os.environ.get("GCE_METADATA_IP")
    if host:
        return host
    if not _probed:
        try:
            request = urllib.request.Request("http://metadata.google.internal/computeMetadata/v1/instance/id",
                                             headers={"Metadata-Flavor": "Google"})
            with urllib.request.urlopen(request, timeout=1):
                _probed.append("metadata.google.internal")
        except OSError:
            _probed.append(None)
    return _probed[0]


def _get(key: str, etag: str | None, wait: bool) -> tuple[str, str | None]:
    query = f"?wait_for_change=true&timeout_sec=60&last_etag={etag}" if wait and etag else (
        "?wait_for_change=true&timeout_sec=60" if wait else "")
    request = urllib.request.Request(f"http://{_metadata_host()}/computeMetadata/v1/{key}{query}",
                                     headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=70 if wait else 2) as response:
        return response.read().decode().strip(), response.headers.get("ETag")


def _watch(armed: Armed, key: str) -> None:
    """A hanging GET on ``key`` until it says the VM goes (Google's sample: compute/metadata/main.py)."""
    etag = None
    while not armed.stop.is_set() and armed.notice_at is None:
        try:
            value, etag = _get(key, etag, wait=etag is not None)
        except OSError:  # 503 during maintenance, a timeout: ask again
            if armed.stop.wait(1.0):
                return
            continue
        if value == KEYS[key]:
            notice(f"{key} = {value}")
            return


def _confirm(source: str) -> None:
    """A sign that may be the shutdown (SIGTERM, a lost connection): a notice if the metadata
    server says the VM goes, before the watcher's own GET has answered."""
    armed = _armed
    if armed is not None and armed.notice_at is None and _metadata_host():
        try:
            if any(_get(key, None, wait=False)[0] == value for key, value in KEYS.items()):
                notice(source)
        except OSError:
            pass


def _on_sigterm(signum, frame) -> None:
    """SIGTERM while JAX does not hold it: a notice if the metadata server says the VM goes (the
    guest's shutdown); otherwise it ends this host as it always did (an escalating interrupt)."""
    armed = _armed
    _confirm("SIGTERM")
    if armed is None or armed.notice_at is None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


# -- the notice -----------------------------------------------------------------------------------
def notice(source: str) -> None:
    """The VM is going: save now if this host is idle, else at the running cell's next step."""
    armed = _armed
    if armed is None:
        return
    with armed._lock:
        if armed.notice_at is not None:
            return
        armed.notice_at, armed.source, armed.state = time.time(), source, "noticed"
    _mark_notice(armed)
    if _jax_processes() and _jax_sync_manager():
        os.kill(os.getpid(), signal.SIGTERM)  # JAX's notifier: the hosts agree on a step to save at
    threading.Thread(target=_when_idle, args=(armed,), daemon=True, name="tpunb-preempt-save").start()


def _mark_notice(armed: Armed) -> None:
    """A note in the snapshot's place that the notice came: if the VM dies before the manifest, the
    kernel can tell "no time" from "no notice"."""
    try:
        snapshot.Store(armed.uri).write(f"notice-{armed.host}.json", json.dumps(
            {"host": armed.host, "time": armed.notice_at, "source": armed.source}).encode())
    except Exception:  # noqa: BLE001 - the snapshot matters more than the note
        pass


def _when_idle(armed: Armed) -> None:
    """Save on this thread as soon as no request runs, unless a step boundary saved first."""
    while not armed.done.is_set() and time.time() < armed.deadline:
        if MAIN.acquire(timeout=0.05):
            try:
                if not armed.done.is_set():
                    save(armed, "idle")
            finally:
                MAIN.release()
            return


def on_step(step) -> None:
    """``tpunb.log`` in a cell: a step boundary, where a pending notice is acted on."""
    armed = _armed
    if armed is None or armed.done.is_set():
        return
    armed.steps += 1
    if _jax_processes():
        try:
            from jax.experimental import multihost_utils

            reached = multihost_utils.reached_preemption_sync_point(armed.steps)
        except RuntimeError:  # JAX's preemption service is off: the next step after the notice
            reached = armed.notice_at is not None
    else:
        reached = armed.notice_at is not None
    if reached:
        if armed.notice_at is None:  # another host got the notice first: JAX told us through the sync
            armed.notice_at, armed.source, armed.state = time.time(), "JAX preemption sync", "noticed"
        save(armed, f"step {step if step is not None else armed.steps}")


def _jax_processes() -> bool:
    jax = sys.modules.get("jax")
    try:
        return jax is not None and jax.process_count() > 1
    except Exception:  # noqa: BLE001 - JAX not started yet
        return False


def _jax_sync_manager() -> bool:
    distributed = sys.modules.get("jax._src.distributed")
    state = getattr(distributed, "global_state", None)
    return getattr(state, "preemption_sync_manager", None) is not None


# -- saving ---------------------------------------------------------------------------------------
def save(armed: Armed, where: str) -> None:
    """Prepare and write this host's part; host 0 commits once every host's record is there."""
    with armed._lock:
        if armed.state in ("saving", "saved", "failed"):
            return
        armed.state = "saving"
    began = time.time()
    names = [n for n in armed.names if n in armed.namespace]  # armed before some were made: those there
    try:
        if not names:
            raise snapshot.SnapshotError(f"none of {', '.join(armed.names)} is defined on this host")
        args = {"uri": armed.uri, "names": names, "host": armed.host}
        prepared = snapshot.prepare(armed.namespace, args)
        if not prepared.get("ok"):
            raise snapshot.SnapshotError(prepared.get("error") or f"not defined here: {prepared.get('missing')}")
        record = prepared["record"]
        orbax = sorted(n for n in names if record["names"][n]["arrays"])
        snapshot.write(armed.namespace, {**args, "orbax": orbax})
        if armed.host == 0:
            _commit(armed, names)
        armed.state = "saved"
        _say(f"[tpunb] preemption notice ({armed.source}): snapshot of {', '.join(names)} taken at {where} in "
             f"{time.time() - began:.1f} s ({time.time() - (armed.notice_at or began):.1f} s after the notice): {armed.uri}")
    except BaseException as exc:  # noqa: B036 - whatever stops it, say it; the snapshot stays incomplete
        armed.state = "failed"
        _say(f"[tpunb] preemption notice ({armed.source}): the snapshot failed here: {snapshot.one_line(exc)}")
        if not isinstance(exc, Exception):
            raise
    finally:
        armed.done.set()


def _commit(armed: Armed, names: list[str]) -> None:
    """Host 0: wait (until the window closes) for every host's record, then write the manifest."""
    store = snapshot.Store(armed.uri)
    records: dict[int, dict] = {}
    while len(records) < armed.hosts:
        for host in range(armed.hosts):
            if host not in records:
                data = store.read(f"host-{host}.json")
                if data is not None:
                    records[host] = json.loads(data)
        if len(records) < armed.hosts:
            if time.time() > armed.deadline:
                raise snapshot.SnapshotError(f"hosts {sorted(set(range(armed.hosts)) - set(records))} did not finish "
                                             "within the window")
            armed.stop.wait(0.05)  # another host's file: nothing to be woken by but time
    manifest = snapshot.compose_manifest(armed.template, names, records, "preemption")
    snapshot.commit(armed.namespace, {"uri": armed.uri, "manifest": manifest})


def _say(text: str) -> None:
    print(text, flush=True)


def wait_saved(timeout: float) -> None:
    """Before this host session ends (its connection went with the guest's shutdown): let a
    preemption snapshot under way finish, within the window."""
    armed = _armed
    _confirm("connection lost")
    if armed is not None and armed.notice_at is not None and not armed.done.is_set():
        armed.done.wait(max(0.0, min(timeout, armed.deadline - time.time())))


def status(namespace: dict, args: dict) -> dict:
    armed = _armed
    if armed is None:
        return {"ok": True, "armed": False}
    return {"ok": True, "armed": not armed.stop.is_set(), "names": armed.names, "uri": armed.uri,
            "state": armed.state, "source": armed.source, "notice_at": armed.notice_at, "steps": armed.steps}


metrics.STEP_HOOKS.append(on_step)
snapshot.OPS.update(arm=arm, preempt_status=status)
