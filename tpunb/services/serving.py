"""Services of a slice as the kernel sees them: start (and wait until ready), list, logs, stop.

A slice holds one ``Serving``, made from what it needs and nothing more: the slice's name, its
transports (services are reached with a control process of their own, never through the agent),
how hosts are named, and each host's environment. Every call reads the hosts afresh (their state
files), so a kernel that attached a slice with ``%tpu_use`` sees the services an earlier kernel
started.
"""
from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Callable, Iterator

from tpunb import report
from tpunb.engine.masking import Masker
from tpunb.errors import ServiceError, UsageError
from tpunb.services import seen
from tpunb.services.control import DEADLINE as CONTROL_DEADLINE
from tpunb.services.control import ask_hosts, follow_hosts, may_have_services
from tpunb.services.seen import ServiceState

if TYPE_CHECKING:
    from tpunb.display.hosts import Layout
    from tpunb.registry import SliceRecord
    from tpunb.transport.seam import Transport

RESTART = ("no", "on-failure")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
#: log lines shown under a readiness failure
TAIL = 20


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise UsageError(f"a service name is letters, digits, '.', '_' or '-' (e.g. web), not {name!r}")


def _parse_wait(wait_port: int | None, wait_http: str | None) -> tuple[int | None, str | None]:
    """``wait_http`` is 'PORT/PATH' (e.g. '8000/health'), or a '/PATH' on ``wait_port``."""
    if wait_http is None:
        return wait_port, None
    match = re.fullmatch(r"(?:https?://[^/:]+)?:?(\d+)?(/\S*)?", wait_http)
    if not match or not (match.group(1) or wait_port):
        raise UsageError(f"--wait-http takes PORT/PATH (e.g. 8000/health), not {wait_http!r}")
    return int(match.group(1) or wait_port), match.group(2) or "/"


