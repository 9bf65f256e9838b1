"""The slices this kernel is attached to, and the functions users call: launch, use, down, status."""
from __future__ import annotations

import os
import random
import re
import sys
import time
from typing import Any

from tpunb import catalog
from tpunb.errors import NoSliceError, TpunbError, UsageError
from tpunb.provision import local
from tpunb.registry import HostRecord, Registry, SliceRecord
from tpunb.results import RunResult
from tpunb.slice import Slice

BACKENDS = ("local",)  # ways %tpu_launch makes hosts; %tpu_connect brings its own (backend "ssh")
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


def _free_name(base: str, reg: Registry) -> str:
    name, n = base, 1
    while True:
        record = reg.get_slice(name)
        if name not in _attached and (record is None or (record.backend == "local" and not _owner_alive(record))):
            return name
        n += 1
        name = f"{base}-{n}"


def _check_name(name: str) -> str:
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
        raise UsageError(f"slice name {name!r}: use lowercase letters, digits and '-', starting with a letter "
                         "(as Cloud TPU node names)")
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


def _host_env(record: SliceRecord, index: int) -> dict[str, str]:
    """What every host gets in its environment: where it sits in the slice, plus --env values."""
    env = {"TPUNB_HOST_INDEX": str(index), "TPUNB_NUM_HOSTS": str(len(record.hosts)), "TPUNB_SLICE": record.name}
    if record.accelerator:
        env["TPUNB_ACCELERATOR"] = record.accelerator
    return env


def _ssh_slice(record: SliceRecord, reg: Registry) -> Slice:
    """Hosts brought with %tpu_connect: one SSH connection each, jax.distributed over host 0."""
    from tpunb.transport.ssh import connect_all

    spec = record.spec
    transports = connect_all([h.address for h in record.hosts], user=spec.get("user"), key_path=spec.get("key"),
                             python=spec.get("python", "python3"), connect_timeout=spec.get("connect_timeout", 10.0),
                             registry=reg)
    coordinator = transports[0].host
    num_hosts = len(record.hosts)

    def host_init(index: int, coordinator_port: int) -> dict:
        env = {**_host_env(record, index), **_env.get(record.name, {})}
        jax = {"initialize": num_hosts > 1,
               "kwargs": {"coordinator_address": f"{coordinator}:{coordinator_port}", "num_processes": num_hosts,
                          "process_id": index, "initialization_timeout": 120}}
        return {"env": env, "jax": jax, "drop_output": local.GLOO_CHATTER, "cwd": spec.get("cwd")}

    return Slice(record, transports, host_init, reg, coordinator_port=lambda: random.randint(20000, 39999))


def _build_slice(record: SliceRecord, reg: Registry) -> Slice:
    if record.backend == "local":
        return _local_slice(record, reg)
    if record.backend == "ssh":
        return _ssh_slice(record, reg)
    raise UsageError(f"slice {record.name!r} uses backend {record.backend!r}, which this tpunb cannot attach")


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
    addresses = []
    for spec in specs:
        spec_user, host, spec_port = parse_host(spec, user, port)
        addresses.append(host if spec_port == 22 else f"{host}:{spec_port}")
        if spec_user != (user or spec_user):
            raise UsageError(f"{spec}: give the user once with --user, or as user@host on every host")
        user = spec_user
    reg = registry()
    if name is not None:
        _check_name(name)
        if name in _attached or reg.get_slice(name) is not None:
            raise UsageError(f"a slice named {name!r} exists: attach with %tpu_use {name}, or %tpu_down {name} first")
    if accept_new_host_key:
        for address in addresses:
            host, _, spec_port = address.partition(":")
            forget_host_key(host, int(spec_port or 22), reg)
    name = name or _free_name("hosts", reg)
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
        sl = _ssh_slice(record, reg)
        try:
            sl.connect()
        except BaseException:
            sl.session.close()
            raise
    except BaseException:
        _env.pop(name, None)
        raise
    reg.save_slice(record)
    _attach(sl)
    print(f"Slice {name!r} ready in {time.perf_counter() - started:.1f} s: run cells on it with %%on_tpu",
          file=sys.stderr)
    return sl


