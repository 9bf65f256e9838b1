"""Slice: a set of hosts with a persistent agent on each; what magics, widgets and users call.

A Slice knows nothing of how its hosts were made: a backend (``tpunb.provision``) hands it
transports, what each host is told at start, and a ``Node`` for whatever outlives the host
processes (a Cloud TPU node: its state, its cost, its deletion).
"""
from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Callable

from tpunb import catalog, report
from tpunb.display import CellOutput, HostLogs, MODES, format_hosts, kernel_cell_number, kernel_colors
from tpunb.errors import CellInterrupted, NoSliceError, UsageError
from tpunb.metrics import MetricsFeed, MetricsStore
from tpunb.registry import Registry, SliceRecord, tpunb_home
from tpunb.results import RunResult
from tpunb.session import OutputSink, Session
from tpunb.status import HostRow
from tpunb.transport.base import Transport

if TYPE_CHECKING:
    import pandas


class Node:
    """What a slice is beyond its host processes. Hosts brought over SSH and local host
    processes have nothing more (this base); a Cloud TPU node overrides every method."""

    def check(self) -> None:
        """Before a cell: raise a one-line ProvisionError if the hosts are gone for good."""

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


def parse_hosts(spec: str | int | list[int] | None, num_hosts: int) -> list[int]:
    """'all', '0', '0,2', '1:3' (Python slice: hosts 1 and 2), '-1', or a list -> host indices."""
    if spec is None or (isinstance(spec, str) and spec.strip() in ("", "all")):
        return list(range(num_hosts))
    every = list(range(num_hosts))
    hosts: list[int] = []
    parts = [spec] if isinstance(spec, int) else (spec if isinstance(spec, (list, tuple)) else str(spec).split(","))
    try:
        for part in parts:
            part = str(part).strip()
            if ":" in part:
                bits = [int(b) if b.strip() else None for b in part.split(":")]
                if len(bits) > 3:
                    raise ValueError(part)
                chosen = every[slice(*bits)]
                if not chosen:
                    raise UsageError(f"--hosts {spec}: {part} selects no host (this slice has hosts 0-{num_hosts - 1})")
                hosts.extend(chosen)
            else:
                index = int(part)
                if not -num_hosts <= index < num_hosts:
                    raise UsageError(f"--hosts {spec}: host {index} does not exist (this slice has hosts 0-{num_hosts - 1})")
                hosts.append(every[index])
    except ValueError:
        raise UsageError(f"--hosts {spec}: use all, 0, 0,2 or 1:3") from None
    return sorted(set(hosts))


