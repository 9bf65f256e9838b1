"""The kernel's slices: which are attached here and which is current; launch, connect, use,
down and status, as users call them (the magics are thin wrappers over these functions).

Backends make and remove hosts (``tpunb.provision``); a Slice runs cells on them. This module
only keeps the kernel's view: a name -> Slice map, the current slice, and --env values, which
live in memory only and never in the registry.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from typing import Any

from tpunb import catalog, colab, provision, report, serve, status as status_rows
from tpunb.errors import CellInterrupted, NoSliceError, TpunbError, UsageError
from tpunb.provision import LaunchRequest, interrupts, warm
from tpunb.provision.common import owner_running, start
from tpunb.registry import Registry
from tpunb.results import RunResult
from tpunb.slice import Slice
from tpunb.serve import seen
from tpunb.status import ForwardRow, HostRow, ServiceRow

BACKENDS = provision.LAUNCH_BACKENDS
_attached: dict[str, Slice] = {}
_current: list[str] = []  # the current slice's name, last one wins
_env: dict[str, dict[str, str]] = {}  # --env values per slice: memory only, never the registry


def registry() -> Registry:
    return Registry()


# -- names ----------------------------------------------------------------------------------------
def _taken(name: str, reg: Registry) -> bool:
    """In use: attached here, or recorded (a local slice whose kernel is gone may be reused)."""
    record = reg.get_slice(name)
    return name in _attached or (record is not None and not provision.backend(record.backend).name_reusable(record))


def _claim_name(name: str | None, base: str, reg: Registry) -> str:
    """The name a new slice gets: the one asked for if free (else a one-line error), or base, base-2, ..."""
    if name is None:
        candidate, n = base, 1
        while _taken(candidate, reg):
            n += 1
            candidate = f"{base}-{n}"
        return candidate
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
        raise UsageError(f"slice name {name!r}: use lowercase letters, digits and '-', starting with a letter "
                         "(as Cloud TPU node names)")
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


def _unset_env_note(name: str, env_keys: list[str], values: dict[str, str], what: str) -> None:
    missing = [k for k in env_keys if k not in values]
    if missing:
        report.warn(f"[tpunb] --env values are never stored, so {', '.join(missing)} are not set on the hosts "
                    f"now: {what}")


# -- making and attaching slices ------------------------------------------------------------------
def connect(hosts: list[str] | str, user: str | None = None, key: str | None = None, port: int = 22,
            name: str | None = None, env: Any = None, python: str | list[str] = "python3", accelerator: str | None = None,
            accept_new_host_key: bool = False, cwd: str | None = None, connect_timeout: float = 10.0,
            slices: int | None = None, coordinator_port: int | None = None) -> Slice:
    """Make a slice of hosts you bring (TPU VMs created elsewhere, any Linux machines) over SSH.

    Host index follows the order given. ``accept_new_host_key`` forgets the recorded keys of
    these hosts first: use it when a host was re-created, never by default. ``slices=N``: the
    hosts are N equal slices of a multislice, in order (each gets the MEGASCALE_* environment).
    ``python``: one interpreter for all hosts, or one per host (a list, or 'a,b,...').
    ``coordinator_port``: JAX's coordinator port on host 0, fixed (one your firewall opens).
    """
    warm.ready("ipywidgets", "tpunb.widgets.launch", "tpunb.transport.ssh")  # where Ctrl-C cannot cut them
    from tpunb.transport.ssh import forget_host_key, parse_host

    specs = [h.strip() for h in (hosts.split(",") if isinstance(hosts, str) else hosts) if h.strip()]
    if not specs:
        raise UsageError("give at least one host, e.g. %tpu_connect 10.0.0.2,10.0.0.3")
    count = _slice_count(slices)
    if len(specs) % count and not accelerator:
        raise UsageError(f"--slices {count}: {len(specs)} hosts do not make {count} equal slices; "
                         f"give {count} x (hosts per slice) hosts, slice by slice")
    if accelerator:
        accel = catalog.lookup(accelerator)
        if accel.hosts * count != len(specs):
            what = f"{count} x {accel.name} have {accel.hosts * count}" if count > 1 else f"{accel.name} has {accel.hosts}"
            raise UsageError(f"{what} host{'s' if accel.hosts * count > 1 else ''}, but {len(specs)} were given")
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
    name = _claim_name(name, provision.ssh.default_name(None), reg)
    if accept_new_host_key:
        for host, spec_port in places:
            forget_host_key(host, spec_port, reg)
    values = parse_env(env)
    if not isinstance(python, str):
        python = ",".join(python)
    if coordinator_port is not None and not 0 < int(coordinator_port) < 65536:
        raise UsageError(f"--coordinator-port {coordinator_port}: give a TCP port, 1-65535 (8476 passes GCP's TPU firewall rule)")
    opts = provision.ssh.options(hosts=addresses, user=user, key=str(key) if key else None, python=python, cwd=cwd,
                                 connect_timeout=connect_timeout, coordinator_port=coordinator_port)
    request = LaunchRequest(name, catalog.lookup(accelerator) if accelerator else None, reg, values, opts, count)
    with _interrupt_says_one_line(name, reg):
        return _attach(provision.ssh.create(request), values)


def launch(accelerator: str | None = None, name: str | None = None, backend: str | None = None, env: Any = None,
           recover: str | None = None, slices: int | None = None, **options: Any) -> Slice:
    """Create a slice and connect to every host; it becomes the current slice.

    ``backend`` is local (simulated on this machine) or gcp (Cloud TPU; options are the fields of
    ``tpunb.provision.gcp.config.CloudOptions``: project, zone, spot, runtime, queued, ...).
    ``slices=N`` makes a multislice: N slices of ``accelerator`` in one JAX job, one slice in
    tpunb (status, cost, down), its hosts numbered slice by slice.
    ``recover=NAME`` relaunches a preempted cloud slice with its recorded spec.
    """
    with interrupts.latched():  # a Ctrl-C that Python drops (in a gc callback) still stops the launch
        return _launch(accelerator, name, env, backend, slices, recover, options)


def _launch(accelerator: str | None, name: str | None, env: Any, backend: str | None, slices: Any,
            recover: str | None, options: dict) -> Slice:
    count = _slice_count(slices)
    if recover:
        if slices is not None:
            raise UsageError("--recover relaunches the recorded number of slices: give no --slices with it")
        return _recover(recover, env)
    if not accelerator:
        raise UsageError("name an accelerator, e.g. v4-16, or --recover NAME")
    if accelerator == colab.OWN_TPU:  # this machine's own TPU chips, e.g. a Colab TPU runtime
        if count > 1:
            raise UsageError(f"%tpu_launch {colab.OWN_TPU} is this machine's own TPU, one slice: give no --slices "
                             "(a simulated multislice: %tpu_launch v4-16 --slices 2 --backend local)")
        return _launch_own_tpu(name, env, backend, options)
    accel = catalog.lookup(accelerator)
    backend = backend or provision.default_backend(options.get("project"))
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)} "
                         "(hosts you bring: %tpu_connect HOST,HOST)")
    maker = provision.backend(backend)
    opts = maker.options(**options)
    values = parse_env(env)
    reg = registry()
    base = maker.default_name(accel) + (f"-x{count}" if count > 1 else "")
    name = _claim_name(name, base, reg)
    with _interrupt_says_one_line(name, reg):
        warm.ready("ipywidgets", "tpunb.widgets.launch")  # imported on a side thread, where Ctrl-C cannot cut it
        return _attach(maker.create(LaunchRequest(name, accel, reg, values, opts, count)), values)


def _slice_count(slices: Any) -> int:
    """--slices N: a whole number >= 1 (None: one slice)."""
    if slices is None:
        return 1
    if isinstance(slices, bool) or not isinstance(slices, int) or slices < 1:
        raise UsageError(f"--slices takes a whole number of slices >= 1, e.g. --slices 2, not {slices!r}")
    return slices


@contextlib.contextmanager
def _interrupt_says_one_line(name: str, reg: Registry):
    """Ctrl-C during a launch that a backend did not turn into its own error (before its cloud
    call, or while its hosts start): one line, and the launch's own record forgotten. Backends
    delete what they created themselves (local and SSH hosts are closed, a cloud node deleted)."""
    try:
        yield
    except KeyboardInterrupt:
        record = reg.get_slice(name)
        if record is not None and record.owner_pid == os.getpid() and record.state == "creating":
            reg.delete_slice(name)  # nothing exists for it yet: the cloud call had not started
        raise CellInterrupted(f"launch of {name} interrupted: nothing is left running") from None


def _launch_own_tpu(name: str | None, env: Any, backend: str | None, options: dict) -> Slice:
    """``%tpu_launch local``: a one-host slice whose host process runs on this machine's own TPU."""
    if backend not in (None, "local") or options:
        raise UsageError(f"%tpu_launch {colab.OWN_TPU} runs on this machine's own TPU and takes only --name and "
                         "--env; for Cloud TPU name an accelerator, e.g. %tpu_launch v5litepod-8 --backend gcp")
    accel = colab.own_accelerator()
    colab.check_tpu_free()
    values = parse_env(env)
    reg = registry()
    name = _claim_name(name, colab.OWN_TPU, reg)
    request = LaunchRequest(name, accel, reg, values, provision.local.LocalOptions(own_tpu=True))
    return _attach(provision.local.create(request), values)


