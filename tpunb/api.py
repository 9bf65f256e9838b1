"""The slices this kernel is attached to, and the functions users call: launch, use, down, status."""
from __future__ import annotations

import os
import re
import sys
import time
from typing import Any

from tpunb import backends, catalog, cloud
from tpunb.cloud import CloudNode
from tpunb.errors import NoSliceError, TpunbError, UsageError
from tpunb.provision import local
from tpunb.registry import HostRecord, Registry, SliceRecord
from tpunb.results import RunResult
from tpunb.slice import Slice

BACKENDS = ("local", "gcp")  # ways %tpu_launch makes hosts; %tpu_connect brings its own (backend "ssh")
_attached: dict[str, Slice] = {}
_current: list[str] = []  # the current slice's name, last one wins
_env: dict[str, dict[str, str]] = {}  # --env values per slice: memory only, never the registry


def registry() -> Registry:
    return Registry()


def _owner_alive(record: SliceRecord) -> bool:
    if not record.owner_pid or record.owner_pid == os.getpid():
        return False
    try:
        os.kill(record.owner_pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _taken(name: str, reg: Registry) -> bool:
    """In use: attached here, or recorded (a local slice whose kernel is gone may be reused)."""
    record = reg.get_slice(name)
    return name in _attached or (record is not None and (record.backend != "local" or _owner_alive(record)))


def _free_name(base: str, reg: Registry) -> str:
    name, n = base, 1
    while _taken(name, reg):
        n += 1
        name = f"{base}-{n}"
    return name


def _check_name(name: str) -> str:
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
        raise UsageError(f"slice name {name!r}: use lowercase letters, digits and '-', starting with a letter "
                         "(as Cloud TPU node names)")
    return name


def _claim_name(name: str | None, base: str, reg: Registry) -> str:
    """The name a new slice gets: the one asked for if free (else a one-line error), or base, base-2, ..."""
    if name is None:
        return _free_name(base, reg)
    _check_name(name)
    if _taken(name, reg):
        raise UsageError(f"a slice named {name!r} exists: attach with %tpu_use {name}, or %tpu_down {name} first")
    return name


def parse_env(pairs: list[str] | dict | None) -> dict[str, str]:
    """['KEY=VALUE', ...] -> dict; values are secrets and are never printed or stored."""
    if not pairs:
        return {}
    if isinstance(pairs, dict):
        return {str(k): str(v) for k, v in pairs.items()}
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"--env takes KEY=VALUE, got {key or pair!r}")
        env[key] = value
    return env


def connect(hosts: list[str] | str, user: str | None = None, key: str | None = None, port: int = 22,
            name: str | None = None, env: Any = None, python: str = "python3", accelerator: str | None = None,
            accept_new_host_key: bool = False, cwd: str | None = None, connect_timeout: float = 10.0) -> Slice:
    """Make a slice of hosts you bring (TPU VMs created elsewhere, any Linux machines) over SSH.

    Host index follows the order given. ``accept_new_host_key`` forgets the recorded keys of
    these hosts first: use it when a host was re-created, never by default.
    """
    from tpunb.transport.ssh import forget_host_key, parse_host

    specs = [h.strip() for h in (hosts.split(",") if isinstance(hosts, str) else hosts) if h.strip()]
    if not specs:
        raise UsageError("give at least one host, e.g. %tpu_connect 10.0.0.2,10.0.0.3")
    if accelerator:
        accel = catalog.lookup(accelerator)
        if accel.hosts != len(specs):
            raise UsageError(f"{accel.name} has {accel.hosts} host{'s' if accel.hosts > 1 else ''}, "
                             f"but {len(specs)} were given")
        accelerator = accel.name
    places, addresses = [], []
    for spec in specs:
        spec_user, host, spec_port = parse_host(spec, user, port)
        places.append((host, spec_port))
        addresses.append(host if spec_port == 22 else f"{host}:{spec_port}")
        if spec_user != (user or spec_user):
            raise UsageError(f"{spec}: give the user once with --user, or as user@host on every host")
        user = spec_user
    reg = registry()
    name = _claim_name(name, "hosts", reg)
    if accept_new_host_key:
        for host, spec_port in places:
            forget_host_key(host, spec_port, reg)
    values = parse_env(env)
    record = SliceRecord(name=name, accelerator=accelerator or "", backend="ssh", state="running",
                         owner_pid=os.getpid(),
                         spec={"user": user, "key": str(key) if key else None, "python": python, "cwd": cwd,
                               "connect_timeout": connect_timeout, "env_keys": sorted(values)},
                         hosts=[HostRecord(i, a) for i, a in enumerate(addresses)])
    started = time.perf_counter()
    print(f"Connecting to {len(addresses)} host{'s' if len(addresses) > 1 else ''} over SSH as {name!r} ...",
          file=sys.stderr)
    _env[name] = values
    try:
        return _start(backends.ssh_slice(record, reg, values), reg, started)
    except BaseException:
        _env.pop(name, None)
        raise


