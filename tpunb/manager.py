"""The kernel's slices, held by one ``SliceManager``: which are attached here and which is current,
their --env values (memory only, never the registry), the last profile; launch, connect, use,
down and status as users call them. The magics, ``tpunb``'s functions, the Jupyter server and the
tests share ``MANAGER``; the module's functions are its methods.

Backends make and remove hosts (``tpunb.provision``); a Slice runs cells on them. What only some
backends can do (recover a lost slice, delete an orphaned node) is asked of them through
``provision.supports``: this module never names a backend.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tpunb import catalog, provision, report
from tpunb.engine.background import interrupt_all
from tpunb.engine.masking import Masker
from tpunb.fetch import hub as fetch_hub
from tpunb.errors import NoSliceError, TpunbError, UsageError
from tpunb.notebook import env as env_values, launch_args, names, own_tpu, stop_button
from tpunb.notebook.brought import brought_hosts
from tpunb.provision import LaunchRequest, Made, interrupts, warm
from tpunb.provision.starting import interrupt_says_one_line, start_slice, with_spec
from tpunb.registry import Registry
from tpunb.results import RunResult
from tpunb.secrets import hub_token
from tpunb.secrets.vault import Secrets
from tpunb.slice import Slice
from tpunb.status import HostRow, ServiceRow, versions_frame
from tpunb.overview import StatusView
from tpunb.transport.forkserver import LocalForks

if TYPE_CHECKING:
    import pandas

    from tpunb.engine.background import Run
    from tpunb.profile import Profile

BACKENDS = provision.LAUNCH_BACKENDS


def registry() -> Registry:
    return Registry()


def parse_env(pairs: list[str] | dict | None, secrets: list[str] | None = None) -> dict[str, str]:
    """['KEY=VALUE', ...] -> dict, for settings that may be shown (never stored); ``secrets``: names
    whose values come from this kernel, masked (``tpunb.notebook.env``)."""
    return env_values.parse_env(pairs, secrets, MANAGER.masker, MANAGER.named)


class SliceManager:
    """This kernel's slices. One per process (``MANAGER``); tests may make their own."""

    def __init__(self) -> None:
        #: name -> the Slice attached in this kernel
        self.attached: dict[str, Slice] = {}
        #: the current slice's name (the last launched, connected or used), or None
        self.current_name: str | None = None
        #: --env values per slice: memory only, never the registry
        self.env: dict[str, dict[str, str]] = {}
        #: the last profile collected in this kernel, on any slice
        self.last_profile: Profile | None = None
        #: the handle of the last %%on_tpu --bg cell started in this kernel, on any slice
        self.last_run: Run | None = None
        #: the kernel's stop button between cells, once this manager made it interrupt background cells
        self.stop_button: Any = None
        #: secrets named with %tpu_secret: every slice's hosts get them; memory only, never stored
        self.secrets: dict[str, str] = {}
        #: every secret value this kernel knows, masked in all that hosts send back
        self.masker = Masker()
        #: secrets by name (%tpu_secret, --secret), for their next use: memory only
        self.named = Secrets()
        #: the fork server its local hosts' agents start from (tpunb.transport.forkserver)
        self.forks = LocalForks()

    def _claim_name(self, name: str | None, base: str, reg: Registry) -> str:
        return names.claim(name, base, reg, self.attached)

    # -- making and attaching slices ----------------------------------------------------------------
    def connect(self, hosts: list[str] | str, user: str | None = None, key: str | None = None, port: int = 22,
                name: str | None = None, env: Any = None, python: str | list[str] = "python3", accelerator: str | None = None,
                accept_new_host_key: bool = False, cwd: str | None = None, connect_timeout: float = 10.0,
                slices: int | None = None, coordinator_port: int | None = None, setup: bool = False,
                jax: str | None = None, pip: Any = None, requirements: str | None = None,
                secrets: list[str] | None = None) -> Slice:
        """Make a slice of hosts you bring (TPU VMs created elsewhere, any Linux machines) over SSH.

        Host index follows the order given. ``accept_new_host_key`` forgets the recorded keys of
        these hosts first: use it when a host was re-created, never by default. ``slices=N``: the
        hosts are N equal slices of a multislice, in order (each gets the MEGASCALE_* environment).
        ``python``: one interpreter for all hosts, or one per host (a list, or 'a,b,...').
        ``coordinator_port``: JAX's coordinator port on host 0, fixed (one your firewall opens).
        ``setup``: make (or check) an environment on each host as a cloud slice gets, with ``python``
        as X.Y (default this kernel's), ``jax``, ``pip`` and ``requirements``; off by default, since
        the hosts and their Python are yours.
        """
        warm.ready("ipywidgets", "tpunb.widgets.launch", "tpunb.transport.ssh_hosts")  # where Ctrl-C cannot cut them
        from tpunb.transport.ssh_hosts import forget_host_key

        brought = brought_hosts(hosts, user, port, slices, accelerator, python, coordinator_port)
        reg = registry()
        maker = provision.backend(provision.BRING_YOUR_OWN)
        name = self._claim_name(name, maker.default_name(None), reg)
        if accept_new_host_key:
            for host, spec_port in brought.places:
                forget_host_key(host, spec_port, reg)
        values = parse_env(env, secrets)
        opts = maker.options(hosts=brought.addresses, user=brought.user, key=str(key) if key else None,
                             python=brought.python, cwd=cwd, connect_timeout=connect_timeout,
                             coordinator_port=coordinator_port, setup=setup, jax=jax, pip=pip, requirements=requirements)
        return self._make(maker, LaunchRequest(name, brought.accelerator, reg, values, opts, brought.count))

    def launch(self, accelerator: str | None = None, name: str | None = None, backend: str | None = None, env: Any = None,
               recover: str | None = None, slices: int | None = None, compile_cache: str | None = None,
               secrets: list[str] | None = None, hf_token: bool = True, **options: Any) -> Slice:
        """Create a slice and connect to every host; it becomes the current slice.

        ``backend`` is local (simulated on this machine) or gcp (Cloud TPU; options are the fields of
        ``tpunb.provision.gcp.config.CloudOptions``: project, zone, spot, runtime, queued, ...).
        ``slices=N`` makes a multislice: N slices of ``accelerator`` in one JAX job, one slice in
        tpunb (status, cost, down), its hosts numbered slice by slice.
        ``recover=NAME`` relaunches a preempted cloud slice with its recorded spec.
        ``compile_cache="gs://BUCKET/PATH"``: JAX's compilation cache in Cloud Storage, shared with
        every slice given the same place (by default each host keeps its own, on its disk).
        ``secrets``: names given to the hosts as secrets (``--secret``); ``hf_token=False`` keeps the
        kernel's HF_TOKEN from the hosts (by default it goes, as a secret, and the launch says so).
        """
        cache = launch_args.compile_cache(compile_cache)
        env = parse_env(env, secrets)
        with interrupts.latched():  # a Ctrl-C that Python drops (in a gc callback) still stops the launch
            return self._launch(accelerator, name, env, backend, slices, recover, options, cache, hf_token)

    def _launch(self, accelerator: str | None, name: str | None, env: Any, backend: str | None, slices: Any,
                recover: str | None, options: dict, cache: str | None = None, hf_token: bool = True) -> Slice:
        count = launch_args.slice_count(slices)
        if recover:
            if slices is not None:
                raise UsageError("--recover relaunches the recorded number of slices: give no --slices with it")
            return self._recover(recover, env, cache)
        if not accelerator:
            raise UsageError("name an accelerator, e.g. v4-16, or --recover NAME")
        if accelerator == own_tpu.NAME:  # this machine's own TPU chips, e.g. a Colab TPU runtime
            own_tpu.check(count, backend, options)
            return self._launch_own_tpu(name, env, cache)
        accel = catalog.lookup(accelerator)
        launch_args.check_multislice(accel, count)
        maker = provision.launch_backend(backend or provision.default_backend(options.get("project")))
        opts = maker.options(**options)
        values = hub_token.with_token(dict(env), self.masker, hf_token)
        reg = registry()
        base = maker.default_name(accel) + (f"-x{count}" if count > 1 else "")
        name = self._claim_name(name, base, reg)
        sl = self._make(maker, LaunchRequest(name, accel, reg, values, opts, count), compile_cache=cache,
                        hf_token=hf_token)
        hub_token.say_if_added(sl.name, values, given=(env, self.secrets))
        return sl

    def _launch_own_tpu(self, name: str | None, env: Any, cache: str | None) -> Slice:
        """``%tpu_launch local``: a one-host slice whose host process runs on this machine's own TPU."""
        values, reg = dict(env), registry()
        maker, request = own_tpu.request(self._claim_name(name, own_tpu.NAME, reg), values, reg)
        sl = self._make(maker, request, compile_cache=cache)
        if request.accelerator is None:
            own_tpu.name_or_end(sl, self.down)
        return sl

    def _recover(self, name: str, env: Any, cache: str | None) -> Slice:
        """Relaunch a lost (preempted, terminated) slice with the spec it was launched with, where
        its backend can."""
        values = dict(env) or self.env.get(name, {})
        reg = registry()
        record = reg.get_slice(name)
        if record is None:
            raise NoSliceError(f"no slice named {name!r} to recover: see %tpu_status")
        maker = provision.backend(record.backend)
        if not provision.supports(maker, "recover"):
            raise UsageError(f"{name!r} is a {record.backend} slice: %tpu_use {name} restarts it")
        held = self.attached.get(name)
        if held is not None:
            self.detach(name)
            held.close()
        cache = cache or record.spec.get("compile_cache")  # a shared cache outlives the lost node
        accel, opts, env_keys, count = maker.recover(record, reg)
        request = LaunchRequest(self._claim_name(name, name, reg), accel, reg, values, opts, count)
        recovered = self._make(maker, request, compile_cache=cache)
        env_values.note_unset(env_keys, values, "pass them again with --env when recovering")
        return recovered

    def _make(self, maker: Any, request: LaunchRequest, **spec: Any) -> Slice:
        """The backend makes the slice, which then starts and is attached here; a Ctrl-C on the way is
        one line (``provision.starting``). ``spec``: what the launch keeps in the record's spec."""
        with interrupt_says_one_line(request.name, request.registry):
            warm.ready("ipywidgets", "tpunb.widgets.launch")  # imported on a side thread, where Ctrl-C cannot cut it
            since = time.perf_counter()
            return self.start(with_spec(maker.create(request), **spec), request.registry, request.env, since)

    def start(self, made: Made, reg: Registry, values: dict[str, str], since: float | None = None,
               quiet: bool = False) -> Slice:
        """Start what a backend made (``provision.starting``: connected, checked, recorded as
        running) and attach it here, as the current slice. ``since``: when the launch began."""
        values.update(self.secrets)  # the backend's host_init reads this same dict: hosts start with them
        sl = start_slice(made, reg, self.masker, self.forks, since, quiet)
        return self._attach(sl, values)

    def _attach(self, sl: Slice, values: dict[str, str]) -> Slice:
        sl.mark_used()
        self.attached[sl.name] = sl
        self.env[sl.name] = values
        self.current_name = sl.name
        sl.on_delete.append(lambda deleted: self.detach(deleted.name))
        sl.profiler.on_collected = self._profiled
        sl.background.on_start = self._ran
        return sl

    def secret(self, *names: str) -> list[str]:
        """Put secrets in every slice's hosts' environment (now, and whenever hosts start again):
        each from this kernel's environment, else Colab's secrets, else a prompt that echoes
        nothing (``tpunb.secrets.vault``). Their values are masked (``****``) in everything hosts
        send back and are never stored. Returns the names set."""
        if not names:
            raise UsageError("name at least one secret, e.g. %tpu_secret HF_TOKEN")
        values = {name: self.named.get(name, self.masker) for name in names}
        self.secrets.update(values)
        for sl in self.attached.values():
            self.env.setdefault(sl.name, {}).update(values)
            sl.send_environ(values)
        return sorted(values)

    def _ran(self, run: Run) -> None:
        """From the first background cell on, the stop button between cells interrupts every held
        slice's background cells (``tpunb.notebook.stop_button``)."""
        self.last_run = run
        self.stop_button = self.stop_button or stop_button.take(self.interrupt_background)

    def interrupt_background(self, signum: int | None = None, frame: Any = None) -> None:
        """Interrupt every held slice's background cells, running or waiting their turn (the stop
        button between cells; a signal handler)."""
        for sl in list(self.attached.values()):
            interrupt_all(sl.session)

    def _profiled(self, profile: Profile) -> None:
        self.last_profile = profile

    def detach(self, name: str) -> None:
        """Forget an attached slice in this kernel (its hosts are ended by the caller)."""
        self.attached.pop(name, None)
        if self.current_name == name:
            self.current_name = None

    def use(self, name: str) -> Slice:
        """Make ``name`` the current slice, re-attaching it (and restarting dead hosts)."""
        if name in self.attached:
            sl = self.attached[name]
            sl.revive()
            self.current_name = name
            return sl
        reg = registry()
        record = reg.get_slice(name) or provision.adopt(name, reg)  # a node this registry lost (a Colab reset)
        if record is None:
            raise names.unknown(name, reg)
        values = self.env.get(name, {})  # a new kernel: the HF token as the launch gave it
        values = hub_token.with_token(values, self.masker, provision.launched(record) and record.spec.get("hf_token", True))
        sl = self.start(provision.backend(record.backend).attach(record, reg, values), reg, values, quiet=True)
        report.warn(f"[tpunb] started {len(record.hosts)} new host session{'s' if len(record.hosts) > 1 else ''} for "
                    f"{name!r}: the previous ones ended with their kernel, so their state was lost")
        env_values.note_unset(record.spec.get("env_keys", []), values,
                              f"%tpu_down {name} and connect again with --env to set them")
        return sl

    def current(self, name: str | None = None) -> Slice:
        """The named slice, else the current one; a clear error says how to get one."""
        if name:
            return self.attached[name] if name in self.attached else self.use(name)
        if self.current_name in self.attached:
            return self.attached[self.current_name]
        raise NoSliceError("no slice yet: launch one with %tpu_launch v4-16 (a local simulated slice), "
                           "or attach one with %tpu_use NAME")

    # -- ending slices ------------------------------------------------------------------------------
    def down(self, name: str | None = None, all: bool = False) -> list[str]:
        """Delete slices; already-deleted names are fine (idempotent). Returns the names deleted.

        With ``all``, a slice that cannot be deleted here (another kernel owns it) does not stop the
        others: every other one is deleted, then one error names what was left.
        """
        reg = registry()
        names = (sorted(set(self.attached) | {r.name for r in reg.list_slices()}) if all
                 else [n for n in [name or self.current_name] if n])
        deleted, refused = [], []
        for n in names:
            try:
                if self._delete_one(n, reg):
                    deleted.append(n)
            except UsageError as exc:
                if not all:
                    raise
                refused.append(str(exc))
        if refused:
            done = f"deleted {', '.join(deleted)}; " if deleted else ""
            raise UsageError(f"{done}not deleted: {'; '.join(refused)}")
        return deleted

    def _delete_one(self, name: str, reg: Registry) -> bool:
        sl = self.attached.get(name)
        if sl is not None:
            sl.delete()
        elif not provision.delete_recorded(name, reg):
            return False
        self.env.pop(name, None)
        self.detach(name)
        return True

    def detach_all(self) -> None:
        """End this kernel's host sessions (at exit, or when the extension is unloaded)."""
        for sl in list(self.attached.values()):
            sl.close()
        self.attached.clear()
        self.current_name = None
        self.env.clear()

    # -- status -------------------------------------------------------------------------------------
    def view(self, **parts: bool) -> StatusView:
        """Every known slice (live where this kernel holds it) and the orphaned cloud nodes: the
        one status model %tpu_status, the server's JSON and the sidebar show."""
        return StatusView.build(registry(), self.attached, self.current_name, **parts)

    def host_rows(self) -> list[HostRow]:
        """%tpu_status's rows: every known slice's hosts, and tpunb nodes the registry does not know."""
        return self.view(ask_services=False, snapshots=False).host_rows()

    def status(self) -> pandas.DataFrame:
        """%tpu_status as a pandas DataFrame: one row per host; services, forwards and snapshots in
        ``.attrs``. A bucket that cannot be read is one warning, never a failed status."""
        view = self.view()
        if view.snapshots_error:
            report.warn(f"[tpunb] {view.snapshots_error}")
        return view.frame()

    def services(self, name: str | None = None) -> list[ServiceRow]:
        """The services of slice ``name`` (default: the current one), asked of its hosts, as the
        status view shows them (with the port each answers on): what %tpu_serve lists."""
        sl = self.current(name)
        return StatusView.of_slice(registry(), sl, sl.name == self.current_name).services

    def versions(self) -> pandas.DataFrame:
        """%tpu_status --versions as a pandas DataFrame: Python, jax, jaxlib, libtpu and flax of every
        host of the slices attached to this kernel, one row per host."""
        return versions_frame([row for sl in self.attached.values() for row in sl.version_rows()])

    def last_result(self) -> RunResult | None:
        """The full per-host result of the last cell run on the current slice (uncapped output)."""
        try:
            return self.current().last_result
        except TpunbError:
            return None


