"""The program route: what runs on hosts beside the agent, never through it (the service control,
the stacks reader from outside, the log follow), so it works whether the agent lives, died or
belongs to a kernel that is gone.

A ``Program`` is argv started on a host through its transport, sent one length-prefixed JSON
message on stdin, answering length-prefixed JSON frames on stdout. Two shapes, both under
``fan_out``'s rules (one deadline, one Ctrl-C rule, a ``GroupResult``):

- ``ask_hosts``: a short-lived program per host, one reply each. A host past the deadline, or every
  host still running on Ctrl-C, has its program ended (in the background: the caller goes on at once).
- ``follow_hosts``: a long-lived program per host, writing frames until its stdin closes; started
  under the deadline (each host's first frame), then read by one thread per host into one
  iterator. A host whose program or connection ends is said once (``{"ended": why}``) and the
  others go on; leaving the ``with`` block (Ctrl-C included) ends every host's program.
"""
from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from tpunb.transport.fanout import WAKE, GroupResult, fan_out
from tpunb.errors import TransportError
from tpunb.transport.seam import AgentProcess, Transport

K = TypeVar("K", bound=Hashable)
#: seconds every host's program gets to end on end of input when a follow stops (it ends at once)
CLOSE_DEADLINE = 5.0


@dataclass(frozen=True)
class Program:
    """``argv`` to start on the host ``transport`` reaches, the ``message`` it reads first, and
    ``what`` it is called in errors; ``here``: on a host on this machine, the same work done in this
    process instead (nothing started: a 64-host local slice costs no 64 Pythons)."""

    transport: Transport
    argv: list[str]
    message: dict
    what: str
    here: Callable[[], dict] | None = None


def frame(value: dict) -> bytes:
    body = json.dumps(value).encode()
    return b"%012d" % len(body) + body


def read_frame(process: AgentProcess) -> dict | None:
    """The next frame the program wrote; None at the end of its output."""
    head = process.recv_exact(12)
    data = process.recv_exact(int(head)) if len(head) == 12 and head.isdigit() else b""
    return json.loads(data) if data else None


def start(program: Program) -> AgentProcess:
    """The program running on its host with its message sent; TransportError if it cannot start."""
    program.transport.connect()
    process = program.transport.spawn(program.argv)
    try:
        process.send(frame(program.message))
    except BaseException:
        process.close(grace=0)
        raise
    return process


def first_reply(program: Program, process: AgentProcess) -> dict:
    """The program's first frame; TransportError naming it (and its last line on stderr) if none."""
    reply = read_frame(process)
    if reply is None:
        why = process.stderr_tail().strip().splitlines()[-1:] or ["no reply"]
        raise TransportError(f"{program.what} on {program.transport.address} failed: {why[0]}")
    return reply


def ask(program: Program) -> dict:
    """One host's reply, here (a single host: %tpu_bench's client, a VM's worker id)."""
    if program.here is not None and program.transport.same_machine:
        return program.here()
    process = start(program)
    try:
        return first_reply(program, process)
    finally:
        process.close()


def ask_hosts(programs: Mapping[K, Program], deadline: float | None, name: str = "tpunb-programs"
              ) -> GroupResult[K, dict]:
    """Every host's reply at once: ``succeeded`` {key: reply}, ``failed`` {key: TransportError or
    FanOutTimeout}; the programs of hosts that did not answer in time (or at all, on Ctrl-C) are ended."""
    got = _first_frames(programs, deadline, name, keep=False)
    return GroupResult(got.keys, {key: first for key, (_, first) in got.succeeded.items()}, got.failed)


