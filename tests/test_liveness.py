"""Liveness: a frozen host (its process stopped, its sshd session stopped) fails its cell within
seconds, naming it, with no interrupt; escalation over a frozen connection is bounded; no Ctrl-C,
however often pressed, shows a traceback of tpunb's or paramiko's code.

Hosts run on this machine (local processes, or a real sshd on loopback), so the tests freeze
them with SIGSTOP directly.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tpunb import manager
from tpunb.errors import CellInterrupted, HostDiedError
from tpunb.engine.request import PRESS_FLOOR
from tpunb.engine.session import HEARTBEAT_TIMEOUT
from tests.conftest import wait_for, wait_for_files

#: a frozen host's cell must fail within this many seconds (the heartbeat timeout, plus slack)
BOUND = HEARTBEAT_TIMEOUT + 5.0
#: every test here freezes or kills hosts, and times that against the heartbeat limit a user has
pytestmark = [pytest.mark.fresh_slice, pytest.mark.usefixtures("user_defaults")]
SLEEPING_CELL = "%%on_tpu\nimport os, time\nopen('{flags}/' + os.environ['TPUNB_HOST_INDEX'], 'w').close()\ntime.sleep(60)"


def stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def running(pid: int) -> bool:
    """The process exists and has not ended (a zombie waiting for its parent has ended)."""
    fields = stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _pipes(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}").joinpath("fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("pipe:"):
            found.add(target)
    return found


def sshd_session_of(agent_pid: int) -> int:
    """The sshd process that carries an SSH host's agent: the one holding the other ends of its
    streams' pipes (its parent for a fresh agent; for one its host's fork server made, the parent
    of the client that asked for it)."""
    streams = _pipes(agent_pid)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != agent_pid:
            try:
                if b"sshd" in (entry / "cmdline").read_bytes() and _pipes(int(entry.name)) & streams:
                    return int(entry.name)
            except OSError:
                continue
    raise AssertionError(f"no sshd session holds agent {agent_pid}'s streams")


def freeze_when(condition, pid_of) -> dict:
    """From another thread, SIGSTOP ``pid_of()`` once ``condition()`` holds; the time it was sent."""
    frozen: dict = {}

    def run():
        wait_for(condition, 60, "hosts to reach the freezing point")
        frozen["pid"] = pid = pid_of()
        os.kill(pid, signal.SIGSTOP)
        frozen["at"] = time.perf_counter()

    threading.Thread(target=run, daemon=True).start()
    return frozen


@pytest.fixture
def thawed():
    """Processes a test stopped that tpunb is not expected to end (an sshd session) are resumed after it."""
    stopped: list[int] = []
    yield stopped
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass


def test_host_frozen_during_a_cell_fails_it_naming_the_host(make_slice, cell, flags):
    sl = make_slice(2)
    cell("%%on_tpu\nkept = 'state'")
    frozen = freeze_when(lambda: len(list(flags.iterdir())) == 2, lambda: sl.session.hosts[1].info["pid"])
    run = cell(SLEEPING_CELL.format(flags=flags))
    seconds = time.perf_counter() - frozen["at"]
    assert isinstance(run.error, HostDiedError), run.shown
    assert "host 1 stopped answering (no heartbeat for" in str(run.error)
    assert seconds < BOUND, f"the cell failed {seconds:.1f} s after host 1 froze"
    assert run.error.results[0].status == "interrupted"  # host 0 was stopped cleanly: its state stays
    wait_for(lambda: not running(frozen["pid"]), 10, "the frozen agent to be ended")
    after = cell("%%on_tpu\n'kept' in globals()")
    assert "Out[0]: True" in after.shown and "Out[1]: False" in after.shown


def test_host_frozen_between_cells_fails_the_next_cell(make_slice, cell):
    sl = make_slice(2)
    cell("%%on_tpu\nkept = 'state'")
    pid = sl.session.hosts[1].info["pid"]
    os.kill(pid, signal.SIGSTOP)
    frozen_at = time.perf_counter()
    run = cell("%%on_tpu\n'kept' in globals()")  # host 1 is silent from the start of this cell
    assert isinstance(run.error, HostDiedError), run.shown
    assert "host 1 stopped answering" in str(run.error)
    assert time.perf_counter() - frozen_at < BOUND
    wait_for(lambda: not running(pid), 10, "the frozen agent to be ended")
    after = cell("%%on_tpu\n'kept' in globals()")
    assert "Out[0]: True" in after.shown and "Out[1]: False" in after.shown  # host 1 was restarted


def test_host_found_frozen_while_no_cell_ran_fails_the_next_cell_at_once(make_slice, cell):
    sl = make_slice(2)
    pid = sl.session.hosts[0].info["pid"]
    os.kill(pid, signal.SIGSTOP)
    frozen_at = time.perf_counter()
    wait_for(lambda: not sl.session.hosts[0].alive, BOUND, "the session to notice host 0 froze")
    assert time.perf_counter() - frozen_at < BOUND
    assert [r.state for r in manager.host_rows() if r.slice == sl.name][0] == "gone"  # not listed as running
    run = cell("%%on_tpu\n1")
    assert isinstance(run.error, HostDiedError) and run.seconds < 2.0
    assert "host 0 stopped answering (no heartbeat for" in str(run.error) and "while no cell ran" in str(run.error)
    assert "Out[0-1]: 2" in cell("%%on_tpu\n2").shown  # told once; then restarted


@pytest.mark.parametrize("make_slice", ["ssh"], indirect=True)  # an sshd session exists only over SSH
def test_frozen_sshd_session_fails_the_cell_and_the_next_reconnects(make_slice, cell, flags, thawed):
    sl = make_slice(2)
    agent = sl.session.hosts[1].info["pid"]
    session = sshd_session_of(agent)
    thawed.append(session)
    frozen = freeze_when(lambda: len(list(flags.iterdir())) == 2, lambda: session)
    run = cell(SLEEPING_CELL.format(flags=flags))
    seconds = time.perf_counter() - frozen["at"]
    assert isinstance(run.error, HostDiedError) and "host 1 stopped answering" in str(run.error)
    assert seconds < BOUND, f"the cell failed {seconds:.1f} s after host 1's sshd session froze"
    wait_for(lambda: not running(agent), 20, "the agent behind the frozen sshd session to be killed")
    assert "Out[0-1]: 3" in cell("%%on_tpu\n3").shown


@pytest.mark.parametrize("make_slice", ["ssh"], indirect=True)  # a frozen connection exists only over SSH
def test_interrupt_escalation_with_a_frozen_ssh_host_is_bounded(make_slice, cell, flags, thawed):
    sl = make_slice(2)
    sl.heartbeat_timeout = 0  # escalation alone must give the frozen host up
    session = sshd_session_of(sl.session.hosts[1].info["pid"])
    thawed.append(session)
    frozen = freeze_when(lambda: len(list(flags.iterdir())) == 2, lambda: session)
    sent: dict = {}

    def interrupt():
        wait_for(lambda: "at" in frozen, 60, "the sshd session to be frozen")
        sent["at"] = time.perf_counter()
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    run = cell(SLEEPING_CELL.format(flags=flags))
    seconds = time.perf_counter() - sent["at"]
    grace = sl.session.interrupt_grace + 2 * sl.session.term_grace
    assert isinstance(run.error, CellInterrupted), run.shown
    assert seconds < grace + 2.0, f"the interrupt took {seconds:.1f} s"
    assert run.error.results[0].status == "interrupted" and run.error.results[1].status == "killed"
    assert [row.state for row in manager.host_rows() if row.slice == sl.name] == ["running", "gone"]
    sl.heartbeat_timeout = HEARTBEAT_TIMEOUT
    assert "Out[0-1]: 4" in cell("%%on_tpu\n4").shown


def test_ctrl_c_pressed_again_and_again_escalates_without_a_traceback(make_slice, cell, flags):
    """Each press moves on at once (interrupt, SIGTERM, SIGKILL), and the cell still ends in one
    line: no press lands inside tpunb's or paramiko's code. Host 1 ignores SIGINT and SIGTERM."""
    sl = make_slice(2)
    sl.session.term_grace = 5.0  # without the presses, escalation would take 3 + 5 s
    presses: list[float] = []

    def press():
        wait_for(lambda: len(list(flags.iterdir())) == 2, 60, "hosts to reach the interrupt point")
        for _ in range(3):
            presses.append(time.perf_counter())
            os.kill(os.getpid(), signal.SIGINT)
            threading.Event().wait(0.05)

    threading.Thread(target=press, daemon=True).start()
    run = cell("%%on_tpu\nimport os, signal, time\nh = os.environ['TPUNB_HOST_INDEX']\n"
               "if h == '1':\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
               f"open('{flags}/' + h, 'w').close()\ntime.sleep(60)")
    ended = time.perf_counter()
    assert isinstance(run.error, CellInterrupted), run.shown
    seconds = ended - presses[0]  # each press ends its step after PRESS_FLOOR, not after the whole grace
    assert len(presses) == 3 and seconds < 2 * PRESS_FLOOR + 2.0, f"the cell ended {seconds:.1f} s after the first press"
    for text in ("Traceback", "KeyboardInterrupt", "paramiko", "tpunb/"):
        assert text not in run.shown, run.shown
    assert run.error.results[0].status == "interrupted" and run.error.results[1].status == "killed"
    assert [row.state for row in manager.host_rows() if row.slice == sl.name] == ["running", "gone"]
    assert "Out[0-1]: 5" in cell("%%on_tpu\n5").shown


def test_busy_hosts_keep_beating(make_slice, cell):
    """Hosts that sleep, or keep their CPU busy in Python, for several heartbeat timeouts are alive."""
    sl = make_slice(2)
    sl.heartbeat_timeout = 1.5  # agents now beat at a quarter of it (margin for a loaded 2-core CI machine)
    run = cell("%%on_tpu\nimport time\ntime.sleep(3.2)\nend = time.monotonic() + 3.2\nwhile time.monotonic() < end:\n"
               "    sum(range(1000))\n'alive'")
    assert run.error is None and "Out[0-1]: 'alive'" in run.shown, run.shown


def test_the_heartbeat_timeout_comes_from_the_environment(monkeypatch):
    from tpunb.engine.session import Session

    monkeypatch.setenv("TPUNB_HEARTBEAT_TIMEOUT", "2.5")
    assert Session([], lambda i: {}).heartbeat_timeout == 2.5
    monkeypatch.setenv("TPUNB_HEARTBEAT_TIMEOUT", "0")
    assert Session([], lambda i: {}).heartbeat_timeout == 0


def test_a_host_that_died_just_before_the_cell_was_sent_is_reported_not_waited_on(make_slice):
    """Its reader ended after the cell's revive looked and before the cell's request was waited
    on: the "died" it routed went to no one. The cell must still say so at once, and stop the
    other hosts (their collectives would wait on it), rather than wait on it forever."""
    sl = make_slice(2)
    victim = sl.session.hosts[1].info["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: sl.session.dead_hosts() == [1], 10, "host 1 to be seen dead")
    started = time.perf_counter()
    results = sl.session.execute("import time\ntime.sleep(30)", [0, 1], timeout=60)  # no revive: the race's state
    assert results[1].status == "died" and "SIGKILL" in results[1].detail, vars(results[1])
    assert results[0].status == "interrupted", vars(results[0])  # stopped, its state kept
    assert time.perf_counter() - started < 15
    assert sl.run("'again'").reprs == {0: "'again'", 1: "'again'"}  # the next cell restarts host 1


@pytest.mark.jax
def test_a_host_loading_jax_may_hold_the_gil_past_the_heartbeat_timeout(make_slice):
    """jaxlib's load and the backend's start hold the GIL for seconds on a busy host, so no heartbeat
    leaves: a host that said it loads JAX is not judged frozen for that (here: the GIL held 4 s,
    with a 1.5 s timeout, right after the import)."""
    sl = make_slice(2)
    sl.heartbeat_timeout = 1.5
    run = sl.run("import jax\nimport sys, time\nsys.setswitchinterval(30)  # no other thread runs until it is set back\n"
                 "end = time.monotonic() + 4\nwhile time.monotonic() < end:\n    pass\nsys.setswitchinterval(0.005)\n"
                 "jax.process_count()", output=None)
    assert run.reprs == {0: "2", 1: "2"}, run