class Slice:
    """A slice's hosts and their agents. Make one with tpunb.launch() or tpunb.use()."""

    def __init__(self, record: SliceRecord, transports: list[Transport],
                 host_init: Callable[[int, int], dict], registry: Registry,
                 coordinator_port: Callable[[], int], node: Node | None = None) -> None:
        self.record = record
        #: the catalog entry; None for hosts brought with %tpu_connect and no --accelerator
        self.accelerator = catalog.lookup(record.accelerator) if record.accelerator else None
        self.registry = registry
        self._host_init = host_init
        self._pick_port = coordinator_port
        self._coordinator_port = 0
        self.session = Session(transports, self._init_for_host)
        #: seconds between two samples on every host (0: sampling off); see set_metrics_interval
        self.metrics_interval = 1.0
        self.metrics_store = MetricsStore(len(transports))
        self.session.on_metrics = self.metrics_store.add
        self.metrics_feed = MetricsFeed(self.metrics_store, registry, record.name, on_gone=self._deleted_elsewhere)
        self._gone = False  # deleted outside this kernel (the JupyterLab sidebar, another kernel)
        self.logs = HostLogs(tpunb_home() / "logs" / record.name)
        self.last_result: RunResult | None = None
        self.started_at = time.time()
        self.node = node or Node()
        #: called with this slice once it is deleted (the kernel's list of slices forgets it)
        self.on_delete: list[Callable[["Slice"], None]] = []

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
    def kind(self) -> str:
        """The accelerator type, or 'N hosts' for hosts brought without one."""
        return self.accelerator.name if self.accelerator else f"{self.num_hosts} hosts"

    def __repr__(self) -> str:
        alive = sum(h.alive for h in self.session.hosts)
        return f"<Slice {self.name!r}: {self.kind} on {self.backend}, {alive}/{self.num_hosts} hosts up>"

    # -- lifecycle ----------------------------------------------------------------------------
    def _init_for_host(self, index: int) -> dict:
        return {"metrics": {"interval": self.metrics_interval}, **self._host_init(index, self._coordinator_port)}

    def connect(self, hosts: list[int] | None = None) -> None:
        """Start the agents (all hosts, or these); a fresh JAX coordinator port for a full start."""
        if hosts is None or len(hosts) == self.num_hosts:
            self._coordinator_port = self._pick_port()
            self.session.jax_started = False
            hosts = None
        self.session.start(hosts)
        self.metrics_feed.start()

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
                           f"another kernel's %tpu_down): launch a new one with %tpu_launch {self.kind}")

    def revive(self) -> list[int]:
        """Restart hosts whose agent died; returns the restarted hosts.

        Hosts that joined jax.distributed cannot take a restarted peer back, so when JAX was
        started, every host restarts together.
        """
        self._check_not_deleted()
        self.node.check()  # a preempted node: say so, rather than fail to reach its hosts
        dead = self.session.dead_hosts()
        if not dead:
            return []
        if self.registry.get_slice(self.name) is None:  # its hosts were ended with it, from outside
            self._gone = True
            self._check_not_deleted()
        if self.session.jax_started and self.num_hosts > 1:
            restart = list(range(self.num_hosts))
            why = (f"host {format_hosts(dead)} had died and JAX's distributed runtime cannot take a restarted "
                   f"peer back, so all hosts {format_hosts(restart)} were restarted: their state was lost")
            self.connect(None)
        else:
            restart = dead
            why = f"host{'s' if len(dead) > 1 else ''} {format_hosts(dead)} had died and was restarted: its state was lost"
            self.connect(dead)
        for host in self.session.hosts:  # new processes: the registry's pids follow (the sidebar ends hosts by them)
            if host.index < len(self.record.hosts):
                self.record.hosts[host.index].info["pid"] = host.info.get("pid")
        if self.registry.get_slice(self.name) is not None:
            self.registry.save_slice(self.record)
        report.warn(f"[tpunb] {why}")
        return restart

    def close(self) -> None:
        """End the host sessions (and the cloud watch); the slice itself stays, for %tpu_use."""
        self.metrics_feed.stop()
        self.session.close()
        self.logs.close()
        self.node.close()

    def delete(self) -> None:
        """End every host process and forget the slice. Idempotent."""
        for listener in self.on_delete:
            listener(self)
        self.close()
        self.node.delete()  # the registry forgets it only once the node is gone
        self.registry.delete_slice(self.name)

    # -- cells --------------------------------------------------------------------------------
    def run(self, code: str, hosts: str | list[int] | None = None, timeout: float | None = None,
            output: str | None = "grouped", sink: OutputSink | None = None) -> RunResult:
        """Run ``code`` on the hosts at once; live output as ``output`` says; per-host results.

        Errors on hosts are in the result (``result.raise_for_status()`` raises them); only a
        kernel interrupt raises here, after every host was interrupted.
        """
        if output is not None and output not in MODES:
            raise UsageError(f"output must be one of {', '.join(MODES)}, not {output!r}")
        indices = parse_hosts(hosts, self.num_hosts)
        if len(indices) < self.num_hosts and self.num_hosts > 1 and (self.session.jax_started or "jax" in code):
            report.warn(f"[tpunb] warning: running on host{'s' if len(indices) > 1 else ''} {format_hosts(indices)} "
                        f"of {self.num_hosts}: JAX collectives (jit over the whole slice, psum, ...) would hang "
                        "waiting for the other hosts")
        return self._execute(code, indices, timeout, output, sink, shell=False)

    def _execute(self, code: str, indices: list[int], timeout: float | None, output: str | None,
                 sink: OutputSink | None, shell: bool) -> RunResult:
        """What cells and shell commands share: revive hosts, stream output, turn an interrupt into one error."""
        if timeout is not None and timeout <= 0:
            raise UsageError(f"timeout must be a positive number of seconds, not {timeout}")
        self.revive()
        self._show_backlog()
        if sink is None:
            sink = CellOutput(indices, self.num_hosts, output, self.logs) if output else _LogOnly(self.logs)
        self.logs.begin_cell(indices, "$ " + code if shell else code)
        self.session.colors = kernel_colors()  # hosts colour tracebacks as this kernel does
        try:
            results = self.session.execute(code, indices, timeout, sink, shell=shell, count=kernel_cell_number())
        except CellInterrupted as exc:
            sink.finish()
            result = self.last_result = RunResult(exc.results)
            stopped = result.hosts_with("interrupted")
            message = (f"interrupted on host{'s' if len(stopped) != 1 else ''} {format_hosts(stopped)}; their state is kept"
                       if stopped else "interrupted")
            raise CellInterrupted("; ".join([message] + [n for n in result.notes() if "stopped cleanly" not in n]),
                                  result) from None
        sink.finish()
        self.last_result = RunResult(results, timeout)
        if self.last_result.hosts_with("died"):
            note = self.node.explain_deaths()  # e.g. the cloud says the node was preempted
            if note:
                self.last_result.extra_notes.append(note)
        return self.last_result

    def _show_backlog(self) -> None:
        """Output hosts wrote between cells (background threads): shown, labelled, before the next cell."""
        while not self.session.backlog.empty():
            host, message, _ = self.session.backlog.get_nowait()
            if message.get("op") == "stream":
                self.logs.write(host, message["text"])
                stream = sys.stderr if message.get("name") == "stderr" else sys.stdout
                for line in message["text"].splitlines():
                    stream.write(f"[{host}, between cells] {line}\n")

    def run_shell(self, command: str, hosts: str | list[int] | None = None, timeout: float | None = None,
                  output: str | None = "grouped") -> RunResult:
        """Run a shell command on the hosts at once (with their environment); exit code per host."""
        if not command.strip():
            raise UsageError("give a shell command, e.g. %tpu_run nproc")
        return self._execute(command, parse_hosts(hosts, self.num_hosts), timeout, output, None, shell=True)

    def sync(self, local_dir: str = ".", remote_dir: str | None = None, exclude: tuple[str, ...] = (),
             progress: Callable[[int, int], None] | None = None):
        """Copy a working directory to every host (incremental, honours .gitignore); a SyncReport.

        Hosts of a local simulated slice share this machine's files, so there is nothing to copy.
        """
        from pathlib import Path

        transports = self.session.transports
        if not all(hasattr(t, "sftp") for t in transports):
            return None
        from tpunb.transport.sync import sync_tree

        for transport in transports:
            transport.connect()
        target = remote_dir or Path(local_dir).resolve().name
        return sync_tree(transports, local_dir, target, exclude=exclude, progress=progress)

    # -- data ---------------------------------------------------------------------------------
    def push(self, values: dict[str, Any], hosts: str | list[int] | None = None) -> None:
        """Set these names to these values in every chosen host's namespace."""
        if not isinstance(values, dict) or not all(isinstance(k, str) and k.isidentifier() for k in values):
            raise UsageError("push takes a dict of {name: value} with valid Python names")
        self.revive()
        self.session.push(values, parse_hosts(hosts, self.num_hosts))

    def pull(self, name: str, hosts: str | list[int] | None = None) -> dict[int, Any]:
        """{host: value of ``name``} from every chosen host."""
        self.revive()
        replies = self.session.pull([name], parse_hosts(hosts, self.num_hosts))
        return {host: values[name] for host, values in replies.items()}

    # -- metrics ------------------------------------------------------------------------------
    def metrics(self, since: Any = None) -> "pandas.DataFrame":
        """Every sample kept so far, one row each: time, host, metric, value, chip, step.

        Host metrics (cpu_percent, process_cpu_percent, memory_used_bytes, memory_total_bytes,
        rss_bytes), per chip (hbm_used_bytes, hbm_total_bytes, duty_cycle_percent where the
        hardware reports them) and whatever cells log with ``tpunb.log(step, name=value)``.
        ``since``: a datetime, epoch seconds, or negative seconds back from now."""
        return self.metrics_store.frame(since)

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
                python_tracer: bool = False, timeout: float | None = None, output: str | None = "grouped"):
        """Run ``code`` as ``run`` does with jax.profiler recording on each host: a Profile (the
        cell's RunResult is its ``.result``). The profiler stops whatever the cell does."""
        from tpunb import profile

        return profile.profile_cell(self, code, parse_hosts(hosts, self.num_hosts), hosts, name, python_tracer,
                                    timeout, output)

    def profile_start(self, hosts: str | list[int] | None = None, python_tracer: bool = False,
                      limit: float | None = 600.0, name: str | None = None) -> None:
        """Begin recording on the hosts; cells run as usual until ``profile_stop``, or ``limit`` seconds."""
        from tpunb import profile

        self.revive()
        profile.start(self, parse_hosts(hosts, self.num_hosts), python_tracer, limit, name)

    def profile_stop(self):
        """Stop the recording ``profile_start`` began: the Profile of everything in between."""
        from tpunb import profile

        return profile.stop(self)

    def capture(self, seconds: float, hosts: str | list[int] | None = None, python_tracer: bool = False,
                name: str | None = None):
        """Record ``seconds`` on the hosts, callable from another thread while a cell runs: a Profile."""
        from tpunb import profile

        return profile.capture(self, seconds, parse_hosts(hosts, self.num_hosts), python_tracer, name)

    # -- status -------------------------------------------------------------------------------
    def status_rows(self, current: bool = False) -> list[HostRow]:
        """One row per host, live: what %tpu_status, widgets and the server show."""
        rows = []
        node = self.node.status()
        for host in self.session.hosts:
            record = self.record.hosts[host.index] if host.index < len(self.record.hosts) else None
            uptime = round(time.time() - host.started_at, 1) if host.alive and host.started_at else None
            latest = self.metrics_store.latest_value
            rows.append(HostRow(
                slice=self.name, current=current, accelerator=self.kind, backend=self.backend, host=host.index,
                address=record.address if record else host.transport.address,
                state="running" if host.alive else "dead", pid=host.info.get("pid"), runner=host.info.get("runner"),
                cpu_percent=latest(host.index, "cpu_percent"), rss_bytes=latest(host.index, "rss_bytes"),
                memory_used_bytes=latest(host.index, "memory_used_bytes"),
                hbm_used_bytes=latest(host.index, "hbm_used_bytes"),
                **{"uptime_s": uptime, **node}))
        return rows


class _LogOnly(OutputSink):
    def __init__(self, logs: HostLogs) -> None:
        self.logs = logs

    def stream(self, host: int, name: str, text: str) -> None:
        self.logs.write(host, text)

    def finish(self) -> None:
        self.logs.flush()


