"""The kernel's slices, held by one ``SliceManager``: which are attached here and which is current,
their --env values (memory only, never the registry), the last profile; launch, connect, use,
down and status as users call them. The magics, ``tpunb``'s functions, the Jupyter server and the
tests share ``MANAGER``; the module's functions are its methods.

Backends make and remove hosts (``tpunb.provision``); a Slice runs cells on them. What only some
backends can do (recover a lost slice, delete an orphaned node) is asked of them through
``provision.supports``: this module never names a backend.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from typing import TYPE_CHECKING, Any

from tpunb import catalog, colab, provision, report
from tpunb.engine.background import interrupt_all
from tpunb.engine.masking import Masker
from tpunb.fetch import hub as fetch_hub
from tpunb.errors import CellInterrupted, NoSliceError, TpunbError, UsageError
from tpunb.provision import LaunchRequest, Made, interrupts, warm
from tpunb.registry import Registry
from tpunb.results import RunResult
from tpunb.secrets import hub_token, policy
from tpunb.secrets.store import Secrets
from tpunb.slice import Slice
from tpunb.status import HostRow, ServiceRow, versions_frame
from tpunb.overview import StatusView
from tpunb.transport.forkserver import LocalForks

if TYPE_CHECKING:
    import pandas

    from tpunb.engine.background import Run
    from tpunb.profile import Profile

BACKENDS = provision.LAUNCH_BACKENDS
#: the Hugging Face Hub's token: launched slices (cloud and local) get it as a secret when it is set
HF_TOKEN = hub_token.HF_TOKEN
#: generations whose slices cannot be joined into a multislice (docs/cloud-facts.md)
NO_MULTISLICE = ("v2", "v3")


def registry() -> Registry:
    return Registry()


def parse_env(pairs: list[str] | dict | None, secrets: list[str] | None = None) -> dict[str, str]:
    """['KEY=VALUE', ...] -> dict, for settings that may be shown (never stored); a name that looks
    secret is masked with a hint (``tpunb.secrets.policy``). ``secrets``: names whose values come
    from this kernel (%tpu_secret, its environment, Colab's secrets or a prompt), masked."""
    env = {}
    if isinstance(pairs, dict):
        env = {str(k): str(v) for k, v in pairs.items()}
    for pair in [] if isinstance(pairs, dict) else pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"--env takes KEY=VALUE, got {key or pair!r}")
        env[key] = value
    policy.guard(env, MANAGER.masker)
    env.update({name: MANAGER.named.get(name, MANAGER.masker, "--secret") for name in secrets or []})
    return env


def _unset_env_note(name: str, env_keys: list[str], values: dict[str, str], what: str) -> None:
    missing = [k for k in env_keys if k not in values]
    if missing:
        report.warn(f"[tpunb] --env values are never stored, so {', '.join(missing)} are not set on the hosts "
                    f"now: {what}")


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


def _name_own_tpu(sl: Slice) -> catalog.Accelerator:
    """This machine's TPU as JAX on its chips names it (device kind and count), recorded."""
    import ast

    result = sl.run(colab.DEVICE_PROBE, output=None)
    result.raise_for_status()
    kind, devices = ast.literal_eval(result.reprs[0])
    named = colab.accelerator_from_devices(kind, int(devices))
    sl.record.accelerator, sl.accelerator = named.name, named
    sl.run(f"import os\nos.environ['TPUNB_ACCELERATOR'] = {named.name!r}", output=None).raise_for_status()
    sl.registry.save_slice(sl.record)
    return named


def _compile_cache(place: str | None) -> str | None:
    """``--compile-cache``: a Cloud Storage place, gs://BUCKET/PATH, or a one-line UsageError."""
    if place is None:
        return None
    if not re.fullmatch(r"gs://[a-z0-9][-_.a-z0-9]{1,220}[a-z0-9](/\S*)?", str(place)):
        raise UsageError(f"--compile-cache {place}: give a Cloud Storage place, gs://BUCKET/PATH (each host "
                         "already keeps a cache on its own disk; only one in Cloud Storage outlives the slice)")
    return str(place).rstrip("/")


