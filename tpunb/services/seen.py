"""What is known of a slice's services and forwards, also in processes that do not hold the slice
(the Jupyter server, another kernel): the status view (``tpunb.overview``) makes their rows.

Forwards live in the kernel that made them: it records them in a file per slice and kernel
(``$TPUNB_HOME/forwards/<slice>/<pid>.json``), which readers skip once that kernel is gone.
Services live on the hosts: a local slice's hosts are asked directly (on this machine, and only
hosts with a service folder), a remote slice's services are what a kernel last listed of them.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

from tpunb.registry import tpunb_home
from tpunb.status import ServiceRow
from tpunb.machine.procs import alive


@dataclasses.dataclass
class ServiceState:
    """One service on one host, as its state file says: what ``Slice.services()`` lists."""

    name: str
    host: int
    state: str  # starting, running, restarting, exited, failed (gave up restarting), stopped, lost
    pid: int | None
    exit_code: int | None
    restarts: int
    restart: str
    command: str
    log: str
    message: str = ""
    started_at: float | None = None
    env_keys: list[str] = dataclasses.field(default_factory=list)
    ready: bool = False  # running and answered a --wait-port/--wait-http since it (re)started
    port: int | None = None  # where it answers (--port, --wait-port or --wait-http): what %tpu_bench reaches

    @classmethod
    def from_host(cls, raw: dict) -> ServiceState:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})


def describe(service: ServiceState) -> str:
    """One wording per state: starting, ready, running, restarting (restart N), exited with code N,
    gave up after N restarts (...), stopped, lost."""
    if service.state == "running":
        return "ready" if service.ready else "running"
    if service.state == "restarting":
        return f"restarting (restart {service.restarts})"
    if service.state == "exited":
        return f"exited with code {service.exit_code}"
    if service.state == "failed":
        return service.message or f"gave up after {service.restarts} restarts"
    if service.state == "lost":
        return "lost (its supervisor is gone: the host restarted?)"
    return service.state


def listing(rows: list[ServiceRow]) -> str:
    """%tpu_serve's listing of a slice's services (rows from the status view): one line per service
    and host, with the port it answers on; '' when there are none."""
    lines = [f"{'service':<16} {'host':>4} {'port':>5}  {'state':<20} {'restarts':>8}  command"] if rows else []
    for s in rows:
        port = "" if s.port is None else str(s.port)
        lines.append(f"{s.service:<16} {s.host:>4} {port:>5}  {s.state:<20} {s.restarts:>8}  {s.command[:60]}")
    return "\n".join(lines)


# -- forwards ---------------------------------------------------------------------------------------
def _forwards_dir(slice_name: str) -> Path:
    return tpunb_home() / "forwards" / slice_name


def record_forward(slice_name: str, host: int, port: int, url: str) -> None:
    """Add a forward this kernel made (``url`` reaches ``port`` on ``host``) to the slice's record."""
    folder = _forwards_dir(slice_name)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{os.getpid()}.json"
    made = [f for f in _read(path) if f["url"] != url]
    local_port = int(url.rstrip("/").rsplit(":", 1)[1])
    made.append({"host": host, "port": port, "url": url, "local_port": local_port})
    path.with_suffix(".tmp").write_text(json.dumps(made))
    os.replace(path.with_suffix(".tmp"), path)


def forget_forwards(slice_name: str, everyone: bool = False) -> None:
    """This kernel's forwards of the slice ended (``everyone``: the slice is gone)."""
    if everyone:
        shutil.rmtree(_forwards_dir(slice_name), ignore_errors=True)
    else:
        (_forwards_dir(slice_name) / f"{os.getpid()}.json").unlink(missing_ok=True)


def forwards(slice_name: str) -> list[dict]:
    """Every live kernel's forwards to the slice: {host, port, url, local_port}."""
    folder = _forwards_dir(slice_name)
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if alive(int(path.stem)):
            found.extend(_read(path))
    return sorted(found, key=lambda f: (f["host"], f["port"], f["local_port"]))


def _read(path: Path) -> list[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return []


# -- services ---------------------------------------------------------------------------------------
def _listed_path(slice_name: str) -> Path:
    return tpunb_home() / "services-listed" / f"{slice_name}.json"


def record_services(slice_name: str, states: list[ServiceState]) -> None:
    """What a kernel just listed of a slice's services, for readers that cannot ask its hosts."""
    _write_listed(slice_name, [dataclasses.asdict(s) for s in states])


def note_started(slice_name: str, states: list[ServiceState]) -> None:
    """Services just started join the slice's listing (beside the others it holds), so the slice
    is known to have services without asking its hosts."""
    started = {(s.name, s.host) for s in states}
    kept = [raw for raw in listed_services(slice_name) if (raw.get("name"), raw.get("host")) not in started]
    _write_listed(slice_name, [*kept, *(dataclasses.asdict(s) for s in states)])


def _write_listed(slice_name: str, listed: list[dict]) -> None:
    path = _listed_path(slice_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".tmp").write_text(json.dumps(listed))
    os.replace(path.with_suffix(".tmp"), path)


def forget_services(slice_name: str) -> None:
    _listed_path(slice_name).unlink(missing_ok=True)


def listed_services(slice_name: str) -> list[dict]:
    """What a kernel last listed of the slice's services (each as its host's state file says)."""
    return _read(_listed_path(slice_name))
