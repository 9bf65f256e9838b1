"""Some hosts of a slice, with every verb that works on hosts, as ipyparallel's DirectView is a set
of engines with execute, push and pull: ``sl[0:2]``, ``sl[3]`` and ``sl.hosts("s1")`` are views, and
a Slice is the view of all its hosts. A verb's ``hosts=`` picks among the view's hosts by their
names in the slice. Which hosts a call works on, their revival and the idle clock are decided here
once (``_chosen``, ``_used``). Calls block and return results; ``run(..., block=False)`` returns
at once with the ``Run`` (a Future) that background cells return."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpunb import diagnose, report, stuck
from tpunb.display import MODES, OutputSink
from tpunb.errors import UsageError
from tpunb.profile import Profile, ProfileError
from tpunb.results import RunResult
from tpunb.services.serving import ServiceState

if TYPE_CHECKING:
    import numpy

    from tpunb.fetch.spread import FetchReport

Hosts = str | int | list[int] | None


class HostsView:
    """Hosts of one slice (all of them for the Slice itself) and the verbs that work on them."""

    def __init__(self, sl: Any, indices: list[int] | None = None) -> None:
        self._slice = sl  # the Slice these hosts belong to (itself, for the Slice)
        self._indices = indices  # None: every host of the slice

    @property
    def targets(self) -> list[int]:
        """The hosts of this view, as the slice numbers them."""
        return list(range(self._slice.num_hosts)) if self._indices is None else list(self._indices)

    def __getitem__(self, key: int | slice) -> "HostsView":
        """``sl[3]``, ``sl[0:2]``, ``sl[-1]``: a view of these hosts (positions in this view)."""
        targets = self.targets
        try:
            chosen = [targets[key]] if isinstance(key, int) else targets[key]
        except (IndexError, TypeError):
            raise UsageError(f"hosts [{key!r}]: this view has {len(targets)} host{'s' if len(targets) > 1 else ''}; "
                             "take one (sl[0]) or a range (sl[0:2])") from None
        if not chosen:
            raise UsageError(f"hosts [{key!r}] picks no host of the {len(targets)} in this view")
        return HostsView(self._slice, sorted(chosen))

    __iter__ = None  # a view is not a sequence of hosts: iterating it is a TypeError, not host after host

    def hosts(self, spec: Hosts) -> "HostsView":
        """A view of the hosts ``spec`` names, as ``--hosts`` does: '0,2', '1:3', 's1', 's1/0'."""
        return HostsView(self._slice, self._chosen(spec))

    def __repr__(self) -> str:
        return f"<tpunb hosts {self._slice.layout.names(self.targets)} of slice {self._slice.name!r}>"

    # -- the prologue, written once ----------------------------------------------------------------
    def _chosen(self, hosts: Hosts) -> list[int]:
        """The hosts a call works on: ``hosts`` (named as in the slice) if given, else the view's."""
        if hosts is None:
            return self.targets
        chosen = self._slice.layout.parse(hosts)
        outside = sorted(set(chosen) - set(self.targets))
        if outside:
            raise UsageError(f"hosts {self._slice.layout.names(outside)} are not in this view of hosts "
                             f"{self._slice.layout.names(self.targets)}: pick among them, or use the slice")
        return chosen

    def _used(self, hosts: Hosts) -> list[int]:
        """``_chosen``, revived (dead agents restarted, a busy host refused), and the slice in use."""
        indices = self._chosen(hosts)
        self._slice.revive(indices)
        self._slice.idle.mark(False, tell_host=True)
        return indices

    # -- cells ----------------------------------------------------------------------------------
    def run(self, code: str, hosts: Hosts = None, timeout: float | None = None, output: str | None = "grouped",
            sink: OutputSink | None = None, block: bool = True, queue: bool = False, background: bool = False):
        """Run ``code`` on the hosts at once; live output as ``output`` says; per-host results.

        Errors on hosts are in the result (``result.raise_for_status()`` raises them); only a
        kernel interrupt raises here, after every host was interrupted. ``block=False`` (or
        ``background=True``): return at once with a ``tpunb.engine.background.Run`` (a Future of
        the result) while the output still streams; ``queue``: wait for a background cell that
        holds these hosts instead of refusing.
        """
        if output is not None and output not in MODES:
            raise UsageError(f"output must be one of {', '.join(MODES)}, not {output!r}")
        sl = self._slice
        indices = self._chosen(hosts)
        if len(indices) < sl.num_hosts and sl.num_hosts > 1 and (sl.session.jax_started or "jax" in code):
            some = (f"{sl.layout.names(indices)} ({len(indices)} of {sl.num_hosts})" if sl.layout.multislice
                    else f"{sl.layout.names(indices)} of {sl.num_hosts}")
            report.warn(f"[tpunb] warning: running on host{'s' if len(indices) > 1 else ''} {some}: JAX collectives "
                        "(jit over the whole slice, psum, ...) would hang waiting for the other hosts")
        if background or not block:
            return sl.background.start(sl, code, indices, timeout, output, queue)
        return sl.cells.execute(code, indices, timeout, output, sink, shell=False, queue=queue)

    def run_shell(self, command: str, hosts: Hosts = None, timeout: float | None = None,
                  output: str | None = "grouped") -> RunResult:
        """Run a shell command on the hosts at once (with their environment); exit code per host."""
        if not command.strip():
            raise UsageError("give a shell command, e.g. %tpu_run nproc")
        return self._slice.cells.execute(command, self._chosen(hosts), timeout, output, None, shell=True)

    def reset(self, hosts: Hosts = None) -> dict[int, dict]:
        """Empty every chosen host's namespace and put its environment and working directory back
        as its session started, without a restart (JAX, once started, stays: imported modules are
        kept). {host: what the host found}: ``environ``, the variables that had changed, and
        ``folders``, what lies in tpunb's folders on a remote host (~/.tpunb, the host dir)."""
        session = self._slice.session
        indices = self._chosen(hosts)
        self._slice.revive(indices)
        remote = [i for i in indices if not session.transports[i].same_machine]  # local: the kernel's own files
        local = [i for i in indices if i not in remote]
        replies = session.call(local, {"op": "reset"}) if local else {}
        if remote:
            replies.update(session.call(remote, {"op": "reset", "folders": {"~/.tpunb": True, "$TPUNB_HOST_DIR": False}}))
        return {i: {"environ": reply.get("environ", []), "folders": reply.get("folders", {})}
                for i, (reply, _) in replies.items()}

    # -- data -----------------------------------------------------------------------------------
    def push(self, values: dict[str, Any], hosts: Hosts = None) -> None:
        """Set these names to these values in every chosen host's namespace."""
        if not isinstance(values, dict) or not all(isinstance(k, str) and k.isidentifier() for k in values):
            raise UsageError("push takes a dict of {name: value} with valid Python names")
        sl = self._slice
        indices = self._chosen(hosts)
        sl.revive(indices)
        diagnose.pythons.refuse_code(sl.session.hosts, sl.layout.names, values, indices)  # one line before anything is sent
        sl.idle.mark(False, tell_host=True)
        sl.session.push(values, indices)

    def pull(self, name: str, hosts: Hosts = None) -> dict[int, Any]:
        """{host: value of ``name``} from every chosen host."""
        replies = self._slice.session.pull([name], self._used(hosts))
        return {host: values[name] for host, values in replies.items()}

    def gather(self, name: str, hosts: Hosts = None) -> "numpy.ndarray":
        """A global jax.Array ``name`` as one numpy array: each host sends only the shards it
        owns (a replicated shard once, from its lowest host), assembled here by index."""
        if not isinstance(name, str) or not name.isidentifier():
            raise UsageError(f"gather takes a variable name, e.g. sl.gather('x'), not {name!r}")
        from tpunb.engine.gather import assemble

        return assemble(name, self._slice.session.gather(name, self._used(hosts)))

    def fetch(self, source: str, to: str | None = None, include: tuple[str, ...] | list[str] = (),
              revision: str | None = None, hosts: Hosts = None, exclude: tuple[str, ...] | list[str] = ()) -> "FetchReport":
        """Put SOURCE's files (``hf://ORG/NAME``, ``hf://datasets/ORG/NAME``, ``gs://BUCKET/PREFIX``
        or ``https://...``) on every chosen host, each byte from the source once per slice
        (``tpunb.fetch.spread``): at ``to`` (as ``hf download --local-dir`` leaves it), or, for a Hub
        repository without it, in each host's Hugging Face cache. A FetchReport."""
        from tpunb.fetch.manifest import manifest, wanted
        from tpunb.fetch.spread import fetch

        sl = self._slice
        found, to = wanted(source, to, include, revision, exclude)
        indices = self._chosen(hosts)
        listed = manifest(found)
        sl.revive()  # not only these hosts': a background cell may hold them, the fetch runs beside it
        with sl.idle.busy():
            return fetch(sl.session, listed, to, indices, sl.layout.names)

    # -- profiles (tpunb.profile) ---------------------------------------------------------------
    def profile(self, code: str, hosts: Hosts = None, name: str | None = None, python_tracer: bool = False,
                timeout: float | None = None, output: str | None = "grouped") -> Profile:
        """Run ``code`` as ``run`` does with jax.profiler recording on each host: a Profile (the
        cell's RunResult is its ``.result``). The profiler stops whatever the cell does (raise, be
        interrupted) on every host."""
        sl = self._slice
        sl.revive()
        indices = self._chosen(hosts)
        sl.profiler.start(indices, python_tracer=python_tracer, limit=None, name=name)
        try:
            result = self.run(code, hosts=indices, timeout=timeout, output=output)
        except BaseException:  # interrupted: stop everywhere all the same, and let the interrupt speak
            try:
                sl.profiler.stop(sl.last_result)
            except Exception as exc:
                report.warn(f"[tpunb] the profile of the interrupted cell was not collected: {exc}")
            raise
        try:
            return sl.profiler.stop(result)
        except ProfileError:
            result.raise_for_status()  # hosts died: the cell's own error says more
            raise

    def profile_start(self, hosts: Hosts = None, python_tracer: bool = False, limit: float | None = 600.0,
                      name: str | None = None) -> None:
        """Begin recording on the hosts; cells run as usual until ``profile_stop``, or ``limit`` seconds."""
        self._slice.revive()
        self._slice.profiler.start(self._chosen(hosts), python_tracer, limit, name)

    def capture(self, seconds: float, hosts: Hosts = None, python_tracer: bool = False,
                name: str | None = None) -> Profile:
        """Record ``seconds`` on the hosts, callable from another thread while a cell runs: a Profile."""
        return self._slice.profiler.capture(seconds, self._chosen(hosts), python_tracer, name)

    # -- stuck runs (tpunb.stuck) ---------------------------------------------------------------
    def stacks(self, hosts: Hosts = None, native: bool = False) -> stuck.Stacks:
        """Every host's Python stacks, all threads, grouped by identical stacks; read from a signal
        handler, so it works while a host is blocked in C and while a cell runs. ``native``: C/C++
        frames too, through py-spy on the hosts."""
        return stuck.slice_stacks(self._slice, self._chosen(hosts), native)

    def restart(self, hosts: Hosts = None, jax: bool = True):
        """Fresh Python sessions on the hosts (default all) of this same slice, the way back from a
        wedged runtime: agents that do not exit are killed; the node, connections and services stay;
        JAX starts again over the whole slice if it ran (``jax=False``: not, the chips left free for
        another program). A ``tpunb.stuck.restart.Restart``."""
        from tpunb.stuck.restart import restart

        sl = self._slice
        with sl.revive_lock:
            sl.check_not_deleted()
            return restart(sl, self._chosen(hosts), jax)

    def compile_cache_stats(self, hosts: Hosts = None) -> dict[int, dict]:
        """Each host's compile-cache hits, misses and compiles that asked the cache in its current
        Python session, as JAX's monitoring events (``/jax/compilation_cache/cache_hits``...) count them."""
        from tpunb.fetch.jaxcache import stats

        return stats(self._slice.session, self._chosen(hosts))

    # -- services (tpunb.services) -----------------------------------------------------------------
    def serve(self, name: str, command: str, hosts: Hosts = None, restart: str = "no",
              env: dict[str, str] | None = None, wait_port: int | None = None, wait_http: str | None = None,
              timeout: float = 120.0, max_restarts: int = 5, port: int | None = None) -> list[ServiceState]:
        """Run shell ``command`` as service ``name`` on the hosts (default: all), detached from cells
        and this kernel; ``restart="on-failure"`` restarts it (``max_restarts`` times, backing off).
        ``wait_port``/``wait_http`` ('PORT/PATH') return once it answers on every host; ``port`` (else the
        wait's) is recorded as where it answers (``bench_serving`` reaches it). One ServiceState per
        host; ``env`` values reach the command only, never a file or output."""
        sl = self._slice
        sl.revive()
        indices = self._chosen(hosts)
        with sl.idle.busy():  # starting is use (its SSH start may outlast a short idle limit); then its supervisor
            return sl.serving.serve(name, command, indices, restart, env, wait_port, wait_http, timeout, max_restarts,
                                    port=port)