def _recover(name: str, env: Any) -> Slice:
    """Relaunch a lost (preempted, terminated) cloud slice with the spec it was launched with."""
    values = parse_env(env) or _env.get(name, {})
    sl = _attached.get(name)
    if sl is not None:
        detach(name)
        sl.close()
    reg = registry()
    accel, opts, env_keys, count = provision.gcp.recover(name, reg)
    request = LaunchRequest(_claim_name(name, name, reg), accel, reg, values, opts, count)
    recovered = _attach(provision.gcp.create(request), values)
    _unset_env_note(name, env_keys, values, "pass them again with --env when recovering")
    return recovered


def _attach(sl: Slice, values: dict[str, str]) -> Slice:
    _attached[sl.name] = sl
    _env[sl.name] = values
    _current[:] = [sl.name]
    sl.on_delete.append(lambda deleted: detach(deleted.name))
    return sl


def detach(name: str) -> None:
    """Forget an attached slice in this kernel (its hosts are ended by the caller)."""
    _attached.pop(name, None)
    if _current and _current[0] == name:
        _current.clear()


def use(name: str) -> Slice:
    """Make ``name`` the current slice, re-attaching it (and restarting dead hosts)."""
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
    values = _env.get(name, {})
    backend = provision.backend(record.backend)
    sl = start(backend.attach(record, reg, values), reg, 0.0, ready="")
    report.warn(f"[tpunb] started {len(record.hosts)} new host session{'s' if len(record.hosts) > 1 else ''} for "
                f"{name!r}: the previous ones ended with their kernel, so their state was lost")
    _unset_env_note(name, record.spec.get("env_keys", []), values,
                    f"%tpu_down {name} and connect again with --env to set them")
    return _attach(sl, values)