def _local_slice(record: SliceRecord, reg: Registry) -> Slice:
    accelerator = catalog.lookup(record.accelerator)
    num_hosts = len(record.hosts)

    def host_init(index: int, coordinator_port: int) -> dict:
        env = {**_host_env(record, index), **local.host_environment(accelerator), **_env.get(record.name, {})}
        return {"env": env, "cwd": os.getcwd(), "jax": local.jax_settings(num_hosts, index, coordinator_port),
                "drop_output": local.GLOO_CHATTER}

    return Slice(record, local.transports(record), host_init, reg)


def launch(accelerator: str, name: str | None = None, backend: str | None = None, env: Any = None,
           **options: Any) -> Slice:
    """Create a slice and connect to every host; it becomes the current slice."""
    accel = catalog.lookup(accelerator)
    backend = backend or "local"
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if options:
        raise UsageError(f"unknown option{'s' if len(options) > 1 else ''} {', '.join(sorted(options))} for backend {backend}")
    reg = registry()
    if name is not None:
        _check_name(name)
        existing = reg.get_slice(name)
        if name in _attached or (existing is not None and (existing.backend != "local" or _owner_alive(existing))):
            raise UsageError(f"a slice named {name!r} exists: attach with %tpu_use {name}, or %tpu_down {name} first")
    name = name or _free_name(accel.name, reg)
    _env[name] = parse_env(env)
    record = local.create(name, accel)
    started = time.perf_counter()
    print(f"Launching {accel.name} as a local simulated slice {name!r}: {accel.hosts} host"
          f"{'s' if accel.hosts > 1 else ''} x {accel.devices_per_host} JAX CPU devices ...", file=sys.stderr)
    sl = _local_slice(record, reg)
    try:
        sl.connect()
    except BaseException:
        sl.session.close()
        raise
    reg.save_slice(record)
    _attach(sl)
    print(f"Slice {name!r} ready in {time.perf_counter() - started:.1f} s: run cells on it with %%on_tpu",
          file=sys.stderr)
    return sl


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
    sl = _build_slice(record, reg)
    try:
        sl.connect()
    except BaseException:
        sl.session.close()
        raise
    record.owner_pid, record.state = os.getpid(), "running"
    reg.save_slice(record)
    what = "host process" if record.backend == "local" else "host session"
    print(f"[tpunb] started {sl.num_hosts} new {what}{'s' if sl.num_hosts > 1 else ''} for {name!r}: the previous "
          "ones ended with their kernel, so their state was lost", file=sys.stderr)
    missing = [k for k in record.spec.get("env_keys", []) if k not in _env.get(name, {})]
    if missing:
        print(f"[tpunb] --env values are never stored, so {', '.join(missing)} are not set on the hosts now: "
              f"%tpu_down {name} and connect again with --env to set them", file=sys.stderr)
    _attach(sl)
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
        sl = _attached.pop(n, None)
        if sl is not None:
            sl.delete()
            deleted.append(n)
        else:
            record = reg.get_slice(n)
            if record is not None:
                if record.backend == "local" and _owner_alive(record):
                    raise UsageError(f"local slice {n!r} runs in another kernel (pid {record.owner_pid}): "
                                     "take it down there")
                reg.delete_slice(n)
                deleted.append(n)
        _env.pop(n, None)
        if _current and _current[0] == n:
            _current.clear()
    return deleted


def status():
    """Every known slice and its hosts, one row per host, as a pandas DataFrame."""
    import pandas as pd

    rows = []
    current_name = _current[0] if _current else None
    for record in registry().list_slices():
        sl = _attached.get(record.name)
        if sl is not None:
            rows.extend(sl.status_rows(current=record.name == current_name))
            continue
        if record.backend == "local":
            state = "in another kernel" if _owner_alive(record) else "stopped (use %tpu_use to restart)"
        else:
            state = "not connected (use %tpu_use to reconnect)"
        for host in record.hosts:
            rows.append({"slice": record.name, "current": "", "accelerator": record.accelerator,
                         "backend": record.backend, "host": host.index, "address": host.address,
                         "state": state, "pid": None, "runner": None, "uptime_s": None})
    columns = ["slice", "current", "accelerator", "backend", "host", "address", "state", "pid", "runner", "uptime_s"]
    return pd.DataFrame(rows, columns=columns)


def last_result() -> RunResult | None:
    """The full per-host result of the last cell run on the current slice (uncapped output)."""
    try:
        return current().last_result
    except TpunbError:
        return None


def detach_all() -> None:
    """End this kernel's host sessions (at exit, or when the extension is unloaded)."""
    for sl in list(_attached.values()):
        sl.session.close()
    _attached.clear()
    _current.clear()
    _env.clear()
