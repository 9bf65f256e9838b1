"""A Slice: its hosts' agents started, revived and ended, and what it says of them. It knows
nothing of how its hosts were made: a backend (``tpunb.provision``) hands it transports, what each
host is told at start, and a ``Node`` for whatever outlives the host processes."""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from tpunb import catalog, diagnose, report
from tpunb.display import HostLogs
from tpunb.display.hosts import Layout
from tpunb.engine.background import BackgroundCells, refuse_if_busy
from tpunb.engine.masking import Masker
from tpunb.engine.session import Session
from tpunb.engine.standby import Standbys
from tpunb.errors import HostDiedError, NoSliceError, TransportError, UsageError
from tpunb.host.prepare import STEPS as SETUP_STEPS
from tpunb.metrics import MetricsFeed, MetricsStore
from tpunb.profile import Profile, Profiler
from tpunb.registry import Registry, SliceRecord, tpunb_home
from tpunb.results import RunResult
from tpunb.services import seen
from tpunb.services.serving import ServiceState, Serving
from tpunb.slice.cells import Cells
from tpunb.slice.node import Node
from tpunb.slice.views import HostsView
from tpunb.status.idle_clock import IdleClock
from tpunb.transport.seam import Transport
from tpunb.transport.forkserver import LocalForks
from tpunb.widgets.copy_progress import SetupProgress

if TYPE_CHECKING:
    import pandas

    from tpunb.engine.request import Request


