"""Cleanup is complete: a host's agent and every process its cells started end together (agent
killed, slice deleted, kernel dead while the host was frozen); a reused owner pid does not lock a
slice; two threads reviving the same dead host start one agent.

Hosts run on this machine (local processes, or a real sshd on loopback), so the tests look at
their processes directly.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tpunb import manager
from tpunb.errors import NoSliceError, UsageError
from tpunb.host import protocol
from tpunb.registry import process_start
from tests import warm
from tests.conftest import CPU_AS_TPU_HOST, wait_for
from tests.test_liveness import running

ROOT = Path(__file__).resolve().parent.parent
#: a cell that starts three processes a plain SIGTERM of the agent's group would not all end: a
#: sleep, a child that ignores SIGTERM, and a child in a process group of its own
START_CHILDREN = """%%on_tpu --hosts 0
import os, subprocess, sys
children = [subprocess.Popen(["sleep", "1000"]),
            subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(1000)"], stdout=subprocess.PIPE),
            subprocess.Popen(["sleep", "1001"], preexec_fn=os.setpgrp)]
children[1].stdout.readline()
print(*[c.pid for c in children])
"""


def started_children(cell) -> list[int]:
    run = cell(START_CHILDREN)
    assert run.error is None, run.shown
    pids = [int(p) for p in run.stdout.split()[-3:]]
    assert all(running(pid) for pid in pids)
    return pids


def agents_of_this_kernel() -> list[int]:
    """Running agent processes whose parent is this process or its fork server (local hosts), but
    the warm slices' that other tests share (tests/warm.py)."""
    server = manager.MANAGER.forks.pid
    shared = {h.info.get("pid") for w in warm.Pool.every_warm_slice() for h in w.session.hosts}
    parents = {os.getpid(), server}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if (int(fields[1]) in parents and int(entry) != server and int(entry) not in shared and b"_bundle" in cmdline
                and fields[0] not in ("Z", "X")):
            found.append(int(entry))
    return found


@pytest.mark.fresh_slice
def test_processes_a_cell_started_end_when_its_agent_is_killed(make_slice, cell):
    sl = make_slice(2)
    children = started_children(cell)
    agent, guard = sl.session.hosts[0].info["pid"], sl.session.hosts[0].info["watchdog"]
    os.kill(agent, signal.SIGKILL)
    wait_for(lambda: not any(running(pid) for pid in children), 10, "the cell's processes to end with their agent")
    wait_for(lambda: not running(guard), 10, "the watchdog to end")
    wait_for(lambda: sl.session.dead_hosts() == [0], 10, "the kernel to see host 0 die")
    assert "Out[0-1]: 1" in cell("%%on_tpu\n1").shown


@pytest.mark.fresh_slice
def test_processes_a_cell_started_end_with_the_slice(make_slice, cell):
    sl = make_slice(2)
    children = started_children(cell)
    guards = [h.info["watchdog"] for h in sl.session.hosts]
    agents = [h.info["pid"] for h in sl.session.hosts]
    sl.delete()
    wait_for(lambda: not any(running(pid) for pid in children + guards + agents), 10,
             "every host process to end with the slice")


