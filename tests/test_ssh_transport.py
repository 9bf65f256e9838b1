"""SSHTransport against a real OpenSSH sshd on 4 loopback addresses (tests/sshd.py)."""
from __future__ import annotations

import os
import pwd
import signal
import socket
import stat
import time

import pytest

from tests.conftest import wait_for
from tests.sshd import Sshd, _write_ed25519, alive
from tpunb.transport import keys
from tpunb.errors import HostKeyError, TransportError
from tpunb.registry import Registry
from tpunb.transport import ssh_hosts as ssh_module
from tpunb.transport.ssh_hosts import SSHTransport, connect_all, forget_host_key, parse_host

ECHO = ("import sys\n"
        "while True:\n"
        "    data = sys.stdin.buffer.read1(65536)\n"
        "    if not data:\n"
        "        break\n"
        "    sys.stdout.buffer.write(data)\n"
        "    sys.stdout.flush()\n")


def connect(sshd: Sshd, key, address: str | None = None, **kw) -> SSHTransport:
    return SSHTransport(address or sshd.addresses[0], sshd.port, key_path=key, python=sshd.python, **kw)


def read_line(proc) -> str:
    out = b""
    while not out.endswith(b"\n"):
        byte = proc.recv_exact(1)
        assert byte, f"stream ended; stderr: {proc.stderr_tail()}"
        out += byte
    return out.decode().strip()


def test_connect_all_reaches_every_host_in_parallel_and_records_their_keys(sshd, ssh_key, hosts):
    started = time.perf_counter()
    transports = connect_all(hosts, key_path=ssh_key, python=sshd.python)
    elapsed = time.perf_counter() - started
    try:
        assert [t.address for t in transports] == hosts
        assert all(t.connected for t in transports)
        assert elapsed < 3.0
        host_key = sshd.host_public_key.split()
        for address in sshd.addresses:
            assert Registry().get_host_key(address, sshd.port) == (host_key[0], host_key[1])
    finally:
        for t in transports:
            t.close()
    assert not any(t.connected for t in transports)


def test_default_key_is_made_once_owner_only_and_used_when_no_key_is_given(sshd, isolated_home):
    private, public = keys.default_key()
    assert keys.default_key() == (private, public)
    assert private.parent == isolated_home / "keys"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(private.parent.stat().st_mode) == 0o700
    assert public.startswith("ssh-ed25519 AAAA")
    sshd.authorize(public)
    transport = SSHTransport(sshd.addresses[1], sshd.port, python=sshd.python)
    assert transport.connected
    transport.close()


def test_known_host_key_is_checked_not_rerecorded(sshd, ssh_key):
    registry = Registry()
    connect(sshd, ssh_key).close()
    recorded = registry.get_host_key(sshd.addresses[0], sshd.port)
    transport = connect(sshd, ssh_key)  # second time: compared against the record
    transport.close()
    assert registry.get_host_key(sshd.addresses[0], sshd.port) == recorded


@pytest.mark.usefixtures("host_key_restored")
def test_changed_host_key_is_refused_until_forgotten(sshd, ssh_key):
    registry = Registry()
    connect(sshd, ssh_key).close()
    old = registry.get_host_key(sshd.addresses[0], sshd.port)
    sshd.swap_host_key()
    with pytest.raises(HostKeyError) as info:
        connect(sshd, ssh_key)
    message = str(info.value)
    assert "changed" in message and f"forget_host_key('{sshd.addresses[0]}', {sshd.port})" in message
    assert "\n" not in message
    assert registry.get_host_key(sshd.addresses[0], sshd.port) == old  # never silently replaced
    with pytest.raises(HostKeyError):
        connect_all([f"{sshd.addresses[0]}:{sshd.port}"], key_path=ssh_key)
    assert forget_host_key(sshd.addresses[0], sshd.port)
    connect(sshd, ssh_key).close()
    assert registry.get_host_key(sshd.addresses[0], sshd.port) == tuple(sshd.host_public_key.split()[:2])


def test_wrong_user_key_gives_a_clear_authentication_error(sshd, tmp_path):
    stranger = tmp_path / "stranger_key"
    _write_ed25519(stranger)
    with pytest.raises(TransportError) as info:
        connect(sshd, stranger)
    message = str(info.value)
    assert f"{sshd.user}@{sshd.addresses[0]}:{sshd.port} rejected SSH key {stranger}" in message
    assert "authorized_keys" in message and "\n" not in message


def test_missing_key_file_is_named(sshd, tmp_path):
    with pytest.raises(TransportError, match="does not exist"):
        connect(sshd, tmp_path / "nope")


def test_closed_port_fails_at_once_with_the_address(ssh_key):
    started = time.perf_counter()
    with pytest.raises(TransportError) as info:
        SSHTransport("127.0.0.9", 1, key_path=ssh_key, connect_timeout=2)
    assert time.perf_counter() - started < 2
    assert "127.0.0.9:1 refused the connection" in str(info.value)