class Slice(HostsView):
    """A slice's hosts and their agents. Make one with tpunb.launch() or tpunb.use(). It is the view
    of all its hosts (``HostsView``: run, push, pull, ...); ``sl[0:2]`` and ``sl.hosts("s1")`` are
    views of some."""

    def __init__(self, record: SliceRecord, transports: list[Transport],
                 host_init: Callable[[int, int], dict], registry: Registry,
                 coordinator_port: Callable[[], int], node: Node | None = None, masker: Masker | None = None,
                 forks: LocalForks | None = None) -> None:
        super().__init__(self)
        self.record = record
        #: the catalog entry; None for hosts brought with %tpu_connect and no --accelerator
        self.accelerator = catalog.lookup(record.accelerator) if record.accelerator else None
        self.registry = registry
        self._host_init = host_init
        self._pick_port = coordinator_port
        self._coordinator_port = 0
        self.session = Session(transports, self._init_for_host, masker=masker, forks=forks)
        self.standbys = Standbys(self.session)  # agents started ahead of a restart (tpunb.engine.standby)
        self.background = BackgroundCells()  # its %%on_tpu --bg cells (tpunb.engine.background)
        self.cells = Cells(self)  # how its cells run (tpunb.slice.cells)
        #: which slice of a multislice each host is in, and how hosts are named ("s1/3")
        self.layout = Layout(len(transports), record.num_slices)
        #: its services (tpunb.services) and its profiler recordings (tpunb.profile), each made from
        #: what it needs of the slice: name, transports or session, host names, hosts' environment
        self.serving = Serving(record.name, transports, self.layout, self._init_for_host, self.session.masker)
        self.profiler = Profiler(record.name, self.session)
        #: seconds between two samples on every host (0: sampling off); see set_metrics_interval
        self.metrics_interval = 1.0
        self.metrics_store = MetricsStore(len(transports))
        self.session.on_metrics = self.metrics_store.add
        self.metrics_feed = MetricsFeed(self.metrics_store, registry, record.name, on_gone=self._deleted_elsewhere)
        self._gone = False  # deleted outside this kernel (the JupyterLab sidebar, another kernel)
        self.cell_logs = HostLogs(tpunb_home() / "logs" / record.name)
        self.last_result: RunResult | None = None
        self.started_at = time.time()
        self.node = node or Node()
        #: activity for the node's idle watchdog (tpunb.status.idle_clock): mirrored here, told to host 0
        self.idle = IdleClock(registry, record.name, self.node.idle_seconds, lambda: self.session.hosts[0],
                              self.node.boot_guard)
        #: called with this slice once it is deleted (the kernel's list of slices forgets it)
        self.on_delete: list[Callable[["Slice"], None]] = []
        self.revive_lock = threading.Lock()  # threads reviving the same dead hosts take turns
        #: port forwards to hosts (tpunb.forwards.port_forward), ended with the slice
        self.forwards: list = []

    @property
    def heartbeat_timeout(self) -> float:
        """Seconds a host may stay silent before it counts as frozen and is ended (0: never);
        default 5, or $TPUNB_HEARTBEAT_TIMEOUT. Hosts beat every second, even while cells run."""
        return self.session.heartbeat_timeout

    @heartbeat_timeout.setter
    def heartbeat_timeout(self, seconds: float) -> None:
        if not seconds >= 0:
            raise UsageError(f"the heartbeat timeout is a number of seconds >= 0, not {seconds}")
        self.session.set_heartbeat_timeout(float(seconds))

    # -- identity -----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.record.name

    @property
    def backend(self) -> str:
        return self.record.backend

    @property
    def num_hosts(self) -> int:
        return len(self.session.hosts)

    @property
    def num_slices(self) -> int:
        """Slices joined in this multislice (1: a single slice)."""
        return self.layout.num_slices

    @property
    def kind(self) -> str:
        """The accelerator type ('2 x v4-16' for a multislice), or 'N hosts' for hosts brought without one."""
        return self.record.kind

    @property
    def launch_line(self) -> str:
        """The %tpu_launch arguments that make a slice like this one."""
        if not self.accelerator:
            return "v4-16"
        return self.accelerator.name + (f" --slices {self.num_slices}" if self.num_slices > 1 else "")

    def __repr__(self) -> str:
        alive = sum(h.alive for h in self.session.hosts)
        return f"<Slice {self.name!r}: {self.kind} on {self.backend}, {alive}/{self.num_hosts} hosts up>"

    # -- lifecycle ----------------------------------------------------------------------------
    def _init_for_host(self, index: int) -> dict:
        return {"metrics": {"interval": self.metrics_interval}, **self._host_init(index, self._coordinator_port),
                **self.node.host_init(index)}

    def connect(self, hosts: list[int] | None = None, ready: dict | None = None, attaching: bool = False) -> None:
        """Start the agents (all hosts, or these; ``ready``: standbys that take some hosts' places);
        a fresh JAX coordinator port for a full start. ``attaching``: a launch or connect, which
        ends with ``mark_used`` once its own checks are done; until then host 0's agent, which armed
        the idle watchdog as busy, holds the node (else its end here is the idle time's start)."""
        if hosts is None or len(hosts) == self.num_hosts:
            self._coordinator_port = self._pick_port()
            self.session.jax_started = False
            hosts = None
        progress = SetupProgress(len(hosts) if hosts else self.num_hosts, SETUP_STEPS, self.layout.names)
        self.session.on_prepare = progress.update
        try:
            self.session.start(hosts, ready)
        finally:
            progress.close()
            self.session.on_prepare = None
        self._record_envs()
        if hosts is None:
            self.warn_version_skew()
            self.warn_python_mismatch()
        self.idle.mark(False, tell_host=not attaching)
        self.metrics_feed.start()
        self.standbys.prepare_ahead()  # a restart's agents, once the slice is quiet (tpunb.engine.standby)

    def mark_used(self) -> None:
        """The user just made or took this slice (a launch, a connect, %tpu_use): the idle time starts
        now, after whatever the launch did once its hosts were up (its checks may take seconds), and
        host 0's agent, busy since it armed the watchdog, is not any more."""
        self.idle.mark(False, tell_host=True)

    def _deleted_elsewhere(self) -> None:
        self._gone = True

    def check_not_deleted(self) -> None:
        """A slice deleted from the sidebar (or by another kernel) says so at its next cell, and
        this kernel forgets it."""
        if not self._gone:
            return
        for listener in self.on_delete:
            listener(self)
        self.close()
        raise NoSliceError(f"slice {self.name!r} was deleted outside this notebook (the JupyterLab sidebar or "
                           f"another kernel's %tpu_down): launch a new one with %tpu_launch {self.launch_line}")

    def revive(self, chosen: list[int] | None = None, mine: "Request | None" = None) -> list[int]:
        """Restart hosts whose agent died; returns the restarted hosts.

        Hosts that joined jax.distributed cannot take a restarted peer back, so when JAX was
        started, every host restarts together. A host that stopped answering while no cell ran
        fails this call once, naming it; the next call restarts it. A host a restart could not
        reach is left to %tpu_restart, and a request for it (``chosen``) fails saying so, as does one
        for hosts another request holds (``Session.holding``: a background cell; ``mine``, the
        caller's own, aside).
        """
        if chosen is not None:
            refuse_if_busy(self, chosen, mine)
        waiting = [i for i in self.needs_restart if chosen is None or i in chosen]
        if waiting:
            many = len(waiting) > 1
            raise HostDiedError(f"host{'s' if many else ''} {self.layout.names(waiting)} could not be reached by "
                                f"%tpu_restart and still need{'' if many else 's'} a restart: %tpu_restart once "
                                f"{'they answer' if many else 'it answers'}, or choose other hosts with --hosts")
        with self.revive_lock:
            try:
                return self._revive()
            except TransportError:
                if not self.session.closed:
                    raise
                raise NoSliceError(f"slice {self.name!r} was deleted while its hosts were restarting: "
                                   f"launch a new one with %tpu_launch {self.launch_line}") from None

    def _revive(self) -> list[int]:
        self.check_not_deleted()
        # a preempted or deleted node: say so, rather than fail to reach its hosts or restart them
        self.node.check(fresh=bool(self.session.dead_hosts()))
        notices = self.session.take_notices()
        if notices:
            said = "; ".join(f"host {i} {why}" for i, why in sorted(notices.items()))
            raise HostDiedError(f"{said}, and {'was' if len(notices) == 1 else 'were'} ended while no cell ran: "
                                f"run the cell again to restart {'it' if len(notices) == 1 else 'them'} "
                                "with a fresh state")
        dead = [i for i in self.session.dead_hosts() if i not in self.needs_restart]
        if not dead:
            return []
        if self.registry.get_slice(self.name) is None:  # its hosts were ended with it, from outside
            self._gone = True
            self.check_not_deleted()
        if self.session.jax_started and self.num_hosts > 1:
            restart = list(range(self.num_hosts))
            why = (f"host {self.layout.names(dead)} had died and JAX's distributed runtime cannot take a restarted "
                   f"peer back, so all hosts {self.layout.names(restart)} were restarted: their state was lost")
            self.connect(None)
        else:
            restart = dead
            many = len(dead) > 1
            why = (f"host{'s' if many else ''} {self.layout.names(dead)} had died and {'were' if many else 'was'} restarted: "
                   f"{'their' if many else 'its'} state was lost")
            self.connect(dead)
        self.save_hosts()
        report.warn(f"[tpunb] {why}")
        return restart

    def publish_hosts(self) -> None:
        """The record follows new host processes: the sidebar ends local hosts by their pids, and
        other processes (``python -m tpunb stacks``) read their stacks through them."""
        for host in self.session.hosts:
            if host.index < len(self.record.hosts):
                info = self.record.hosts[host.index].info
                info.pid, info.stacks = host.info.get("pid"), host.info.get("stacks")
                info.needs_restart = info.needs_restart and not host.alive

    def save_hosts(self) -> None:
        """``publish_hosts``, then the registry, if it still knows the slice."""
        self.publish_hosts()
        if self.registry.get_slice(self.name) is not None:
            self.registry.save_slice(self.record)

    def close(self) -> None:
        """End the host sessions (and the cloud watch); the slice itself stays, for %tpu_use."""
        self.metrics_feed.stop()
        for made in self.forwards:
            made.close()
        self.forwards.clear()
        seen.forget_forwards(self.name)
        self.standbys.close()
        self.session.close()
        self.cell_logs.close()
        self.node.close()

    def delete(self) -> None:
        """End every host process and service and forget the slice. Idempotent."""
        for listener in self.on_delete:
            listener(self)
        self._end_services()
        self.close()
        self.node.delete()  # the registry forgets it only once the node is gone
        self.registry.delete_slice(self.name)

    def sync(self, local_dir: str = ".", remote_dir: str | None = None, exclude: tuple[str, ...] = (),
             progress: Callable[[int, int], None] | None = None):
        """Copy a working directory to every host (incremental, honours .gitignore); a SyncReport.

        Hosts of a local simulated slice share this machine's files, so there is nothing to copy.
        """
        from pathlib import Path

        if not Path(local_dir).expanduser().is_dir():
            raise UsageError(f"{local_dir}: no such directory here; %tpu_sync copies a directory of this machine "
                             "(default: the notebook's)")
        transports = self.session.transports
        if all(t.same_machine for t in transports):
            return None
        from tpunb.transport.sync import sync_tree

        for transport in transports:
            transport.connect()
        target = remote_dir or Path(local_dir).resolve().name
        return sync_tree(transports, local_dir, target, exclude=exclude, progress=progress)

    # -- metrics ------------------------------------------------------------------------------
    def metrics(self, since: Any = None) -> "pandas.DataFrame":
        """Every sample kept so far, one row each: time, host, metric, value, chip, step.

        Host metrics (cpu_percent, process_cpu_percent, memory_used_bytes, memory_total_bytes,
        rss_bytes), per chip (hbm_used_bytes, hbm_total_bytes, duty_cycle_percent where the
        hardware reports them) and whatever cells log with ``tpunb.log(step, name=value)``.
        ``since``: a datetime, epoch seconds, or negative seconds back from now."""
        return self.metrics_store.frame(since)

    def send_environ(self, values: dict[str, str]) -> None:
        """Put these variables in every live host's environment now (secrets: ``%tpu_secret``); hosts
        started later get them from the slice's environment with the rest."""
        for host in self.session.hosts:
            if host.alive:
                host.send({"op": "environ", "values": dict(values)})

    def set_metrics_interval(self, seconds: float) -> None:
        """Sample every ``seconds`` on every host from now on (0 turns sampling off)."""
        if seconds < 0:
            raise UsageError(f"the metrics interval is a number of seconds >= 0, not {seconds}")
        self.metrics_interval = float(seconds)
        for host in self.session.hosts:
            if host.alive:
                host.send({"op": "metrics_interval", "seconds": self.metrics_interval})

    # -- profiles (tpunb.profile; recording starts on hosts: HostsView.profile, profile_start) ------
    def profile_stop(self) -> Profile:
        """Stop the recording ``profile_start`` began: the Profile of everything in between."""
        return self.profiler.stop()

    @property
    def needs_restart(self) -> list[int]:
        """Hosts a restart could not reach: only %tpu_restart starts them again."""
        return [h.index for h in self.record.hosts if h.info.needs_restart]

    # -- status -------------------------------------------------------------------------------
    def versions(self) -> dict[int, dict | None]:
        """Each host's Python, jax, jaxlib, libtpu and flax versions, from its agent's hello (a host
        on this kernel's own Python says so, and has this kernel's)."""
        said = {host.index: host.info.get("versions") for host in self.session.hosts}
        return {i: diagnose.kernel_versions() if v == "kernel" else v for i, v in said.items()}

    def _record_envs(self) -> None:
        """Each host's environment (made or checked at its start) and versions, in the registry:
        %tpu_status --versions and later kernels read them there."""
        for host in self.session.hosts:
            env = host.info.get("env")
            if env and host.index < len(self.record.hosts):
                self.record.hosts[host.index].info.env = {"path": env.get("env"), "python": env.get("python"),
                                                          "versions": env.get("versions") or {}}

    def warn_python_mismatch(self) -> str | None:
        """Said once at connect: hosts on another Python than this kernel's (see diagnose.pythons)."""
        return diagnose.pythons.warn_mismatch(self.session.hosts, self.layout.names)

    def warn_version_skew(self) -> str | None:
        """Warn, in one line, which hosts run other versions than the rest; the line, or None."""
        line = diagnose.skew_line(self.versions(), self.layout.names)
        if line:
            report.warn(line)
        return line

    def version_rows(self) -> list[diagnose.VersionRow]:
        """One row per host for %tpu_status --versions (with the environment tpunb made there)."""
        versions = self.versions()
        rows = diagnose.version_rows(self.name, [
            (h.index, self.record.hosts[h.index].address if h.index < len(self.record.hosts) else h.transport.address,
             versions[h.index]) for h in self.session.hosts])
        for row, host in zip(rows, self.session.hosts):
            row.env = (host.info.get("env") or {}).get("env")
        return rows

    # -- services (tpunb.services) ------------------------------------------------------------------
    def services(self) -> list[ServiceState]:
        """Every service on every host, read from the hosts (a new kernel sees an old one's)."""
        return self.serving.services()

    def logs(self, name: str | None = None, host: int | str | None = None, tail: int | None = None,
             file: str | None = None) -> dict[int, str] | str:
        """Service ``name``'s output (or ``file``) on each host ({host: text}), or on ``host`` alone;
        ``tail``: last lines."""
        return self.serving.logs(name, host, tail, file)

    def stop_service(self, name: str) -> list[int]:
        """Stop service ``name`` (its whole process group) on every host that runs it."""
        return self.serving.stop(name)

    def forward(self, port: int, host: int | str = 0, local_port: int | None = None) -> str:
        """The URL (``http://127.0.0.1:L/``) on this machine that reaches ``port`` on ``host``: a stream
        its transport opens (an SSH channel, a relay over exec), or a local host's own; ended with the slice."""
        from tpunb.forwards import port_forward as forward

        chosen = self.layout.parse(host)
        if len(chosen) != 1:
            raise UsageError(f"host {host!r} picks {len(chosen)} hosts: a forward reaches one (e.g. host=0)")
        made = forward.forward(self.session.transports, chosen[0], port, local_port)
        url = made if isinstance(made, str) else made.url
        if not isinstance(made, str):
            self.forwards.append(made)
        seen.record_forward(self.name, chosen[0], port, url)  # %tpu_status and the sidebar list it
        return url

    def _end_services(self) -> None:
        self.serving.stop_all()
