"""SSH hosts' agents forked from each host's fork server (tpunb.transport.ssh_forks): a server
serves every connection of this user, Python and tpunb, each agent is what a fresh one would be,
its end is told as sshd tells a command's, a package install makes a server stale, another
user's server is never used, and a server with no agent ends by itself."""
from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys

import pytest

from tpunb import manager
from tpunb.engine import connection
from tpunb.transport.bundle import fork_client_source
from tpunb.engine.connection import describe_exit
from tpunb.host import forkserver
from tpunb.host.standalone import forkclient
from tpunb.machine import procs
from tpunb.transport import ssh_forks
from tests.conftest import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.fresh_slice]


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> str:
    """A Python of this module's own: a venv over this machine's site-packages. Its servers are
    this module's alone (a server is per Python), so another worker's slices never hold one of
    them, and a package install into its site-packages touches nobody else's server."""
    venv = tmp_path_factory.mktemp("forks") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    return str(venv / "bin" / "python")


@pytest.fixture
def connect(sshd, ssh_key, monkeypatch, python):
    monkeypatch.setattr(connection, "MARSHAL_FRAMES", False)

    def made(count: int = 2, name: str | None = None, **options):
        return manager.connect([f"{a}:{sshd.port}" for a in sshd.addresses[:count]], key=str(ssh_key),
                               python=python, name=name, **options)
    return made


def parents(sl) -> list[int | None]:
    return [procs.parent(h.info["pid"]) for h in sl.session.hosts]


def test_every_connection_forks_its_agents_from_the_hosts_server_each_its_own(connect):
    first = connect(2, "first", env={"SEEN": "one"})
    servers = parents(first)
    assert len(set(servers)) == 2 and all(procs.parent(s) == 1 for s in servers)  # one a host, detached
    first.delete()
    second = connect(2, "second", env={"SEEN": "two"})  # new connections: the same servers serve them
    assert parents(second) == servers
    run = second.run("import os, random, sys\n(os.environ['SEEN'], os.environ['TPUNB_HOST_DIR'], random.random(), "
                     "os.getpid() == os.getpgid(0), 'IPython' in sys.modules)")
    assert run.ok, run
    answers = [eval(run.reprs[i]) for i in range(2)]
    assert [a[0] for a in answers] == ["two", "two"] and answers[0][1] != answers[1][1]  # each host its own
    assert answers[0][2] != answers[1][2] and all(a[3] and a[4] for a in answers)

    victim = second.session.hosts[1].process
    os.kill(second.session.hosts[1].info["pid"], signal.SIGKILL)
    wait_for(lambda: victim.exit_status() is not None, 10, "sshd to say how host 1 ended")
    assert describe_exit(victim) == "killed by SIGKILL"  # as sshd says of a fresh agent
    wait_for(lambda: second.session.dead_hosts() == [1], 10, "host 1 to be seen dead")
    assert second.run("1 + 1").reprs == {0: "2", 1: "2"}
    assert parents(second) == servers  # started again, forked like the rest
    second.delete()


def test_a_package_install_makes_the_server_stale_and_a_new_one_serves(connect, python):
    sl = connect(1, "before")
    old = parents(sl)[0]
    sl.delete()
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert site.startswith(os.path.dirname(os.path.dirname(python)))  # the venv's own, on its hosts' sys.path
    os.utime(site)  # what pip does to it
    sl = connect(1, "after")
    assert parents(sl)[0] not in (old, None) and procs.parent(parents(sl)[0]) == 1
    assert sl.run("1").ok
    sl.delete()
    wait_for(lambda: not procs.alive(old), 10, "the stale server to end once its agents are gone")


def test_with_forks_off_agents_start_fresh(connect, monkeypatch):
    monkeypatch.setenv("TPUNB_FORK_SERVER", "0")
    sl = connect(1, "fresh")
    assert procs.parent(parents(sl)[0]) != 1  # below its own sshd session, no server
    assert sl.run("6 * 7").reprs == {0: "42"}
    sl.delete()


def _client(digest: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-S", "-c", fork_client_source(), digest], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_a_server_another_user_holds_is_never_asked():
    """Abstract socket names are every user's: one squatted by user nobody gets no environment."""
    digest = "squatted-" + os.urandom(4).hex()
    squatter = subprocess.Popen(
        ["/usr/bin/python3", "-c", "import socket, sys\ns = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
         "s.bind('\\0' + sys.argv[1]); s.listen(1); print('bound', flush=True)\n"
         "c, _ = s.accept(); print('asked' if c.recv(1 << 20) else 'told nothing', flush=True)", _name_for(digest)],
        user=65534, stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "bound"
        done = _client(digest)
        assert done.returncode == forkclient.REFUSED, done
        assert "tpunb-nofork PermissionError" in done.stderr, done.stderr
    finally:
        squatter.kill()
        assert "asked" not in squatter.communicate()[0]


def _name_for(digest: str) -> str:
    """The socket name a client of ours asks for (what ``forkclient.socket_name`` makes under -I -S)."""
    code = f"import sys; sys.path.insert(0, {os.path.dirname(forkclient.__file__)!r}); import forkclient; " \
           f"print(forkclient.socket_name({digest!r}))"
    return subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_server_with_no_agent_ends_after_its_idle_time(monkeypatch):
    digest = "idle-" + os.urandom(4).hex()
    monkeypatch.setenv(forkserver.IDLE_ENV, "3")
    from tpunb.transport.bundle import SSH_FORK_SERVER, agent_bundle

    started = subprocess.run([sys.executable, "-c", SSH_FORK_SERVER, "0", digest], input=agent_bundle(),
                             capture_output=True, timeout=60)
    assert started.stdout.strip() == b"ready", started
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as probe:  # which process serves
        probe.connect("\0" + _name_for(digest))
        server = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
    assert procs.alive(server) and procs.parent(server) == 1  # it serves, detached from its start
    wait_for(lambda: not procs.alive(server), 20, "the idle server to end")