def default_backend(project: str | None = None) -> str:
    """gcp when a Google Cloud project is configured (flag, environment, gcloud), else local."""
    from tpunb.provision.gcp import resolve_project_zone

    return "gcp" if resolve_project_zone(project, None)[0] else "local"


def launch(accelerator: str | None = None, name: str | None = None, backend: str | None = None, env: Any = None,
           recover: str | None = None, **options: Any) -> Slice:
    """Create a slice and connect to every host; it becomes the current slice.

    ``backend`` is local (simulated on this machine) or gcp (Cloud TPU; options: project, zone,
    spot, runtime, queued, network, subnetwork, service_account, labels, internal_ip, timeout,
    user, python). ``recover=NAME`` relaunches a preempted cloud slice with its recorded spec.
    """
    if recover:
        return _recover(recover, env)
    if not accelerator:
        raise UsageError("name an accelerator, e.g. v4-16, or --recover NAME")
    accel = catalog.lookup(accelerator)
    backend = backend or default_backend(options.get("project"))
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend == "gcp":
        return _launch_cloud(accel, name, parse_env(env), **options)
    if options:
        raise UsageError(f"unknown option{'s' if len(options) > 1 else ''} {', '.join(sorted(options))} for backend {backend}")
    reg = registry()
    name = _claim_name(name, accel.name, reg)
    _env[name] = parse_env(env)
    record = local.create(name, accel)
    started = time.perf_counter()
    print(f"Launching {accel.name} as a local simulated slice {name!r} (no Google Cloud project configured, "
          f"or --backend local): {accel.hosts} host"
          f"{'s' if accel.hosts > 1 else ''} x {accel.devices_per_host} JAX CPU devices ...", file=sys.stderr)
    return _start(backends.local_slice(record, reg, _env[name]), reg, started)


def _start(sl: Slice, reg: Registry, started: float, ready: str | None = None) -> Slice:
    """Start every host; only a slice whose hosts all came up is recorded and becomes current."""
    try:
        sl.connect()
    except BaseException:
        sl.close()
        raise
    sl.record.owner_pid, sl.record.state = os.getpid(), "running"
    if sl.backend == "local":  # published so the Jupyter server's sidebar can end them (tpunb.server.model)
        for host in sl.session.hosts:
            sl.record.hosts[host.index].info["pid"] = host.info.get("pid")
    reg.save_slice(sl.record)
    _attach(sl)
    print(ready or f"Slice {sl.name!r} ready in {time.perf_counter() - started:.1f} s: run cells on it with %%on_tpu",
          file=sys.stderr)
    return sl


def _launch_cloud(accel, name: str | None, values: dict[str, str], **options: Any) -> Slice:
    reg = registry()
    name = _claim_name(name, f"tpunb-{accel.name}", reg)
    sl = cloud.launch(accel, name, values, reg, **options)
    _env[name] = values
    _attach(sl)
    return sl


