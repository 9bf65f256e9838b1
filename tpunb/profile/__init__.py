"""%tpu_profile: jax.profiler traces from every host, pulled back over the agent and shown inline.

Each host records into its own folder and summarises its own trace
(``tpunb.host.profiler``); ``stop`` brings the summaries and the files back into
``$TPUNB_HOME/profiles/<slice>/<timestamp>/host-<N>/plugins/profile/<run>/``, the layout xprof and
TensorBoard read, and returns a ``Profile``. A slice holds one ``Profiler``, made from its name
and its session alone (the recording it runs is its state), so this package never imports
``tpunb.slice``.
"""
from __future__ import annotations

import io
import json
import tarfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tpunb.display import format_hosts
from tpunb.errors import TpunbError
from tpunb.profile import summary as tables
from tpunb.registry import tpunb_home

if TYPE_CHECKING:
    from tpunb.engine.session import Session

#: a recording started with %tpu_profile start and never stopped ends by itself after this long
DEFAULT_LIMIT_S = 600.0
#: how long starting may take (the first start imports jax and joins jax.distributed)
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 600.0


class ProfileError(TpunbError):
    """A profile could not start or be collected (no JAX on a host, a recording already running, ...)."""


def profiles_dir(slice_name: str) -> Path:
    return tpunb_home() / "profiles" / slice_name


class Profile:
    """A slice's trace, one folder per host, with tables over the hosts' own summaries."""

    def __init__(self, path: Path, summaries: dict[int, dict], meta: dict, result=None) -> None:
        self.path = Path(path)
        self.summaries = summaries
        self.meta = meta
        self.result = result  # the RunResult of the profiled cell, for %%tpu_profile / Slice.profile
        self._events = None

    # -- what users read ----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.meta.get("name") or self.path.name

    @property
    def hosts(self) -> list[int]:
        """Hosts with a trace."""
        return sorted(self.summaries)

    @property
    def notes(self) -> list[str]:
        notes = list(self.meta.get("notes", []))
        for host, summary in sorted(self.summaries.items()):
            if summary.get("note"):
                notes.append(f"host {host}: {summary['note']}")
            if len(summary["events"]) < summary["total_events"]:
                notes.append(f"host {host}: {summary['total_events']:,} events, the earliest {len(summary['events']):,} "
                             f"are in .events; totals and the files hold all")
        return notes

    @property
    def events(self):
        """One row per trace event: host, name, kind (jit | op | python | other), start_us (from the
        earliest host's start), dur_us, thread, device."""
        if self._events is None:
            self._events = tables.events_frame(self.summaries)
        return self._events

    def top(self, n: int = 10, kinds: tuple[str, ...] | None = tables.KINDS):
        """Jitted functions and XLA ops by total time: ms per host, calls, the slowest host.
        ``kinds=None`` ranks every event name."""
        return tables.top(self.summaries, n, kinds)

    @property
    def steps(self):
        """Step times (ms), one column per host, when a jitted function runs repeatedly on every
        host (``attrs``: function, straggler, median_ms); else None."""
        return tables.steps(self.summaries)

    @property
    def straggler(self) -> int | None:
        """The host the others wait for: the least time in collectives, else the slowest median step."""
        return tables.straggler(self.summaries)[0]

    @property
    def straggler_reason(self) -> str:
        """Why ``straggler`` names that host, in one line ('' when none can be named)."""
        return tables.straggler(self.summaries)[1]

    @property
    def seconds(self) -> float:
        spans = [(s.get("stopped_at") or 0) - (s.get("started_at") or 0) for s in self.summaries.values()]
        return max(spans) if spans else 0.0

    def xprof_command(self) -> str:
        return f"xprof --logdir {self.path} --port 8791"

    def __repr__(self) -> str:
        total = sum(s["total_events"] for s in self.summaries.values())
        return (f"<Profile {self.name!r} of {self.meta.get('slice')!r}: host{'s' if len(self.hosts) != 1 else ''} "
                f"{format_hosts(self.hosts)}, {total:,} events, {self.path}>")

    def _repr_html_(self) -> str:
        from tpunb.profile.view import render

        return render(self)

    # -- files ------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path, reparse: bool = False) -> "Profile":
        """A saved profile; ``reparse`` reads the xplane files again (needs jax here)."""
        path = Path(path)
        meta = json.loads((path / "profile.json").read_text()) if (path / "profile.json").exists() else {}
        summaries = {}
        for folder in sorted(path.glob("host-*")):
            host = int(folder.name.split("-", 1)[1])
            if reparse:
                from tpunb.host.profiler import summarize

                found = sorted(folder.glob("plugins/profile/*/*.xplane.pb"))
                if found:
                    summaries[host] = summarize(str(found[-1]))
            elif (folder / "summary.json").exists():
                summaries[host] = json.loads((folder / "summary.json").read_text())
        return cls(path, summaries, meta)


