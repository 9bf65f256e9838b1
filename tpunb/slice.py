"""Slice: a set of hosts with a persistent agent on each; what magics, widgets and users call.

A Slice knows nothing of how its hosts were made: a backend (``tpunb.provision``) hands it
transports, what each host is told at start, and a ``Node`` for whatever outlives the host
processes (a Cloud TPU node: its state, its cost, its deletion).
"""
from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from tpunb import catalog, diagnose, report, stuck
from tpunb.display import (CellOutput, HostLogs, LogOnly, MODES, OutputSink, kernel_cell_number,
                           kernel_colors)
from tpunb.errors import CellInterrupted, HostDiedError, NoSliceError, TransportError, UsageError
from tpunb.engine.background import BackgroundCells, busy_error, refuse_if_busy
from tpunb.engine.cell import Cell
from tpunb.stuck.laggards import Laggards
from tpunb.engine.standby import Standbys
from tpunb.display.hosts import Layout
from tpunb.display.output import show_between_cells
from tpunb.metrics import MetricsFeed, MetricsStore
from tpunb.profile import Profile, Profiler, ProfileError
from tpunb.registry import Registry, SliceRecord, tpunb_home
from tpunb.results import RunResult
from tpunb.serve import seen
from tpunb.serve.services import ServiceState, Serving
from tpunb.engine.masking import Masker
from tpunb.engine.session import Session
from tpunb.status.idle_clock import IdleClock
from tpunb.transport.base import Transport
from tpunb.transport.forkserver import LocalForks
from tpunb.host.prepare import STEPS as SETUP_STEPS
from tpunb.widgets.progress import SetupProgress

if TYPE_CHECKING:
    import numpy
    import pandas

    from tpunb.engine.request import Request
    from tpunb.fetch.spread import FetchReport



class Node:
    """What a slice is beyond its host processes. Hosts brought over SSH and local host
    processes have nothing more (this base); a Cloud TPU node overrides every method."""

    #: seconds without activity after which a watchdog on host 0 deletes the node (0: never)
    idle_seconds = 0.0
    #: host 0 runs a boot watchdog that deletes the node unless a kernel says its launch is done
    boot_guard = False

    def host_init(self, index: int) -> dict:
        """What host ``index``'s agent is told at start beyond the backend's settings."""
        return {}

    def check(self, fresh: bool = False) -> None:
        """Before a cell: raise a one-line ProvisionError if the hosts are gone for good;
        ``fresh``: ask now, not from the last look (hosts died: was their machine deleted?)."""

    def explain_deaths(self) -> str | None:
        """Hosts vanished mid-cell: the outside reason (preempted, ...), or None."""
        return None

    def status(self) -> dict:
        """Extra status columns (cloud_state, health, usd_per_hour, uptime_s)."""
        return {}

    def close(self) -> None:
        """Stop watching (the kernel detaches); the node itself stays."""

    def delete(self) -> None:
        """Delete what outlives the host processes and wait until it is gone; idempotent."""