def _recover(name: str, env: Any) -> Slice:
    """Relaunch a lost (preempted, terminated) cloud slice with the spec it was launched with."""
    from tpunb.provision import gcp

    reg = registry()
    record = reg.get_slice(name)
    if record is None:
        raise NoSliceError(f"no slice named {name!r} to recover: see %tpu_status")
    if record.backend != "gcp":
        raise UsageError(f"{name!r} is a {record.backend} slice: %tpu_use {name} restarts it")
    values = parse_env(env) or _env.get(name, {})
    missing = [k for k in record.spec.get("env_keys", []) if k not in values]
    sl = _attached.get(name)
    if sl is not None:
        detach(name)
        sl.close()
    spec = record.spec
    print(f"Recovering {name!r}: deleting its lost node, then launching {record.accelerator} again", file=sys.stderr)
    gcp.delete(spec["project"], spec["zone"], name, wait=True)
    reg.delete_slice(name)
    options = {k: spec[k] for k in ("project", "zone", "spot", "queued", "runtime", "network", "subnetwork",
                                     "service_account", "labels", "internal_ip", "user", "python") if spec.get(k)}
    recovered = _launch_cloud(catalog.lookup(record.accelerator), name, values, **options)
    if missing:
        print(f"[tpunb] --env values are never stored: {', '.join(missing)} are not set; pass them again with "
              f"--env when recovering", file=sys.stderr)
    return recovered


def _attach(sl: Slice) -> None:
    _attached[sl.name] = sl
    _current[:] = [sl.name]


def detach(name: str) -> None:
    """Forget an attached slice in this kernel (its hosts are ended by the caller)."""
    _attached.pop(name, None)
    if _current and _current[0] == name:
        _current.clear()


def use(name: str) -> Slice:
    """Make ``name`` the current slice, re-attaching it (and restarting dead local hosts)."""
    if name in _attached:
        sl = _attached[name]
        sl.revive()
        _current[:] = [name]
        return sl
    reg = registry()
    record = reg.get_slice(name)
    if record is None:
        known = [r.name for r in reg.list_slices()]
        hint = f"known slices: {', '.join(known)}" if known else "launch one with %tpu_launch v4-16"
        raise NoSliceError(f"no slice named {name!r}: {hint}")
    if record.backend == "local" and _owner_alive(record):
        raise UsageError(f"local slice {name!r} runs in another kernel (pid {record.owner_pid}): "
                         "its host processes belong to that kernel; use it there or %tpu_down it")
    what = "host process" if record.backend == "local" else "host session"
    sl = _start(backends.build_slice(record, reg, _env.get(name, {})), reg, time.perf_counter(),
                ready=f"[tpunb] started {len(record.hosts)} new {what}{'s' if len(record.hosts) > 1 else ''} for "
                      f"{name!r}: the previous ones ended with their kernel, so their state was lost")
    missing = [k for k in record.spec.get("env_keys", []) if k not in _env.get(name, {})]
    if missing:
        print(f"[tpunb] --env values are never stored, so {', '.join(missing)} are not set on the hosts now: "
              f"%tpu_down {name} and connect again with --env to set them", file=sys.stderr)
    return sl


def current(name: str | None = None) -> Slice:
    """The named slice, else the current one; a clear error says how to get one."""
    if name:
        return _attached[name] if name in _attached else use(name)
    if _current and _current[0] in _attached:
        return _attached[_current[0]]
    raise NoSliceError("no slice yet: launch one with %tpu_launch v4-16 (a local simulated slice), "
                       "or attach one with %tpu_use NAME")