def past_profiles(slice_name: str) -> list[Path]:
    folder = profiles_dir(slice_name)
    return sorted(p for p in folder.iterdir() if p.is_dir()) if folder.exists() else []


# -- recording ----------------------------------------------------------------------------------
class Profiler:
    """A slice's recordings: begun on some hosts (``start``), collected from them (``stop``),
    or both around a wait (``capture``, from any thread); one at a time. Made from the slice's
    name and session; ``on_collected`` hears of every profile it collects."""

    def __init__(self, slice_name: str, session: Session,
                 on_collected: Callable[["Profile"], None] | None = None) -> None:
        self.slice_name, self.session, self.on_collected = slice_name, session, on_collected
        #: the recording %tpu_profile start began (hosts, started, limit, name, python_tracer), or None
        self.recording: dict | None = None
        #: the last profile collected on this slice
        self.last: Profile | None = None
        self._lock = threading.Lock()

    def start(self, indices: list[int], python_tracer: bool = False, limit: float | None = DEFAULT_LIMIT_S,
              name: str | None = None) -> None:
        """Begin recording on these hosts; a host without JAX fails with one line naming it."""
        with self._lock:
            if self.recording is not None:
                raise ProfileError(f"a recording already runs on {self.slice_name!r} (since %tpu_profile start): "
                                   "%tpu_profile stop first")
            self.recording = {"hosts": indices, "started": time.time(), "limit": limit, "name": name,
                              "python_tracer": python_tracer}
        call = self.session.call
        try:
            request = {"op": "profile_start", "python_tracer": python_tracer, "limit": limit}
            replies = call(indices, request, timeout=START_TIMEOUT_S)
            busy = [i for i, (r, _) in replies.items() if r.get("busy")]
            if busy:  # left over from a stop that never finished (a second Ctrl-C): discard it, start again
                call(busy, {"op": "profile_stop", "cap": 1}, timeout=STOP_TIMEOUT_S)
                replies.update(call(busy, request, timeout=START_TIMEOUT_S))
            failed = {i: r for i, (r, _) in replies.items() if r.get("status") != "ok"}
            if failed:
                started = [i for i in indices if i not in failed]
                if started:
                    call(started, {"op": "profile_stop", "cap": 1}, timeout=STOP_TIMEOUT_S)
                no_jax = {i: r for i, r in failed.items() if r.get("no_jax")}
                if no_jax:
                    host, reply = sorted(no_jax.items())[0]
                    raise ProfileError(f"host{'s' if len(no_jax) > 1 else ''} {format_hosts(no_jax)} cannot profile: "
                                       f"{reply['error']}; %tpu_profile records with jax.profiler, so install jax there")
                raise ProfileError("profiling did not start: " + "; ".join(f"host {i}: {r.get('error')}"
                                                                           for i, r in sorted(failed.items())))
        except BaseException:
            self.recording = None
            raise

    def stop(self, result=None, notes: list[str] | None = None, cap: int | None = None) -> Profile:
        """Stop the recording on every host it runs on, bring the files and summaries here, remember it."""
        with self._lock:
            rec, self.recording = self.recording, None
        if rec is None:
            raise ProfileError(f"no recording runs on {self.slice_name!r}: %tpu_profile start, or %%tpu_profile a cell")
        stamp = time.strftime("%Y-%m-%dT%H-%M-%S", time.localtime(rec["started"]))
        folder = profiles_dir(self.slice_name) / stamp
        n = 1
        while folder.exists():
            n += 1
            folder = profiles_dir(self.slice_name) / f"{stamp}-{n}"
        message: dict[str, Any] = {"op": "profile_stop"}
        if cap:
            message["cap"] = cap
        alive = [i for i in rec["hosts"] if self.session.hosts[i].alive]
        replies = self.session.call(alive, message, timeout=STOP_TIMEOUT_S) if alive else {}
        summaries, errors = {}, [f"host {i} died: its trace is lost" for i in rec["hosts"] if i not in alive]
        for host, (reply, blob) in sorted(replies.items()):
            if reply.get("status") != "ok":
                errors.append(f"host {host}: {reply.get('error')}")
                continue
            target = folder / f"host-{host}"
            unpack(blob, target, rec.get("name"))
            (target / "summary.json").write_text(json.dumps(reply["summary"]))
            summaries[host] = reply["summary"]
        meta = {"slice": self.slice_name, "name": rec.get("name") or "", "hosts": rec["hosts"], "started": rec["started"],
                "notes": (notes or []) + errors}
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "profile.json").write_text(json.dumps(meta))
        profile = self.last = Profile(folder, summaries, meta, result)
        if self.on_collected is not None:
            self.on_collected(profile)
        if not summaries:
            raise ProfileError("no host sent a trace: " + "; ".join(errors))
        return profile

    def capture(self, seconds: float, indices: list[int], python_tracer: bool = False,
                name: str | None = None) -> Profile:
        """Record ``seconds`` on these hosts, from any thread, while a cell runs or not."""
        if not seconds or seconds <= 0:
            raise ProfileError(f"capture takes a positive number of seconds, not {seconds}")
        self.start(indices, python_tracer=python_tracer, limit=None, name=name)
        try:
            threading.Event().wait(seconds)  # the capture's length, what the user asked for
        finally:
            profile = self.stop(notes=[f"captured {seconds:g} s"])
        return profile

    def describe(self) -> str:
        """What %tpu_profile alone prints: is a recording running, and the slice's past profiles."""
        lines = []
        rec, name = self.recording, self.slice_name
        if rec:
            ran = time.time() - rec["started"]
            hosts = f"host{'s' if len(rec['hosts']) > 1 else ''} {format_hosts(rec['hosts'])}"
            if rec.get("limit") and ran > rec["limit"]:
                lines.append(f"a recording on {name!r}, {hosts}, ended by itself after {rec['limit']:g} s (its limit): "
                             "%tpu_profile stop collects it")
            else:
                limit = f", ends by itself after {rec['limit']:g} s" if rec.get("limit") else ""
                lines.append(f"recording on {name!r}, {hosts}, for {ran:.0f} s{limit}: %tpu_profile stop collects it")
        else:
            lines.append(f"no recording runs on {name!r}: %tpu_profile start, or %%tpu_profile a cell")
        past = past_profiles(name)
        if past:
            lines.append(f"past profiles ({profiles_dir(name)}):")
            for folder in past[-20:]:
                meta = {}
                if (folder / "profile.json").exists():
                    meta = json.loads((folder / "profile.json").read_text())
                label = f" {meta['name']}" if meta.get("name") else ""
                hosts = format_hosts(meta.get("hosts", [])) if meta.get("hosts") else "?"
                lines.append(f"  {folder.name}{label} (hosts {hosts})")
            if len(past) > 20:
                lines.append(f"  ... and {len(past) - 20} older")
        return "\n".join(lines)


def unpack(blob: bytes, target: Path, run_name: str | None) -> None:
    """A host's gzip tar into target (plugins/profile/<run>/...), the run renamed to ``run_name``."""
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        try:
            tar.extractall(target, filter="data")
        except TypeError:  # a Python without extraction filters: allow only plain files under target
            members = [m for m in tar.getmembers() if (m.isfile() or m.isdir()) and not m.name.startswith("/")
                       and ".." not in Path(m.name).parts]
            tar.extractall(target, members=members)
    if run_name:
        runs = [p for p in (target / "plugins" / "profile").iterdir() if p.is_dir()]
        if len(runs) == 1 and runs[0].name != run_name:
            runs[0].rename(runs[0].parent / run_name)