def current(name: str | None = None) -> Slice:
    """The named slice, else the current one; a clear error says how to get one."""
    if name:
        return _attached[name] if name in _attached else use(name)
    if _current and _current[0] in _attached:
        return _attached[_current[0]]
    raise NoSliceError("no slice yet: launch one with %tpu_launch v4-16 (a local simulated slice), "
                       "or attach one with %tpu_use NAME")


def attached(name: str) -> Slice | None:
    """The slice of that name if this kernel holds it (never attaches one)."""
    return _attached.get(name)


# -- ending slices --------------------------------------------------------------------------------
def down(name: str | None = None, all: bool = False) -> list[str]:
    """Delete slices; already-deleted names are fine (idempotent). Returns the names deleted.

    With ``all``, a slice that cannot be deleted here (another kernel owns it) does not stop the
    others: every other one is deleted, then one error names what was left.
    """
    reg = registry()
    if all:
        names = sorted(set(_attached) | {r.name for r in reg.list_slices()})
    elif name:
        names = [name]
    elif _current:
        names = [_current[0]]
    else:
        return []
    deleted, refused = [], []
    for n in names:
        try:
            if _delete_one(n, reg):
                deleted.append(n)
        except UsageError as exc:
            if not all:
                raise
            refused.append(str(exc))
    if refused:
        done = f"deleted {', '.join(deleted)}; " if deleted else ""
        raise UsageError(f"{done}not deleted: {'; '.join(refused)}")
    return deleted


