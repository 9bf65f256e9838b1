"""Port forwards (Slice.forward): many concurrent requests, both directions, clean close, a taken
port, an unreachable host, and nothing left listening after %tpu_down. Over local hosts (a relay
on another local port) and real sshd hosts, in both of its modes: an OpenSSH ControlMaster that
is handed each connection, and direct-tcpip channels on the slice's paramiko connection."""
from __future__ import annotations

import os
import socket
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.test_serve import PYTHON, free_port, no_service_left  # noqa: F401 - autouse fixture
from tpunb import report, manager
from tpunb.errors import UsageError

ECHO_HTTP = r'''
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = (self.path * 500).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
ThreadingHTTPServer.request_queue_size = 256
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Echo).serve_forever()
'''

ECHO_TCP = r'''
import socket, sys, threading
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
def echo(conn):
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data.upper())
while True:
    threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()
'''

ECHO_WEBSOCKET = r'''
import asyncio, sys
import tornado.web, tornado.websocket
class Echo(tornado.websocket.WebSocketHandler):
    def on_message(self, message):
        self.write_message(message[::-1], binary=isinstance(message, bytes))
async def main():
    tornado.web.Application([("/ws", Echo)]).listen(int(sys.argv[1]), address="127.0.0.1")
    await asyncio.Event().wait()
asyncio.run(main())
'''


pytestmark = pytest.mark.ends_services
#: a forward's modes ($TPUNB_FORWARD): SSH hosts take each; local hosts take neither (a relay)
MODES = ["openssh", "paramiko"]
#: a test on every way: over SSH in both modes, over local hosts once (they ignore the mode)
EVERY_WAY = pytest.mark.parametrize("make_slice, forward_mode", [("local", None), *(("ssh", m) for m in MODES)],
                                    indirect=True, ids=["local", *(f"{m}-ssh" for m in MODES)])
#: a test of SSH hosts it connects itself, in both modes
BOTH_MODES = pytest.mark.parametrize("forward_mode", MODES, indirect=True)


@pytest.fixture(autouse=True)
def forward_mode(request, monkeypatch):
    """The test's forward mode ($TPUNB_FORWARD), None for local hosts."""
    mode = getattr(request, "param", None)
    if mode:
        monkeypatch.setenv("TPUNB_FORWARD", mode)
    return mode