def _with_cache(made: Made, cache: str | None) -> Made:
    """The launch's shared compile cache, in its record's spec: every start of its hosts (the
    launch, restarts, %tpu_use from another kernel, --recover) points JAX there."""
    if cache:
        made.record.spec["compile_cache"] = cache
    return made


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

    # -- names ------------------------------------------------------------------------------------
    def _taken(self, name: str, reg: Registry) -> bool:
        """In use: attached here, or recorded (a local slice whose kernel is gone may be reused)."""
        record = reg.get_slice(name)
        return name in self.attached or (record is not None and not provision.backend(record.backend).name_reusable(record))

    def _claim_name(self, name: str | None, base: str, reg: Registry) -> str:
        """The name a new slice gets: the one asked for if free (else a one-line error), or base, base-2, ..."""
        if name is None:
            candidate, n = base, 1
            while self._taken(candidate, reg):
                n += 1
                candidate = f"{base}-{n}"
            return candidate
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
            raise UsageError(f"slice name {name!r}: use lowercase letters, digits and '-', starting with a letter "
                             "(as Cloud TPU node names)")
        if self._taken(name, reg):
            raise UsageError(f"a slice named {name!r} exists: attach with %tpu_use {name}, or %tpu_down {name} first")
        return name

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
        maker = provision.backend(provision.BRING_YOUR_OWN)
        name = self._claim_name(name, maker.default_name(None), reg)
        if accept_new_host_key:
            for host, spec_port in places:
                forget_host_key(host, spec_port, reg)
        values = parse_env(env, secrets)
        if not isinstance(python, str):
            python = ",".join(python)
        if coordinator_port is not None and not 0 < int(coordinator_port) < 65536:
            raise UsageError(f"--coordinator-port {coordinator_port}: give a TCP port, 1-65535 (8476 passes GCP's TPU firewall rule)")
        opts = maker.options(hosts=addresses, user=user, key=str(key) if key else None, python=python, cwd=cwd,
                             connect_timeout=connect_timeout, coordinator_port=coordinator_port, setup=setup,
                             jax=jax, pip=pip, requirements=requirements)
        request = LaunchRequest(name, catalog.lookup(accelerator) if accelerator else None, reg, values, opts, count)
        with _interrupt_says_one_line(name, reg):
            since = time.perf_counter()
            return self.start(maker.create(request), reg, values, since)

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
        cache = _compile_cache(compile_cache)
        env = parse_env(env, secrets)
        with interrupts.latched():  # a Ctrl-C that Python drops (in a gc callback) still stops the launch
            return self._launch(accelerator, name, env, backend, slices, recover, options, cache, hf_token)

    def _launch(self, accelerator: str | None, name: str | None, env: Any, backend: str | None, slices: Any,
                recover: str | None, options: dict, cache: str | None = None, hf_token: bool = True) -> Slice:
        count = _slice_count(slices)
        if recover:
            if slices is not None:
                raise UsageError("--recover relaunches the recorded number of slices: give no --slices with it")
            return self._recover(recover, env, cache)
        if not accelerator:
            raise UsageError("name an accelerator, e.g. v4-16, or --recover NAME")
        if accelerator == colab.OWN_TPU:  # this machine's own TPU chips, e.g. a Colab TPU runtime
            if count > 1:
                raise UsageError(f"%tpu_launch {colab.OWN_TPU} is this machine's own TPU, one slice: give no --slices "
                                 "(a simulated multislice: %tpu_launch v4-16 --slices 2 --backend local)")
            return self._launch_own_tpu(name, env, backend, options, cache)
        accel = catalog.lookup(accelerator)
        if count > 1 and accel.generation in NO_MULTISLICE:
            raise UsageError(f"--slices {count}: {accel.generation} has no multislice (Cloud TPU joins slices over "
                             f"the data-centre network from v4 on): launch one {accel.name}, or a v4, v5e, v5p or v6e "
                             "type")
        backend = backend or provision.default_backend(options.get("project"))
        if backend not in BACKENDS:
            raise UsageError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)} "
                             "(hosts you bring: %tpu_connect HOST,HOST)")
        maker = provision.backend(backend)
        opts = maker.options(**options)
        values = hub_token.with_token(dict(env), self.masker, hf_token)
        reg = registry()
        base = maker.default_name(accel) + (f"-x{count}" if count > 1 else "")
        name = self._claim_name(name, base, reg)
        with _interrupt_says_one_line(name, reg):
            warm.ready("ipywidgets", "tpunb.widgets.launch")  # imported on a side thread, where Ctrl-C cannot cut it
            since = time.perf_counter()
            made = _with_cache(maker.create(LaunchRequest(name, accel, reg, values, opts, count)), cache)
            made.record.spec["hf_token"] = hf_token
            sl = self.start(made, reg, values, since)
        if hub_token.HF_TOKEN in values and hub_token.HF_TOKEN not in env and hub_token.HF_TOKEN not in self.secrets:
            hub_token.say_given(sl.name)
        return sl

    def _launch_own_tpu(self, name: str | None, env: Any, backend: str | None, options: dict,
                        cache: str | None) -> Slice:
        """``%tpu_launch local``: a one-host slice whose host process runs on this machine's own TPU."""
        if backend not in (None, provision.THIS_MACHINE) or options:
            raise UsageError(f"%tpu_launch {colab.OWN_TPU} runs on this machine's own TPU and takes only --name and "
                             "--env; for Cloud TPU name an accelerator, e.g. %tpu_launch v5litepod-8 --backend gcp")
        accel = colab.own_accelerator()
        colab.check_tpu_free()
        values = dict(env)
        reg = registry()
        name = self._claim_name(name, colab.OWN_TPU, reg)
        maker = provision.backend(provision.THIS_MACHINE)
        request = LaunchRequest(name, accel, reg, values, maker.options(own_tpu=True))
        sl = self.start(_with_cache(maker.create(request), cache), reg, values)
        if accel is None:  # JAX on the chips says what they are (it starts there now, as a first cell would)
            try:
                named = _name_own_tpu(sl)
            except BaseException:
                self.down(sl.name)
                raise
            report.info(f"this machine's TPU is a {named.name} ({named.chips} chip{'s' if named.chips > 1 else ''}, "
                        "from jax.devices() on it)")
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
        recovered = self.start(_with_cache(maker.create(request), cache), reg, values)
        _unset_env_note(name, env_keys, values, "pass them again with --env when recovering")
        return recovered

    def start(self, made: Made, reg: Registry, values: dict[str, str], since: float | None = None,
               quiet: bool = False) -> Slice:
        """Every slice starts the same way, whichever backend made it: a Slice of what it made, every
        host's agent started, the backend's last checks, and only then recorded as running (owned by
        this kernel, its hosts' pids published for other processes). A failure or Ctrl-C on the way
        closes the hosts and lets the backend undo what it made (``Made.failed``). ``since``: when the
        launch began (its ready line counts from then)."""
        started = time.perf_counter() if since is None else since
        record = made.record
        values.update(self.secrets)  # the backend's host_init reads this same dict: hosts start with them
        sl = Slice(record, made.transports, made.host_init, reg, coordinator_port=made.coordinator_port, node=made.node,
                   masker=self.masker, forks=self.forks)
        try:
            sl.connect(attaching=True)  # _attach ends it with mark_used
            if made.check is not None:
                made.check(sl)
            record.owner_pid, record.state = os.getpid(), "running"
            sl.publish_hosts()  # pids and stack dumps, for readers in other processes (the sidebar's server)
            reg.save_slice(record)
        except BaseException as exc:
            sl.close()
            if made.failed is not None:
                made.failed(exc)
            raise
        if made.ready is not None:
            made.ready()
        elif not quiet:
            report.info(f"Slice {sl.name!r} ready in {time.perf_counter() - started:.1f} s: run cells on it with %%on_tpu")
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
        nothing (``tpunb.secrets.store``). Their values are masked (``****``) in everything hosts
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
        self.last_run = run
        self._stop_button_interrupts_background()

    def _stop_button_interrupts_background(self) -> None:
        """In a Jupyter kernel, SIGINT while no cell runs is ignored; from the first background cell
        on, it interrupts every held slice's background cells instead (while a cell runs,
        ipykernel's own handler is in place and interrupts that cell). Outside a kernel (a terminal,
        where Ctrl-C belongs to the prompt) nothing changes: use the handle's interrupt()."""
        if self.stop_button is not None:
            return
        try:
            from IPython import get_ipython
        except ImportError:
            return
        kernel = getattr(get_ipython(), "kernel", None)
        # ipykernel puts its own handler in place while it runs a cell and restores the one it saved
        # (SIG_IGN) after: ours is what it restores from now on
        if getattr(kernel, "saved_sigint_handler", None) is signal.SIG_IGN:
            kernel.saved_sigint_handler = self.stop_button = self.interrupt_background

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
            known = [r.name for r in reg.list_slices()]
            hint = f"known slices: {', '.join(known)}" if known else "launch one with %tpu_launch v4-16"
            raise NoSliceError(f"no slice named {name!r}: {hint}")
        values = self.env.get(name, {})
        if record.backend in BACKENDS:  # a new kernel: the token as the launch gave it
            values = hub_token.with_token(values, self.masker, record.spec.get("hf_token", True))
        backend = provision.backend(record.backend)
        sl = self.start(backend.attach(record, reg, values), reg, values, quiet=True)
        report.warn(f"[tpunb] started {len(record.hosts)} new host session{'s' if len(record.hosts) > 1 else ''} for "
                    f"{name!r}: the previous ones ended with their kernel, so their state was lost")
        _unset_env_note(name, record.spec.get("env_keys", []), values,
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
        if all:
            names = sorted(set(self.attached) | {r.name for r in reg.list_slices()})
        elif name:
            names = [name]
        elif self.current_name:
            names = [self.current_name]
        else:
            return []
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
        else:
            record = reg.get_slice(name)
            if record is not None:
                provision.backend(record.backend).delete(record)  # before the registry forgets it
                reg.delete_slice(name)
            elif not any(made.delete_orphan(name, reg) for made in provision.supporting("orphans")):
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
    def view(self) -> StatusView:
        """Every known slice (live where this kernel holds it) and the orphaned cloud nodes: the
        one status model %tpu_status, the server's JSON and the sidebar show."""
        return StatusView.build(registry(), self.attached, self.current_name)

    def host_rows(self) -> list[HostRow]:
        """%tpu_status's rows: every known slice's hosts, and tpunb nodes the registry does not know."""
        return StatusView.build(registry(), self.attached, self.current_name, ask_services=False,
                                snapshots=False).host_rows()

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