def test_silent_host_fails_within_the_connect_timeout(ssh_key):
    with socket.socket() as silent:  # accepts TCP but never speaks SSH, like a hung host
        silent.bind(("127.0.0.9", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        started = time.perf_counter()
        with pytest.raises(TransportError) as info:
            SSHTransport("127.0.0.9", port, key_path=ssh_key, connect_timeout=1)
        assert time.perf_counter() - started < 5  # the 1 s timeout, not the 10 s default
    assert f"127.0.0.9:{port}" in str(info.value)


def test_connect_all_names_every_failed_host_and_keeps_nothing_open(sshd, ssh_key):
    specs = [f"{sshd.addresses[0]}:{sshd.port}", "127.0.0.9:1", f"{sshd.addresses[1]}:{sshd.port}", "127.0.0.10:1"]
    with pytest.raises(TransportError) as info:
        connect_all(specs, key_path=ssh_key, connect_timeout=2)
    message = str(info.value)
    assert message.startswith("cannot connect to 2 of 4 hosts")
    assert "127.0.0.9:1" in message and "127.0.0.10:1" in message
    assert set(info.value.failures) == {"127.0.0.9:1", "127.0.0.10:1"}


def test_spawn_echoes_through_one_long_lived_process(sshd, ssh_key):
    transport = connect(sshd, ssh_key)
    proc = transport.spawn([sshd.python, "-u", "-c", ECHO])
    try:
        for size in (1, 5, 100_000):
            data = os.urandom(size)
            proc.send(data)
            assert proc.recv_exact(size) == data
        assert proc.exit_status() is None
    finally:
        proc.close()
    assert proc.exit_status() == 0
    assert wait_for(lambda: proc.pid and not alive(proc.pid), what="echo process to end")
    transport.close()


def test_exit_code_and_stderr_tail_explain_a_failed_start(sshd, ssh_key):
    transport = connect(sshd, ssh_key)
    proc = transport.spawn([sshd.python, "-u", "-c", "import sys; sys.exit('agent cannot start: no frobnicator')"])
    assert proc.recv_exact(4) == b""
    assert wait_for(lambda: proc.exit_status() is not None, what="exit status") and proc.exit_status() == 1
    wait_for(lambda: "no frobnicator" in proc.stderr_tail(), what="stderr")
    assert "tpunb-pid" not in proc.stderr_tail()
    proc.close()
    transport.close()


def test_signal_group_kills_the_remote_group(sshd, ssh_key):
    transport = connect(sshd, ssh_key)
    code = ("import os, subprocess, sys, time\n"
            "child = subprocess.Popen(['sleep', '60'])\n"
            "print(os.getpgid(0), child.pid, flush=True)\n"
            "time.sleep(60)\n")
    proc = transport.spawn([sshd.python, "-u", "-c", code])
    pgid, child = map(int, read_line(proc).split())
    assert pgid == proc.pid  # sshd made the command a session leader
    proc.signal_group(pgid, signal.SIGTERM)
    assert proc.recv_exact(1) == b""
    wait_for(lambda: proc.exit_status() is not None, what="exit status")
    assert proc.exit_status() == -signal.SIGTERM
    wait_for(lambda: not alive(child), what="the remote sleep to die")
    proc.close()
    transport.close()


def test_close_ends_a_remote_process_that_ignores_stdin(sshd, ssh_key, monkeypatch):
    monkeypatch.setattr(ssh_module, "CLOSE_GRACE", 0.3)
    transport = connect(sshd, ssh_key)
    proc = transport.spawn([sshd.python, "-u", "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(60)"])
    pid = int(read_line(proc))
    assert alive(pid)
    proc.close()
    proc.close()  # idempotent
    wait_for(lambda: not alive(pid), what="the remote process to end")
    transport.close()


def test_closing_the_transport_ends_an_agent_that_exits_on_eof(sshd, ssh_key):
    transport = connect(sshd, ssh_key)
    proc = transport.spawn([sshd.python, "-u", "-c", "import os, sys; print(os.getpid(), flush=True); sys.stdin.read()"])
    pid = int(read_line(proc))
    transport.close()
    wait_for(lambda: not alive(pid), what="the remote process to end")
    with pytest.raises(TransportError):
        proc.send(b"x")
    proc.close()


def test_a_dead_sshd_ends_streams_and_reconnect_works_once_it_is_back(sshd, ssh_key):
    transport = connect(sshd, ssh_key, keepalive=1)
    proc = transport.spawn([sshd.python, "-u", "-c", ECHO])
    try:
        sshd.stop()
        assert proc.recv_exact(1) == b""
        wait_for(lambda: not transport.connected, what="the connection to drop")
        with pytest.raises(TransportError, match="not connected"):
            transport.spawn([sshd.python, "-c", "pass"])
        with pytest.raises(TransportError, match="refused"):
            transport.connect()
    finally:
        sshd.start()
    transport.connect()
    proc2 = transport.spawn([sshd.python, "-u", "-c", ECHO])
    proc2.send(b"back")
    assert proc2.recv_exact(4) == b"back"
    proc2.close()
    proc.close()
    transport.close()


def test_parse_host_specs(monkeypatch):
    monkeypatch.setenv("LOGNAME", "carol")  # the login name, as ssh itself defaults it
    assert parse_host("h") == ("carol", "h", 22)
    for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(var, raising=False)
    assert parse_host("h")[0] == pwd.getpwuid(os.getuid()).pw_name  # no variable: the account's name
    assert parse_host("alice@h:2222") == ("alice", "h", 2222)
    assert parse_host("h", user="bob", port=23) == ("bob", "h", 23)
    assert parse_host("[::1]:2200")[1:] == ("::1", 2200)
    assert parse_host("fe80::1")[1:] == ("fe80::1", 22)


def test_public_line_of_a_user_key_without_a_pub_file(tmp_path):
    path = tmp_path / "id_user"
    line = _write_ed25519(path)
    assert keys.public_line(path) == line
    with pytest.raises(TransportError, match="does not exist"):
        keys.public_line(tmp_path / "missing")