@pytest.mark.parametrize("transport", ["local", "ssh"])
@pytest.mark.fresh_slice
@pytest.mark.sandbox
def test_host_frozen_when_its_kernel_dies_does_not_stay_frozen(transport, request, tmp_path):
    """A kernel process (a real Python running tpunb) starts a slice and a child on host 0; host 0's
    agent is frozen, then the kernel is killed: the agent and its child end within seconds."""
    connect = "manager.launch('v4-8', name='orphan')"
    if transport == "ssh":
        server, key = request.getfixturevalue("sshd"), request.getfixturevalue("ssh_key")
        connect = (f"manager.connect(['{server.addresses[0]}:{server.port}'], key={str(key)!r}, "
                   f"python={server.python!r}, name='orphan', env={CPU_AS_TPU_HOST!r})")
    script = ("import sys, time\nfrom tpunb import manager\n"
              f"sl = {connect}\n"
              "child = sl.run(\"import subprocess; subprocess.Popen(['sleep', '1002']).pid\", output=None).reprs[0]\n"
              "print('pids', sl.session.hosts[0].info['pid'], child, flush=True)\n"
              "time.sleep(600)\n")
    env = {**os.environ, "TPUNB_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    kernel = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True)
    try:
        line = next(line for line in kernel.stdout if line.startswith("pids "))
        agent, child = [int(p) for p in line.split()[1:]]
        os.kill(agent, signal.SIGSTOP)
        kernel.kill()
        killed = time.perf_counter()
        wait_for(lambda: not running(agent) and not running(child), 15, "the frozen host to end with its kernel")
        assert time.perf_counter() - killed < 15
    finally:
        kernel.kill()
        kernel.wait()


@pytest.mark.fresh_slice
def test_a_reused_owner_pid_does_not_lock_a_local_slice(cell):
    sl = manager.launch("v4-8", name="reused")
    sl.close()
    manager.detach("reused")
    reg = manager.registry()
    stranger = subprocess.Popen(["sleep", "60"])  # a live process that is not the slice's kernel
    try:
        record = reg.get_slice("reused")
        record.owner_pid, record.owner_start = stranger.pid, process_start(stranger.pid)
        reg.save_slice(record)
        with pytest.raises(UsageError, match="runs in another kernel"):
            manager.use("reused")
        record.owner_start = str(int(process_start(stranger.pid)) - 1)  # the owner was an earlier process
        reg.save_slice(record)
        manager.use("reused")
        assert cell("%%on_tpu\n6 + 1").shown.split() == ["7"]
        assert reg.get_slice("reused").owner_pid == os.getpid()
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.fresh_slice
def test_two_threads_reviving_a_dead_host_start_one_agent(monkeypatch):
    monkeypatch.setenv("TPUNB_STANDBY", "likely")  # every agent counted below is a host's: no standby ahead
    sl = manager.launch("v4-16", name="revived")
    victim = sl.session.hosts[1].info["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: sl.session.dead_hosts() == [1], 10, "host 1 to be seen dead")
    barrier = threading.Barrier(2)
    outcomes: list = []

    def revive():
        barrier.wait()
        started = time.perf_counter()
        try:
            outcomes.append((sl.revive(), time.perf_counter() - started))
        except Exception as exc:  # collected: the test shows it
            outcomes.append((exc, time.perf_counter() - started))

    threads = [threading.Thread(target=revive) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(str(o[0]) for o in outcomes) == ["[1]", "[]"], outcomes  # one revived host 1, the other found it alive
    assert all(seconds < 20 for _, seconds in outcomes)
    host = sl.session.hosts[1]
    assert host.alive and host.info["protocol"] == protocol.PROTOCOL_VERSION and host.info["pid"] != victim
    assert sorted(agents_of_this_kernel()) == sorted(h.info["pid"] for h in sl.session.hosts)
    assert sl.run("1").reprs == {0: "1", 1: "1"}
    guards = [h.info["watchdog"] for h in sl.session.hosts]
    sl.delete()
    wait_for(lambda: not agents_of_this_kernel() and not any(running(g) for g in guards), 10,
             "no agent to outlive Slice.delete()")


@pytest.mark.parametrize("pause", ["before_launch", "after_launch"])
@pytest.mark.fresh_slice
def test_deleting_a_slice_while_another_thread_revives_it_leaves_no_agent(pause):
    """The revival is held at a point inside its agent start (before host 1's agent is spawned, or
    after it was spawned and before its handshake) until the deletion has begun closing the hosts:
    the two overlap every run. Revival says the slice was deleted, in one line; nothing is left."""
    sl = manager.launch("v4-16", name="raced")
    os.kill(sl.session.hosts[1].info["pid"], signal.SIGKILL)
    wait_for(lambda: sl.session.dead_hosts() == [1], 10, "host 1 to be seen dead")
    host, session = sl.session.hosts[1], sl.session
    held, deleting = threading.Event(), threading.Event()
    launch, close = host.launch, session.close

    def launch_held(init=None):
        if pause == "before_launch":
            held.set()
            assert deleting.wait(30), "the deletion never began"
        launch(init)
        if pause == "after_launch":
            held.set()
            assert deleting.wait(30), "the deletion never began"

    def close_noted():
        deleting.set()
        close()

    host.launch, session.close = launch_held, close_noted
    outcome: dict = {}

    def revive():
        try:
            outcome["revived"] = sl.revive()
        except Exception as exc:  # judged below: only "the slice is gone" may end a revival cut short
            outcome["error"] = exc

    reviving = threading.Thread(target=revive)
    reviving.start()
    assert held.wait(30), "the revival never reached the agent start"
    sl.delete()
    reviving.join(30)
    assert not reviving.is_alive()
    error = outcome.get("error")
    assert isinstance(error, NoSliceError) and "was deleted while its hosts were restarting" in str(error), outcome
    assert manager.registry().get_slice("raced") is None
    wait_for(lambda: not agents_of_this_kernel(), 10, "no agent to outlive Slice.delete()")


def test_a_zombie_is_not_alive_for_any_caller():
    """One rule for process state: an ended child not yet reaped is dead to the registry, the
    server and the emulator alike, and a running one is alive with its parent and start time."""
    from tpunb.sandbox.hosts import sshd
    from tpunb.machine import procs
    from tpunb.provision.common import pid_alive

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert pid_alive(child.pid) and sshd.alive(child.pid) and procs.parent(child.pid) == os.getpid()
        assert child.pid in procs.descendants(os.getpid())
        token = process_start(child.pid)
        assert token is not None and token == procs.start_token(child.pid)
        child.stdin.close()
        wait_for(lambda: (procs.stat_fields(child.pid) or ["Z"])[0] == "Z", what="the child to become a zombie")
        assert not pid_alive(child.pid) and not sshd.alive(child.pid) and procs.parent(child.pid) is None
        assert child.pid not in procs.descendants(os.getpid())
    finally:
        child.wait()
    assert not pid_alive(child.pid) and procs.stat_fields(child.pid) is None
