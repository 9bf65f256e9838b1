"""The program route (tpunb.engine.programs): short-lived programs on every host under one deadline,
with the hosts' programs ended when the caller stops waiting (a missed deadline, Ctrl-C); real
processes through a real transport."""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import interrupt_kernel_when, interrupt_main_unseen_when, main_thread_asleep, wait_for
from tpunb.transport.fanout import FanOutTimeout
from tpunb.engine.programs import Program, ask_hosts, follow_hosts
from tpunb.host.standalone.service import alive
from tpunb.transport.pipes import LocalTransport

#: answers its message back
ECHO = "import os; n = int(os.read(0, 12)); m = os.read(0, n); os.write(1, b'%012d' % len(m) + m)"
#: says its pid (a file) and never answers
SILENT = ("import os, sys, time; open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); "
          "os.replace(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(300)")


#: says its pid (a file), answers a first frame, then waits for the end of its input
QUIET = ("import os, sys; open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); "
         "os.replace(sys.argv[1] + '.tmp', sys.argv[1]); n = int(os.read(0, 12)); os.read(0, n); "
         "os.write(1, b'000000000002{}'); import select; select.select([0], [], [], 20)")


def program(code: str, *args: str, message: dict | None = None) -> Program:
    return Program(LocalTransport(), [sys.executable, "-c", code, *args], message or {}, "a test program")


def pid_in(path: Path) -> int | None:
    return int(path.read_text()) if path.exists() else None


def test_a_host_past_the_deadline_fails_alone_and_its_program_is_ended(tmp_path):
    said = tmp_path / "pid"
    result = ask_hosts({"quick": program(ECHO, message={"hello": 1}), "silent": program(SILENT, str(said))}, 3.0)
    assert result.succeeded == {"quick": {"hello": 1}}
    assert isinstance(result.failed["silent"], FanOutTimeout) and "no answer within 3 s" in str(result.failed["silent"])
    pid = wait_for(lambda: pid_in(said), what="the silent program's pid")
    wait_for(lambda: not alive(pid), 10, "the silent program to be ended")


def test_ctrl_c_stops_the_wait_at_once_and_ends_every_hosts_program(tmp_path):
    paths = [tmp_path / "a", tmp_path / "b"]
    sent = interrupt_kernel_when(lambda: all(p.exists() for p in paths))
    with pytest.raises(KeyboardInterrupt):
        ask_hosts({i: program(SILENT, str(p)) for i, p in enumerate(paths)}, None)
    assert time.perf_counter() - sent["at"] < 2
    for path in paths:
        pid = pid_in(path)
        wait_for(lambda: not alive(pid), 10, "every program to be ended")


def test_a_ctrl_c_that_woke_no_sleep_still_ends_a_follow_and_every_hosts_program(tmp_path):
    """A follow waits on the hosts' frames on the kernel's thread. A SIGINT whose C handler ran just
    before that wait slept, or on another thread, wakes nothing: the last stop's CI sat 300 s in a
    quiet ``%tpu_logs --follow`` so. It ends at once now (the programs here end by themselves 20 s on)."""
    paths = [tmp_path / "a", tmp_path / "b"]
    with follow_hosts({i: program(QUIET, str(p)) for i, p in enumerate(paths)}, 30.0) as stream:
        assert stream.started.succeeded == {0: {}, 1: {}}
        following = threading.Event()  # the kernel's thread runs bytecode from here to its wait in the follow
        sent = interrupt_main_unseen_when(lambda: following.is_set() and main_thread_asleep())
        with pytest.raises(KeyboardInterrupt):
            following.set()
            for _ in stream:
                pass
    assert time.perf_counter() - sent["at"] < 2
    for path in paths:
        pid = pid_in(path)
        wait_for(lambda: not alive(pid), 10, "every program to be ended")