#: the kernel's slices: the magics, tpunb's functions, the Jupyter server and the tests share it
MANAGER = SliceManager()
connect = MANAGER.connect
launch = MANAGER.launch
use = MANAGER.use
current = MANAGER.current
detach = MANAGER.detach
down = MANAGER.down
detach_all = MANAGER.detach_all
host_rows = MANAGER.host_rows
status = MANAGER.status
services = MANAGER.services
versions = MANAGER.versions
last_result = MANAGER.last_result
secret = MANAGER.secret


def secret_value(name: str) -> str | None:
    """The value this kernel was given for ``name`` with %tpu_secret or --secret (typed at the
    prompt included), or None; never read from the environment (read that where it applies)."""
    return MANAGER.named.value(name)


fetch_hub.secret_lookup = secret_value  # %tpu_fetch's Hub token may be one given to %tpu_secret or --secret


def attached(name: str) -> Slice | None:
    """The slice of that name if this kernel holds it (never attaches one)."""
    return MANAGER.attached.get(name)


def last_run() -> Run | None:
    """The handle of the last cell run with ``%%on_tpu --bg`` (``sl.run(..., background=True)``)."""
    return MANAGER.last_run


def last_profile() -> Profile | None:
    """The last profile collected in this kernel (any slice)."""
    return MANAGER.last_profile