class Slice:
    """A slice's hosts and their agents. Make one with tpunb.launch() or tpunb.use()."""

    def __init__(self, record: SliceRecord, transports: list[Transport],
                 host_init: Callable[[int, int], dict], registry: Registry,
                 coordinator_port: Callable[[], int], node: Node | None = None, masker: Masker | None = None,
                 forks: LocalForks | None = None) -> None:
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
        #: which slice of a multislice each host is in, and how hosts are named ("s1/3")
        self.layout = Layout(len(transports), record.num_slices)
        #: its services (tpunb.serve) and its profiler recordings (tpunb.profile), each made from
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
        self._revive_lock = threading.Lock()  # threads reviving the same dead hosts take turns
        #: port forwards to hosts (tpunb.serve.forward), ended with the slice
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

    def _check_not_deleted(self) -> None:
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
        with self._revive_lock:
            try:
                return self._revive()
            except TransportError:
                if not self.session.closed:
                    raise
                raise NoSliceError(f"slice {self.name!r} was deleted while its hosts were restarting: "
                                   f"launch a new one with %tpu_launch {self.launch_line}") from None

    def _revive(self) -> list[int]:
        self._check_not_deleted()
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
            self._check_not_deleted()
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

    # -- cells --------------------------------------------------------------------------------
    def run(self, code: str, hosts: str | list[int] | None = None, timeout: float | None = None,
            output: str | None = "grouped", sink: OutputSink | None = None, background: bool = False,
            queue: bool = False):
        """Run ``code`` on the hosts at once; live output as ``output`` says; per-host results.

        Errors on hosts are in the result (``result.raise_for_status()`` raises them); only a
        kernel interrupt raises here, after every host was interrupted. ``background``: return at
        once with a ``tpunb.engine.background.Run`` while the output still streams; ``queue``: wait
        for a background cell that holds these hosts instead of refusing.
        """
        if output is not None and output not in MODES:
            raise UsageError(f"output must be one of {', '.join(MODES)}, not {output!r}")
        indices = self.layout.parse(hosts)
        if len(indices) < self.num_hosts and self.num_hosts > 1 and (self.session.jax_started or "jax" in code):
            some = (f"{self.layout.names(indices)} ({len(indices)} of {self.num_hosts})" if self.layout.multislice
                    else f"{self.layout.names(indices)} of {self.num_hosts}")
            report.warn(f"[tpunb] warning: running on host{'s' if len(indices) > 1 else ''} {some}: JAX collectives "
                        "(jit over the whole slice, psum, ...) would hang waiting for the other hosts")
        if background:
            return self.background.start(self, code, indices, timeout, output, queue)
        return self.execute(code, indices, timeout, output, sink, shell=False, queue=queue)

    def prepare_cell(self, code: str, indices: list[int], timeout: float | None, output: str | None,
                     sink: OutputSink | None = None, shell: bool = False) -> Cell:
        """A cell's request, made (numbered as the notebook's cell, coloured as its tracebacks) and
        not sent: ``hold`` takes its hosts, ``execute`` runs it."""
        if timeout is not None and not (0 < timeout < math.inf):
            raise UsageError(f"timeout must be a positive number of seconds, not {timeout}")
        if sink is None:
            sink = (CellOutput(indices, self.num_hosts, output, self.cell_logs, names=self.layout.names) if output
                    else LogOnly(self.cell_logs))
        self.session.colors = kernel_colors()  # hosts colour tracebacks as this kernel does
        where: dict[int, str] = {}  # hosts that would not stop: where they were (tpunb.stuck)
        request = self.session.cell(code, indices, timeout, sink, shell=shell, count=kernel_cell_number(),
                                    on_stuck=lambda r, hosts: stuck.show_stuck(self, hosts, r.sink, where),
                                    on_tick=Laggards(self) if len(indices) > 1 else None)
        return Cell(request, sink, where)

    def hold(self, cell: Cell, queue: bool = False, given_up: Callable[[], bool] | None = None) -> bool:
        """Take the cell's hosts (``Session.holding`` counts it from now on): refused in one line
        naming what holds them, or with ``queue`` once they are free; False if ``given_up()`` first."""
        held = self.session.requests.claim(cell.request, queue, given_up)
        if held and not queue:
            raise busy_error(self, held[0])
        return not held

    def execute(self, code: str, indices: list[int], timeout: float | None, output: str | None,
                sink: OutputSink | None, shell: bool, queue: bool = False, cell: Cell | None = None) -> RunResult:
        """What cells and shell commands share: take the hosts (``hold``; ``queue``: wait for them),
        revive them, stream output, turn an interrupt into one error. ``cell``: prepared already, its
        hosts held (a background cell)."""
        if cell is None:
            cell = self.prepare_cell(code, indices, timeout, output, sink, shell)
            self.hold(cell, queue)
        try:
            return self._run_cell(code, indices, timeout, shell, cell)
        finally:
            cell.request.release()

    def _run_cell(self, code: str, indices: list[int], timeout: float | None, shell: bool, cell: Cell) -> RunResult:
        request, sink, where = cell.request, cell.sink, cell.where
        self.revive(indices, mine=request)
        show_between_cells(self.session.backlog, self.cell_logs, self.layout.name)
        self._say_jax_failures()
        self.cell_logs.begin_cell(indices, "$ " + code if shell else code)
        self.idle.mark(True, tell_host=True)
        try:
            results = stuck.with_where(request.run(), where)
        except CellInterrupted as exc:
            sink.finish()
            self._say_jax_failures()
            result = self.last_result = RunResult(stuck.with_where(exc.results, where), names=self.layout.names)
            stopped = result.hosts_with("interrupted")
            message = (f"interrupted on host{'s' if len(stopped) != 1 else ''} {self.layout.names(stopped)}; "
                       f"{'their' if len(stopped) != 1 else 'its'} state is kept"
                       if stopped else "interrupted")
            raise CellInterrupted("; ".join([message] + [n for n in result.notes() if "stopped cleanly" not in n]),
                                  result) from None
        finally:
            self.idle.mark(False, tell_host=True)
        sink.finish()
        self._say_jax_failures()
        self.last_result = RunResult(results, timeout, names=self.layout.names)
        if self.last_result.hosts_with("died"):
            note = self.node.explain_deaths()  # e.g. the cloud says the node was preempted
            if note:
                self.last_result.extra_notes.append(note)
        return self.last_result

    def _say_jax_failures(self) -> None:
        """Hosts that failed to join JAX when another host started it (no cell of theirs shows it)."""
        for host, error in sorted(self.session.take_jax_failures().items()):
            name = self.layout.name(host)
            reason = (error.strip().splitlines() or ["no reason given"])[0][:300]
            report.warn(f"[tpunb] host {name} could not start JAX when another host did ({reason}): JAX collectives "
                        f"over the slice will wait for it; fix the cause, then run exit() on it (%%on_tpu --hosts "
                        f"{name}) to restart the slice's hosts")

    def run_shell(self, command: str, hosts: str | list[int] | None = None, timeout: float | None = None,
                  output: str | None = "grouped") -> RunResult:
        """Run a shell command on the hosts at once (with their environment); exit code per host."""
        if not command.strip():
            raise UsageError("give a shell command, e.g. %tpu_run nproc")
        return self.execute(command, self.layout.parse(hosts), timeout, output, None, shell=True)

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
        if not all(t.has_sftp for t in transports):
            return None
        from tpunb.transport.sync import sync_tree

        for transport in transports:
            transport.connect()
        target = remote_dir or Path(local_dir).resolve().name
        return sync_tree(transports, local_dir, target, exclude=exclude, progress=progress)

    def reset(self, hosts: str | list[int] | None = None) -> dict[int, dict]:
        """Empty every chosen host's namespace and put its environment and working directory back
        as its session started, without a restart (JAX, once started, stays: imported modules are
        kept). {host: what the host found}: ``environ``, the variables that had changed, and
        ``folders``, what lies in tpunb's folders on a remote host (~/.tpunb, the host dir)."""
        indices = self.layout.parse(hosts)
        self.revive(indices)
        remote = [i for i in indices if not self.session.transports[i].same_machine]  # local: the kernel's own files
        local = [i for i in indices if i not in remote]
        replies = self.session.call(local, {"op": "reset"}) if local else {}
        if remote:
            replies.update(self.session.call(remote, {"op": "reset", "folders": {"~/.tpunb": True, "$TPUNB_HOST_DIR": False}}))
        return {i: {"environ": reply.get("environ", []), "folders": reply.get("folders", {})}
                for i, (reply, _) in replies.items()}

    # -- data ---------------------------------------------------------------------------------
    def push(self, values: dict[str, Any], hosts: str | list[int] | None = None) -> None:
        """Set these names to these values in every chosen host's namespace."""
        if not isinstance(values, dict) or not all(isinstance(k, str) and k.isidentifier() for k in values):
            raise UsageError("push takes a dict of {name: value} with valid Python names")
        indices = self.layout.parse(hosts)
        self.revive(indices)
        diagnose.pythons.refuse_code(self.session.hosts, self.layout.names, values, indices)  # one line before anything is sent
        self.idle.mark(False, tell_host=True)
        self.session.push(values, indices)

    def pull(self, name: str, hosts: str | list[int] | None = None) -> dict[int, Any]:
        """{host: value of ``name``} from every chosen host."""
        indices = self.layout.parse(hosts)
        self.revive(indices)
        self.idle.mark(False, tell_host=True)
        replies = self.session.pull([name], indices)
        return {host: values[name] for host, values in replies.items()}

    def gather(self, name: str, hosts: str | list[int] | None = None) -> "numpy.ndarray":
        """A global jax.Array ``name`` as one numpy array: each host sends only the shards it
        owns (a replicated shard once, from its lowest host), assembled here by index."""
        if not isinstance(name, str) or not name.isidentifier():
            raise UsageError(f"gather takes a variable name, e.g. sl.gather('x'), not {name!r}")
        from tpunb.engine.gather import assemble

        indices = self.layout.parse(hosts)
        self.revive(indices)
        self.idle.mark(False, tell_host=True)
        return assemble(name, self.session.gather(name, indices))

    def fetch(self, source: str, to: str | None = None, include: tuple[str, ...] | list[str] = (),
              revision: str | None = None, hosts: str | list[int] | None = None,
              exclude: tuple[str, ...] | list[str] = ()) -> FetchReport:
        """Put SOURCE's files (``hf://ORG/NAME``, ``hf://datasets/ORG/NAME``, ``gs://BUCKET/PREFIX``
        or ``https://...``) on every chosen host, each byte from the source once per slice
        (``tpunb.fetch.spread``): at ``to`` (as ``hf download --local-dir`` leaves it), or, for a Hub
        repository without it, in each host's Hugging Face cache. A FetchReport."""
        from tpunb.fetch.manifest import manifest, wanted
        from tpunb.fetch.spread import fetch

        found, to = wanted(source, to, include, revision, exclude)
        indices = self.layout.parse(hosts)
        listed = manifest(found)
        self.revive()  # not only these hosts': a background cell may hold them, the fetch runs beside it
        with self.idle.busy():
            return fetch(self.session, listed, to, indices, self.layout.names)

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

    # -- profiles (tpunb.profile) --------------------------------------------------------------
    def profile(self, code: str, hosts: str | list[int] | None = None, name: str | None = None,
                python_tracer: bool = False, timeout: float | None = None, output: str | None = "grouped") -> Profile:
        """Run ``code`` as ``run`` does with jax.profiler recording on each host: a Profile (the
        cell's RunResult is its ``.result``). The profiler stops whatever the cell does (raise, be
        interrupted) on every host."""
        self.revive()
        self.profiler.start(self.layout.parse(hosts), python_tracer=python_tracer, limit=None, name=name)
        try:
            result = self.run(code, hosts=hosts, timeout=timeout, output=output)
        except BaseException:  # interrupted: stop everywhere all the same, and let the interrupt speak
            try:
                self.profiler.stop(self.last_result)
            except Exception as exc:
                report.warn(f"[tpunb] the profile of the interrupted cell was not collected: {exc}")
            raise
        try:
            return self.profiler.stop(result)
        except ProfileError:
            result.raise_for_status()  # hosts died: the cell's own error says more
            raise

    def profile_start(self, hosts: str | list[int] | None = None, python_tracer: bool = False,
                      limit: float | None = 600.0, name: str | None = None) -> None:
        """Begin recording on the hosts; cells run as usual until ``profile_stop``, or ``limit`` seconds."""
        self.revive()
        self.profiler.start(self.layout.parse(hosts), python_tracer, limit, name)

    def profile_stop(self) -> Profile:
        """Stop the recording ``profile_start`` began: the Profile of everything in between."""
        return self.profiler.stop()

    def capture(self, seconds: float, hosts: str | list[int] | None = None, python_tracer: bool = False,
                name: str | None = None) -> Profile:
        """Record ``seconds`` on the hosts, callable from another thread while a cell runs: a Profile."""
        return self.profiler.capture(seconds, self.layout.parse(hosts), python_tracer, name)

    # -- stuck runs (tpunb.stuck) ----------------------------------------------------------------
    def stacks(self, hosts: str | list[int] | None = None, native: bool = False) -> stuck.Stacks:
        """Every host's Python stacks, all threads, grouped by identical stacks; read from a signal
        handler, so it works while a host is blocked in C and while a cell runs. ``native``: C/C++
        frames too, through py-spy on the hosts."""
        return stuck.slice_stacks(self, hosts, native)

    def restart(self, hosts: str | list[int] | None = None, jax: bool = True):
        """Fresh Python sessions on the hosts (default all) of this same slice, the way back from a
        wedged runtime: agents that do not exit are killed; the node, connections and services stay;
        JAX starts again over the whole slice if it ran (``jax=False``: not, the chips left free for
        another program). A ``tpunb.stuck.restart.Restart``."""
        from tpunb.stuck.restart import restart

        with self._revive_lock:
            self._check_not_deleted()
            return restart(self, hosts, jax)

    def compile_cache_stats(self, hosts: str | list[int] | None = None) -> dict[int, dict]:
        """Each host's compile-cache hits, misses and compiles that asked the cache in its current
        Python session, as JAX's monitoring events (``/jax/compilation_cache/cache_hits``...) count them."""
        from tpunb.fetch.jaxcache import stats

        return stats(self.session, self.layout.parse(hosts))

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

    # -- services (tpunb.serve) ------------------------------------------------------------------
    def serve(self, name: str, command: str, hosts: str | list[int] | None = None, restart: str = "no",
              env: dict[str, str] | None = None, wait_port: int | None = None, wait_http: str | None = None,
              timeout: float = 120.0, max_restarts: int = 5, port: int | None = None) -> list[ServiceState]:
        """Run shell ``command`` as service ``name`` on the hosts (default: all), detached from cells
        and this kernel; ``restart="on-failure"`` restarts it (``max_restarts`` times, backing off).
        ``wait_port``/``wait_http`` ('PORT/PATH') return once it answers on every host; ``port`` (else the
        wait's) is recorded as where it answers (``bench_serving`` reaches it). One ServiceState per
        host; ``env`` values reach the command only, never a file or output."""
        self.revive()
        with self.idle.busy():  # starting is use (its SSH start may outlast a short idle limit); then its supervisor
            return self.serving.serve(name, command, hosts, restart, env, wait_port, wait_http, timeout, max_restarts,
                                      port=port)

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
        """The URL (``http://127.0.0.1:L/``) on this machine that reaches ``port`` on ``host``: over
        the slice's SSH connection, or a local host's own address; ended with the slice."""
        from tpunb.serve import forward

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