def ssh_children() -> list[int]:
    """This process's ``ssh`` children: the forwards' ControlMasters."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        name, ppid = stat[stat.index(b"(") + 1:stat.rindex(b")")], int(stat[stat.rindex(b")") + 2:].split()[1])
        if name == b"ssh" and ppid == os.getpid():
            found.append(int(entry))
    return found


def start(sl, tmp_path, name: str, script: str) -> int:
    path = tmp_path / f"{name}.py"
    path.write_text(script)
    port = free_port()
    sl.serve(name, f"exec {PYTHON} {path} {port}", hosts=[0], wait_port=port)
    return port


def through(sl, port: int) -> str:
    """A forward that really carries bytes: local hosts get a relay on another port."""
    url = sl.forward(port, local_port=None if sl.backend != "local" else free_port())
    assert url.startswith("http://127.0.0.1:") and url.endswith("/")
    assert int(url.rsplit(":", 1)[1].strip("/")) != port
    return url


@EVERY_WAY
def test_a_hundred_concurrent_requests_through_one_forward_all_answer_unmixed(make_slice, tmp_path):
    sl = make_slice(1)
    url = through(sl, start(sl, tmp_path, "echo", ECHO_HTTP))

    def ask(i: int) -> bytes:
        with urllib.request.urlopen(f"{url}request-{i}", timeout=60) as reply:
            return reply.read()

    with ThreadPoolExecutor(100) as pool:
        bodies = list(pool.map(ask, range(100)))
    assert bodies == [(f"/request-{i}" * 500).encode() for i in range(100)]


@EVERY_WAY
def test_bytes_flow_both_ways_and_a_half_close_reaches_the_host(make_slice, tmp_path):
    sl = make_slice(1)
    url = through(sl, start(sl, tmp_path, "upper", ECHO_TCP))
    local = int(url.rsplit(":", 1)[1].strip("/"))
    with socket.create_connection(("127.0.0.1", local), timeout=30) as conn:
        for word in (b"hello", b"websocket-like", b"frames"):  # one exchange at a time, as a chat does
            conn.sendall(word)
            got = b""
            while len(got) < len(word):
                got += conn.recv(100)
            assert got == word.upper()
        conn.sendall(b"x" * 3_000_000)
        conn.shutdown(socket.SHUT_WR)  # the host sees the end, answers the rest and closes: we see the end
        rest = b""
        while chunk := conn.recv(1 << 20):
            rest += chunk
        assert rest == b"X" * 3_000_000


@EVERY_WAY
def test_websockets_through_a_forward(make_slice, tmp_path):
    """A real WebSocket (tornado on the host and here): text and binary messages both ways, many
    at once on one connection, then a clean close handshake."""
    import asyncio

    from tornado.websocket import websocket_connect

    sl = make_slice(1)
    url = through(sl, start(sl, tmp_path, "ws", ECHO_WEBSOCKET)).replace("http://", "ws://") + "ws"

    async def talk():
        conn = await websocket_connect(url)
        messages = [f"message {i}" for i in range(50)] + [bytes(range(256)) * 400]
        for message in messages:
            await conn.write_message(message, binary=isinstance(message, bytes))
        replies = [await conn.read_message() for _ in messages]
        conn.close(code=1000)
        ended = await conn.read_message()  # None once the close handshake is done
        return messages, replies, ended, conn.close_code

    messages, replies, ended, code = asyncio.run(talk())
    assert replies == [m[::-1] for m in messages]
    assert ended is None and code == 1000


@EVERY_WAY
def test_a_taken_local_port_names_a_free_one(make_slice, tmp_path):
    sl = make_slice(1)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        busy = taken.getsockname()[1]
        with pytest.raises(UsageError, match=rf"^port {busy} is taken on this machine: try --local-port (\d+) ") as caught:
            sl.forward(8000, local_port=busy)
    suggested = int(str(caught.value).split("--local-port ")[1].split()[0])
    socket.create_server(("127.0.0.1", suggested)).close()  # the one it names is free


@EVERY_WAY
def test_a_forward_to_nothing_says_so_in_one_line_at_the_next_request(make_slice, capsys):
    sl = make_slice(1)
    port = free_port()  # nothing listens on it
    url = through(sl, port)
    capsys.readouterr()
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(url, timeout=30)
    assert caught.value.code == 502
    line = caught.value.read().decode()
    assert line.count("\n") == 1 and f"nothing answers on port {port}" in line
    assert capsys.readouterr().err == f"[tpunb] {line}"


@EVERY_WAY
def test_a_client_retrying_a_forward_is_told_once_until_the_port_answers(make_slice, capsys):
    sl = make_slice(1)
    port = free_port()
    url = through(sl, port)
    capsys.readouterr()
    for _ in range(3):  # as a client polling a restarting service does
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(url, timeout=30)
        assert caught.value.code == 502 and f"nothing answers on port {port}" in caught.value.read().decode()
    assert capsys.readouterr().err.count("\n") == 1
    with socket.create_server(("127.0.0.1", port)) as listening, \
            socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1].strip("/"))), timeout=5) as client:
        answer, _ = listening.accept()
        with answer:
            answer.sendall(b"x")
            assert client.recv(1) == b"x"  # relayed: the forward reached the port, a later failure is news again
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(url, timeout=30)
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.fresh_slice
@BOTH_MODES
def test_a_forward_to_an_ssh_host_that_died_says_so_at_the_next_request(sshd, ssh_key, tmp_path):
    sl = manager.connect([f"{sshd.addresses[0]}:{sshd.port}"], key=str(ssh_key), python=sshd.python,
                        name=f"fwd-{uuid.uuid4().hex[:6]}")
    url = through(sl, start(sl, tmp_path, "echo", ECHO_HTTP))
    sshd.stop()
    try:
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(url + "x", timeout=30)
        line = caught.value.read().decode()
        assert caught.value.code == 502 and line.count("\n") == 1
        assert line.startswith(f"forward {url} -> host 0 port ") and sshd.addresses[0] in line
        with report.captured() as said:
            assert sl.services() == []
        assert [m.text for m in said] == ["[tpunb] host 0 could not be reached: its services are not listed"]
    finally:
        sshd.start()


@pytest.mark.fresh_slice
@EVERY_WAY
def test_down_leaves_no_listening_port(make_slice, tmp_path, forward_mode):
    sl = make_slice(1)
    url = through(sl, start(sl, tmp_path, "echo", ECHO_HTTP))
    with urllib.request.urlopen(url + "a", timeout=30) as reply:
        assert reply.read() == b"/a" * 500
    carried_by_openssh = sl.backend != "local" and forward_mode == "openssh"
    assert bool(ssh_children()) == carried_by_openssh
    local = int(url.rsplit(":", 1)[1].strip("/"))
    manager.down(sl.name)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", local), timeout=5).close()
    assert ssh_children() == []  # no ControlMaster left


@pytest.mark.fresh_slice
@BOTH_MODES
def test_a_host_that_stops_answering_gets_a_502_within_the_open_timeout(sshd, ssh_key, tmp_path, monkeypatch):
    """A frozen host (every sshd process stopped, as a VM that hangs): the next request waits at
    most the open timeout, then gets the one line; nothing hangs."""
    import signal
    import time

    from tpunb.machine.procs import descendants
    from tpunb.forwards import port_forward as forward

    monkeypatch.setattr(forward, "OPEN_TIMEOUT", 2.0)
    sl = manager.connect([f"{sshd.addresses[0]}:{sshd.port}"], key=str(ssh_key), python=sshd.python,
                        name=f"fwd-{uuid.uuid4().hex[:6]}")
    url = through(sl, start(sl, tmp_path, "echo", ECHO_HTTP))
    frozen = []
    try:
        for pid in [sshd._proc.pid, *descendants(sshd._proc.pid)]:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:  # a session that ended since the listing needs no stopping
                continue
            frozen.append(pid)
        asked = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(url + "x", timeout=30)
        waited = time.monotonic() - asked
        line = caught.value.read().decode()
        assert caught.value.code == 502 and line.count("\n") == 1 and sshd.addresses[0] in line, line
        assert 1.5 < waited < 10, waited
    finally:  # every process stopped goes on, whatever failed: the next tests share this sshd
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
