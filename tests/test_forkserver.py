"""Local hosts' agents forked from the kernel's fork server (tpunb.transport.forkserver): each is
what a fresh agent would be (its own random state, environment, directory and umask), a start
that could differ is a fresh process, ends are said as before, and a server that dies is
replaced without touching the hosts it made."""
from __future__ import annotations

import pytest
import os
import signal

from tpunb import manager
from tpunb.engine.connection import describe_exit
from tpunb.machine import procs
from tests.conftest import wait_for

pytestmark = pytest.mark.fresh_slice


def parents(sl) -> set[int | None]:
    return {procs.parent(h.info["pid"]) for h in sl.session.hosts}


def test_agents_are_forked_each_its_own_and_their_ends_are_told(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    manager.launch("v4-8", name="early").delete()  # the server runs
    monkeypatch.setenv("TPUNB_TEST_SET_LATE", "yes")  # set after it started: agents still get it
    old_mask = os.umask(0o027)
    try:
        sl = manager.launch("v4-32", name="forked")
    finally:
        os.umask(old_mask)
    server = manager.MANAGER.forks.pid
    assert server is not None and parents(sl) == {server} and procs.parent(server) == os.getpid()
    run = sl.run("import os, random, sys\n(os.getcwd(), os.environ.get('TPUNB_TEST_SET_LATE'), "
                 "oct(os.umask(0o022)), random.random(), os.getpid(), 'IPython' in sys.modules)")
    assert run.ok, run
    answers = [eval(run.reprs[i]) for i in range(4)]
    assert {(a[0], a[1], a[2], a[5]) for a in answers} == {(str(work), "yes", "0o27", True)}
    assert len({a[3] for a in answers}) == 4  # random is reseeded in every fork: no two hosts draw alike
    assert len({a[4] for a in answers}) == 4

    victim = sl.session.hosts[2].process
    os.kill(victim.pid, signal.SIGKILL)
    wait_for(lambda: victim.exit_status() is not None, 10, "the server to say how host 2 ended")
    assert describe_exit(victim) == "killed by SIGKILL"
    wait_for(lambda: sl.session.dead_hosts() == [2], 10, "host 2 to be seen dead")
    done = sl.run("1 + 1")  # host 2 is started again, forked like the rest
    assert done.ok and done.reprs == {i: "2" for i in range(4)}, done
    assert parents(sl) == {server}
    sl.delete()


def test_a_start_a_fork_would_get_wrong_is_a_fresh_process(tmp_path, monkeypatch):
    manager.launch("v4-8", name="first").delete()  # the server runs, started with this environment
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # read only as Python starts: a fork would not see it
    sl = manager.launch("v4-16", name="fresh")
    assert parents(sl) == {os.getpid()}
    run = sl.run(f"import sys\n{str(tmp_path)!r} in sys.path")
    assert run.ok and run.reprs == {0: "True", 1: "True"}, run
    sl.delete()


def test_a_dead_server_is_replaced_and_the_hosts_it_made_live_on():
    sl = manager.launch("v4-16", name="orphans")
    server = manager.MANAGER.forks.pid
    os.kill(server, signal.SIGKILL)
    wait_for(lambda: manager.MANAGER.forks.pid is None, 10, "the kernel to see its fork server gone")
    assert sl.run("6 * 7").reprs == {0: "42", 1: "42"}  # its agents are not its: they go on
    other = manager.launch("v4-8", name="after")
    assert parents(other) == {manager.MANAGER.forks.pid} != {server}
    assert other.run("1").reprs == {0: "1"}
    other.delete()
    victim = sl.session.hosts[0].process
    sl.delete()
    assert victim.exit_status() is not None  # ended, though no server is left to say how