def down(name: str | None = None, all: bool = False) -> list[str]:
    """Delete slices; already-deleted names are fine (idempotent). Returns the names deleted."""
    reg = registry()
    if all:
        names = sorted(set(_attached) | {r.name for r in reg.list_slices()})
    elif name:
        names = [name]
    elif _current:
        names = [_current[0]]
    else:
        return []
    deleted = []
    for n in names:
        sl = _attached.get(n)
        if sl is not None:
            sl.delete()
            deleted.append(n)
            continue
        record = reg.get_slice(n)
        if record is not None:
            if record.backend == "local" and _owner_alive(record):
                raise UsageError(f"local slice {n!r} runs in another kernel (pid {record.owner_pid}): "
                                 "take it down there")
            if record.backend == "gcp":
                backends.cloud_node(record, watch=False).delete()  # before the registry forgets it
            reg.delete_slice(n)
            deleted.append(n)
        elif cloud.delete_orphan(n):
            deleted.append(n)
        _env.pop(n, None)
        if _current and _current[0] == n:
            _current.clear()
    return deleted


COLUMNS = ["slice", "current", "accelerator", "backend", "cloud_state", "health", "usd_per_hour", "host", "address",
           "state", "pid", "runner", "uptime_s"]


def status():
    """Every known slice and its hosts, one row per host, as a pandas DataFrame; with a Google
    Cloud project configured, also tpunb nodes this registry does not know (orphans)."""
    import pandas as pd

    rows = []
    current_name = _current[0] if _current else None
    records = registry().list_slices()
    listing = cloud.listing(records)  # no API call unless a cloud slice or a project is configured
    for record in records:
        sl = _attached.get(record.name)
        place = (record.spec.get("project"), record.spec.get("zone"))
        if sl is not None:
            if sl.cloud is not None and place in listing:
                sl.cloud.info = listing[place].get(record.name)
                sl.cloud.checked_at = time.monotonic()
            rows.extend(sl.status_rows(current=record.name == current_name))
            continue
        cloud_state = {}
        if record.backend == "gcp":
            info = listing.get(place, {}).get(record.name)
            cloud_state = backends.cloud_node(record, info, watch=False).status() if place in listing else {}
        if record.backend == "local":
            state = "in another kernel" if _owner_alive(record) else "stopped (use %tpu_use to restart)"
        elif record.state == "creating":
            state = "being created (or its launch was cut off: %tpu_down deletes it)"
        else:
            state = "not connected (use %tpu_use to reconnect)"
        for host in record.hosts or [None]:
            rows.append({"slice": record.name, "current": "", "accelerator": record.accelerator,
                         "backend": record.backend, **cloud_state, "host": host.index if host else None,
                         "address": host.address if host else None, "state": state, "pid": None, "runner": None,
                         "uptime_s": cloud_state.get("uptime_s")})
    known = {r.name for r in records}
    for (project, zone), nodes in listing.items():
        for node_name, info in sorted(nodes.items()):
            if node_name in known:
                continue
            orphan = CloudNode(node_name, info.accelerator, project, zone, info.spot, info, watch=False)
            rows.append({"slice": node_name, "current": "", "accelerator": info.accelerator, "backend": "gcp",
                         **orphan.status(), "host": None, "address": f"{project}/{zone}",
                         "state": f"ORPHAN: not in this registry, still billed; %tpu_down {node_name} deletes it",
                         "pid": None, "runner": None})
    frame = pd.DataFrame(rows, columns=COLUMNS)
    if not (frame["backend"] == "gcp").any():  # no cloud slice: cloud columns would be empty noise
        frame = frame.drop(columns=["cloud_state", "health", "usd_per_hour"])
    return frame


def last_result() -> RunResult | None:
    """The full per-host result of the last cell run on the current slice (uncapped output)."""
    try:
        return current().last_result
    except TpunbError:
        return None


def detach_all() -> None:
    """End this kernel's host sessions (at exit, or when the extension is unloaded)."""
    for sl in list(_attached.values()):
        sl.close()
    _attached.clear()
    _current.clear()
    _env.clear()