class Serving:
    """A slice's services: ``name``, its ``transports``, its host ``layout`` (names, --hosts
    parsing) and ``environment(host)``, what each host is told at start (its env and cwd)."""

    def __init__(self, name: str, transports: list[Transport], layout: Layout,
                 environment: Callable[[int], dict], masker: Masker | None = None) -> None:
        self.name, self.transports, self.layout, self.environment = name, transports, layout, environment
        self.masker = masker or Masker()  # the kernel's secrets: masked in every log read back

    def serve(self, name: str, command: str, hosts=None, restart: str = "no", env: dict | None = None,
              wait_port: int | None = None, wait_http: str | None = None, timeout: float = 120.0,
              max_restarts: int = 5, backoff: float = 1.0, port: int | None = None) -> list[ServiceState]:
        """Start ``command`` as service ``name`` on the hosts; with a wait, return once it answers on each.
        Its ``port`` (else the wait's) is recorded with it, for %tpu_bench NAME."""
        _check_name(name)
        if not isinstance(command, str) or not command.strip():
            raise UsageError("give the service a shell command, e.g. %tpu_serve web -- python3 -m http.server 8000")
        if restart not in RESTART:
            raise UsageError(f"restart is one of {', '.join(RESTART)}, not {restart!r}")
        if not timeout > 0:
            raise UsageError(f"timeout is a positive number of seconds, not {timeout}")
        if port is not None and (not isinstance(port, int) or not 0 < port < 65536):
            raise UsageError(f"--port is a number from 1 to 65535, not {port!r}")
        waited, path = _parse_wait(wait_port, wait_http)
        values = {str(k): str(v) for k, v in (env or {}).items()}
        indices = self.layout.parse(hosts)
        inits = {h: self.environment(h) for h in indices}
        started = time.perf_counter()
        envs = {h: {**inits[h].get("env", {}), **values} for h in indices}
        replies = self._on_hosts(indices, lambda h: {  # the supervisor masks the secrets' values in the log it writes
            "op": "start", "name": name, "command": command, "restart": restart, "max_restarts": int(max_restarts),
            "backoff": float(backoff), "env": envs[h], "env_keys": sorted(values),
            "secret_keys": self.masker.secret_names(envs[h]), "cwd": inits[h].get("cwd"), "port": port or waited})
        started_on = [h for h, r in replies.items() if "error" not in r]
        if len(started_on) < len(indices) and started_on:  # all or nothing: end what this call started
            self._on_hosts(started_on, lambda h: {"op": "stop", "name": name})
        self._raise_failures(name, replies, "did not start")
        where = f"host{'s' if len(indices) > 1 else ''} {self.layout.names(indices)}"
        if waited is None:
            report.info(f"[tpunb] started {name!r} on {where}")
        else:
            self._wait_ready(name, indices, waited, path, timeout, where)
            report.info(f"[tpunb] {name!r} ready on {where} in {time.perf_counter() - started:.1f} s")
        states = [self._state(r["state"]) for r in replies.values()]
        seen.note_started(self.name, states)  # %tpu_status now asks this slice's hosts for their services
        return states

    def _wait_ready(self, name: str, indices: list[int], port: int, path: str | None, timeout: float,
                    where: str) -> None:
        """Until the service answers on every host; else one ServiceError naming each host and why,
        with the first one's last log lines."""
        what = f"HTTP GET {path} on port {port}" if path else f"port {port}"
        report.info(f"[tpunb] waiting for {name!r} to answer {what} on {where} (up to {timeout:g} s)")
        waits = self._on_hosts(indices, lambda h: {"op": "wait", "name": name, "port": port, "path": path,
                                                   "timeout": float(timeout), "tail": TAIL}, CONTROL_DEADLINE + timeout)
        bad = {h: r for h, r in waits.items() if not r.get("ready")}
        if not bad:
            return
        first = min(bad)
        why = "; ".join(f"host {self.layout.name(h)}: {r.get('why') or r.get('error')}" for h, r in sorted(bad.items()))
        running = any(r.get("state", {}).get("state") in ("running", "restarting") for r in bad.values())
        still = f"it keeps running (stop it with %tpu_serve --stop {name})" if running else "it has ended"
        raise ServiceError(f"service {name!r} is not ready ({why}); {still}; its last log lines on host "
                           f"{self.layout.name(first)}:", first, bad[first].get("tail", ""))

    def _state(self, raw: dict) -> ServiceState:
        """A host's state of a service, its command line masked (a value typed into it is a secret's
        form too; the host masks what it knows)."""
        return ServiceState.from_host({**raw, "command": self.masker.text(str(raw.get("command", "")))})

    def _on_hosts(self, indices: list[int], make, deadline: float = CONTROL_DEADLINE) -> dict[int, dict]:
        """A request per host (``make(host)``), all at once, each answered within ``deadline`` seconds."""
        return ask_hosts(self.transports, {h: {**make(h), "slice": self.name} for h in indices}, deadline)

    def _raise_failures(self, name: str, replies: dict[int, dict], what: str) -> None:
        failed = {h: r["error"] for h, r in replies.items() if "error" in r}
        if failed:
            said = "; ".join(f"host {self.layout.name(h)}: {e}" for h, e in sorted(failed.items()))
            raise ServiceError(f"service {name!r} {what} ({said})", min(failed))

    def services(self) -> list[ServiceState]:
        """Every service of the slice on every host (hosts that cannot be reached are left out)."""
        replies = self._on_hosts(list(range(len(self.transports))), lambda h: {"op": "list"})
        gone = sorted(h for h, r in replies.items() if r.get("unreachable"))
        if gone:
            report.warn(f"[tpunb] host{'s' if len(gone) > 1 else ''} {self.layout.names(gone)} could not be reached: "
                        f"{'their' if len(gone) > 1 else 'its'} services are not listed")
        found = sorted((self._state(s) for r in replies.values() for s in r.get("services", [])),
                       key=lambda s: (s.name, s.host))
        seen.record_services(self.name, found)  # for the sidebar and other kernels, which cannot ask remote hosts
        return found

    def logs(self, name: str | None, host=None, tail: int | None = None, file: str | None = None
             ) -> dict[int, str] | str:
        """The service's log on each host ({host: text}), or on ``host`` alone (its text); with
        ``file`` (and no name), that file on every host instead (``~``-relative paths from the home)."""
        source = _source(name, file)
        if tail is not None and (not isinstance(tail, int) or tail < 0):
            raise UsageError(f"tail is a number of lines >= 0, not {tail!r}")
        indices = self._hosts_with(name, host, file)
        replies = self._on_hosts(indices, lambda h: {"op": "logs", **source, "tail": tail})
        if file:
            failed = {h: r["error"] for h, r in replies.items() if "error" in r}
            if failed:
                said = "; ".join(f"host {self.layout.name(h)}: {e}" for h, e in sorted(failed.items()))
                raise UsageError(f"{file}: {said}")
        else:
            self._raise_failures(name, replies, "has no log")
        texts = {h: self.masker.text(r["text"]) for h, r in replies.items()}
        return texts[indices[0]] if host is not None else texts

    def follow(self, name: str | None, host=None, tail: int | None = 10, file: str | None = None
               ) -> Iterator[tuple[int, str]]:
        """(host, text) as the service's logs (or ``file`` on every host) grow, starting with their last
        ``tail`` lines, whole lines only (a secret is masked whole); runs until the caller stops
        iterating (a KeyboardInterrupt in a notebook), which ends every host's follow. Each host's
        control process streams its log as it grows; a host that stops is named in one line."""
        source = _source(name, file)
        indices = self._hosts_with(name, host, file)
        with follow_hosts(self.transports, {h: {"op": "follow", **source, "tail": tail or 0, "slice": self.name}
                                            for h in indices}) as stream:
            first = {**{h: {"error": str(e)} for h, e in stream.started.failed.items()}, **stream.started.succeeded}
            failed = {h: r["error"] for h, r in sorted(first.items()) if "error" in r}
            if file and failed:  # as %tpu_logs --file without --follow: every host has it, or say which lacks it
                raise UsageError(f"{file}: " + "; ".join(f"host {self.layout.name(h)}: {e}" for h, e in failed.items()))
            for h, error in failed.items():
                report.warn(f"[tpunb] host {self.layout.name(h)} is not followed: {error}")
            pending = {h: "" for h in indices}  # a line still being written: shown once it is whole
            for h in sorted(set(indices) - set(failed)):
                yield from self._whole_lines(h, first[h]["text"], pending)
            for h, message in stream:
                if "ended" in message:
                    report.warn(f"[tpunb] host {self.layout.name(h)} dropped out of the follow ({message['ended']}); "
                                "the others go on")
                else:
                    yield from self._whole_lines(h, message["text"], pending)

    def _whole_lines(self, host: int, text: str, pending: dict[int, str]) -> Iterator[tuple[int, str]]:
        whole, cut, pending[host] = (pending[host] + text).rpartition("\n")
        if cut:
            yield host, self.masker.text(whole + cut)  # a whole line: a secret never straddles it

    def _hosts_with(self, name: str | None, host, file: str | None = None) -> list[int]:
        if host is not None:
            chosen = self.layout.parse(host)
            if len(chosen) != 1:
                raise UsageError(f"host {host!r} picks {len(chosen)} hosts: give one (e.g. 0)")
            return chosen
        if file:  # a file: on every host
            return list(range(len(self.transports)))
        found = sorted({s.host for s in self.services() if s.name == name})
        if not found:
            raise UsageError(f"no service named {name!r} on {self.name!r}: {self._known()}")
        return found

    def _known(self) -> str:
        names = sorted({s.name for s in self.services()})
        return f"its services are {', '.join(names)}" if names else "start one with %tpu_serve NAME -- COMMAND"

    def stop(self, name: str) -> list[int]:
        """Stop service ``name`` on every host that has it (its command's whole process group); the
        hosts it was stopped on."""
        _check_name(name)
        indices = self._hosts_with(name, None)
        replies = self._on_hosts(indices, lambda h: {"op": "stop", "name": name})
        self._raise_failures(name, replies, "could not be stopped")
        report.info(f"[tpunb] stopped {name!r} on host{'s' if len(indices) > 1 else ''} {self.layout.names(indices)}")
        return indices

    def stop_all(self) -> None:
        """End every service of the slice and forget them (the slice is being deleted); hosts that
        cannot be reached are skipped: their machine goes with the slice."""
        hosts = [h for h in range(len(self.transports)) if may_have_services(self.transports[h], self.name, h)]
        self._on_hosts(hosts, lambda h: {"op": "stop", "all": True})
        seen.forget_services(self.name)
        seen.forget_forwards(self.name, everyone=True)


def recorded_services(record: SliceRecord, here: list[Transport] | None) -> list[ServiceState]:
    """The services of a slice this process does not hold. ``here``: transports to its hosts when
    they are on this machine (its backend says so: a local slice), which are asked directly (only
    those with a service folder); else what a kernel last listed of them (``Serving.services``)."""
    if here is None:
        return [ServiceState.from_host(s) for s in seen.listed_services(record.name)]
    asked = {h: {"op": "list", "slice": record.name} for h in range(len(here))
             if may_have_services(here[h], record.name, h)}
    replies = ask_hosts(here, asked) if asked else {}
    return sorted((ServiceState.from_host(s) for r in replies.values() for s in r.get("services", [])),
                  key=lambda s: (s.name, s.host))


def _source(name: str | None, file: str | None) -> dict:
    """What a logs request reads: a service's log (``name``) or a file (``file``), exactly one."""
    if bool(name) == bool(file):
        raise UsageError("give a service NAME or --file PATH (one of them): %tpu_logs NAME or %tpu_logs --file PATH")
    if name:
        _check_name(name)
        return {"name": name}
    return {"file": str(file)}