def _first_frames(programs: Mapping[K, Program], deadline: float | None, name: str, keep: bool
                  ) -> GroupResult[K, tuple[AgentProcess | None, dict]]:
    """Every host's program started and its first frame read, at once: {key: (its process if
    ``keep`` (else it is closed), first frame)}. Programs still running when the caller stops
    waiting (the deadline, Ctrl-C) are ended at once, and so is one kept but got too late."""
    running: dict[K, AgentProcess] = {}
    lock = threading.Lock()
    stopped = threading.Event()  # the caller no longer waits (set under ``lock``)

    def one(key: K) -> tuple[AgentProcess | None, dict]:
        program = programs[key]
        if program.here is not None and program.transport.same_machine:
            return None, program.here()
        process = start(program)
        with lock:
            running[key] = process
            late = stopped.is_set()
        if late:  # started after the caller stopped waiting: ended at once
            process.close(grace=0)
        try:
            first = first_reply(program, process)
        except BaseException:
            process.close(grace=0)
            raise
        finally:
            with lock:
                running.pop(key, None)
        if not keep:
            process.close()
        return (process if keep else None), first

    def got_late(got: tuple[AgentProcess | None, dict]) -> None:
        if got[0] is not None:
            got[0].close(grace=0)

    try:
        return fan_out(list(programs), one, deadline=deadline, name=name, late=got_late)
    finally:  # a deadline or Ctrl-C: what still runs is ended, without holding the caller
        with lock:
            stopped.set()
            left = list(running.values())
        if left:
            fan_out(left, lambda process: process.close(grace=0), deadline=0, name=f"{name}-end")


class Follow(Generic[K]):
    """Long-lived programs, one per host, merged: iterate for (key, frame) as frames come, and
    (key, {"ended": why}) once for a host whose program or connection ends; ``started`` is each
    host's first frame (or why it did not start)."""

    def __init__(self, programs: Mapping[K, Program], deadline: float, name: str) -> None:
        self._name = name
        self._frames: queue.SimpleQueue = queue.SimpleQueue()
        begun = _first_frames(programs, deadline, name, keep=True)
        self.started: GroupResult[K, dict] = GroupResult(
            begun.keys, {key: first for key, (_, first) in begun.succeeded.items()}, begun.failed)
        self._processes = {key: process for key, (process, _) in begun.succeeded.items() if process is not None}
        self._open = {key for key, first in self.started.succeeded.items() if "error" not in first
                      and key in self._processes}  # (a program done in this process has nothing to read)
        for key in self._open:
            _Reader(key, self._processes[key], programs[key], self._frames, name)

    def __iter__(self) -> Iterator[tuple[K, dict]]:
        while self._open:
            try:  # the hosts' readers wake this; WAKE bounds a sleep a Ctrl-C missed (see fanout)
                key, message = self._frames.get(timeout=WAKE)
            except queue.Empty:
                continue
            if "ended" in message:
                self._open.discard(key)
            yield key, message

    def close(self) -> None:
        """End every host's program (end of input: each ends at once) and wait, briefly, until they have."""
        processes, self._processes, self._open = list(self._processes.values()), {}, set()
        if processes:
            fan_out(processes, lambda process: process.close(), deadline=CLOSE_DEADLINE, name=f"{self._name}-end")

    def __enter__(self) -> Follow[K]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Reader:
    """One host's follow, read on a thread of its own (the thread per connection) into the merged queue."""

    def __init__(self, key, process: AgentProcess, program: Program, into: queue.SimpleQueue, name: str) -> None:
        self.key, self.process, self.program, self.into = key, process, program, into
        threading.Thread(target=self._run, daemon=True, name=f"{name}-{key}").start()

    def _run(self) -> None:
        try:
            while (message := read_frame(self.process)) is not None:
                self.into.put((self.key, message))
        except (ValueError, OSError) as exc:  # a torn frame: the connection broke mid-write
            why = f"its output broke off ({exc})"
        else:
            why = _why_ended(self.process, self.program)
        self.into.put((self.key, {"ended": why}))


def follow_hosts(programs: Mapping[K, Program], deadline: float, name: str = "tpunb-follow") -> Follow[K]:
    """Start a long-lived program on every host (each answers a first frame within ``deadline``
    seconds) and merge what they write; use it in a ``with`` block, which ends them all."""
    return Follow(programs, deadline, name)


def _why_ended(process: AgentProcess, program: Program) -> str:
    """One line on why a program's output ended: its last word on stderr, else how it ended, if known."""
    tail = process.stderr_tail().strip().splitlines()[-1:]
    code = process.exit_status()
    if tail:
        return tail[0]
    if code is not None:
        return f"{program.what} was killed (signal {-code})" if code < 0 else f"{program.what} ended (exit status {code})"
    return f"{program.what} or its connection to {program.transport.address} ended"