def _delete_one(name: str, reg: Registry) -> bool:
    sl = _attached.get(name)
    if sl is not None:
        sl.delete()
    else:
        record = reg.get_slice(name)
        if record is not None:
            provision.backend(record.backend).delete(record)  # before the registry forgets it
            reg.delete_slice(name)
        elif not provision.gcp.delete_orphan(name, reg):
            return False
    _env.pop(name, None)
    detach(name)
    return True


def detach_all() -> None:
    """End this kernel's host sessions (at exit, or when the extension is unloaded)."""
    for sl in list(_attached.values()):
        sl.close()
    _attached.clear()
    _current.clear()
    _env.clear()


# -- status ---------------------------------------------------------------------------------------
def host_rows() -> list[HostRow]:
    """Every known slice and its hosts, one row per host, live where this kernel is attached;
    with a Google Cloud project configured, also tpunb nodes the registry does not know."""
    rows: list[HostRow] = []
    current_name = _current[0] if _current else None
    reg = registry()
    records = reg.list_slices()
    survey = provision.gcp.Survey(records, reg)  # no API call unless a cloud slice or a project is configured
    for record in records:
        sl = _attached.get(record.name)
        if sl is not None:
            survey.refresh(record, sl.node)  # one list call refreshes every attached node
            rows.extend(sl.status_rows(current=record.name == current_name))
            continue
        seen = provision.backend(record.backend).slice_status(record, survey.nodes)
        latest = reg.latest_metrics(record.name)  # published by the kernel that owns the slice
        idle = reg.idle_delete_in(record.name, owner_running(record))
        for host in record.hosts or [None]:
            rows.append(status_rows.with_latest_metrics(HostRow(
                slice=record.name, accelerator=record.kind, backend=record.backend,
                host=host.index if host else None,
                slice_index=host.info.get("slice") if host and record.num_slices > 1 else None,
                address=host.address if host else None, state=seen.state,
                idle_delete_in=idle, **seen.cloud), latest))
    rows.extend(orphan.host_row() for orphan in survey.orphans({r.name for r in records}))
    return rows


def service_rows(hosts: list[HostRow]) -> tuple[list[ServiceRow], list[ForwardRow]]:
    """Every service of every known slice per host, and every forward a live kernel holds; a
    running service carries its slice's $/h (from ``hosts``' rows): it keeps the slice billing."""
    price = {r.slice: r.usd_per_hour for r in hosts if r.usd_per_hour is not None}
    services, forwards = [], []
    for record in registry().list_slices():
        sl = _attached.get(record.name)
        # ask the hosts of an attached slice only once it is known to have services: listing them
        # starts a process on every host, which a slice without any must not pay on every %tpu_status
        known = sl is not None and bool(seen.listed_services(record.name))
        states = sl.services() if known else serve.recorded_services(record)
        services.extend(seen.service_rows(record.name, states, price.get(record.name)))
        forwards.extend(seen.forward_rows(record.name))
    return services, forwards


def status():
    """%tpu_status as a pandas DataFrame: ``host_rows()``, one row per host; services and forwards
    in ``.attrs`` (shown below it)."""
    hosts = host_rows()
    services, forwards = service_rows(hosts)
    kept = seen.kept_busy(services)  # no idle countdown: the watchdog keeps the node while they run
    hosts = [dataclasses.replace(r, idle_delete_in=None) if r.slice in kept else r for r in hosts]
    return status_rows.frame(hosts, services, forwards)


def versions():
    """%tpu_status --versions as a pandas DataFrame: Python, jax, jaxlib, libtpu and flax of every
    host of the slices attached to this kernel, one row per host."""
    return status_rows.versions_frame([row for sl in _attached.values() for row in sl.version_rows()])


def last_result() -> RunResult | None:
    """The full per-host result of the last cell run on the current slice (uncapped output)."""
    try:
        return current().last_result
    except TpunbError:
        return None
