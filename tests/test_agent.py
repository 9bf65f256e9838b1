"""The agent on its own: the plain runner (no IPython on the host) and the protocol check."""
from __future__ import annotations

import marshal
from types import SimpleNamespace

import pytest

from tpunb.engine import connection
from tpunb.host import protocol
from tpunb.errors import ProtocolError
from tpunb.display import OutputSink
from tpunb.engine.wire import Broadcast
from tpunb.engine.session import Session
from tpunb.transport.fanin import FrameCutter
from tpunb.transport.pipes import LocalTransport


@pytest.mark.parametrize("same_python", [True, False], ids=["marshal", "json"])
def test_plain_runner_without_ipython(monkeypatch, same_python):
    """On a host of this same Python, frames are marshal and the kernel compiles the cell; on any
    other (JSON frames), the host compiles it: both run it alike."""
    monkeypatch.setattr(connection, "MARSHAL_FRAMES", same_python)
    session = Session([LocalTransport("local:0")], lambda i: {"env": {}, "ipython": False})
    session.start()
    try:
        assert session.hosts[0].info["runner"] == "plain" and session.hosts[0].fast is same_python
        ok = session.execute("x = 6\nprint('out')\nx * 7", [0])[0]
        assert (ok.status, ok.stdout, ok.value) == ("ok", "out\n", {"text/plain": "42"})
        bad = session.execute("def f():\n    return 1 / 0\nf()", [0])[0]
        assert bad.status == "error" and bad.error["ename"] == "ZeroDivisionError"
        text = "\n".join(bad.error["traceback"])
        assert "return 1 / 0" in text and "tpunb" not in text  # the cell's lines, none of ours
        assert session.execute("x", [0])[0].value == {"text/plain": "6"}
        warned = session.execute("x is 6", [0])[0]  # compiled on the host, whose warning shows there
        assert warned.value == {"text/plain": "True"} and "SyntaxWarning" in warned.stderr
        broken = session.execute("x = (", [0])[0]
        assert broken.status == "error" and broken.error["ename"] == "SyntaxError"
        assert session.execute("def g(a: nowhere): pass", [0])[0].error["ename"] == "NameError"  # no __future__ of ours
    finally:
        session.close()


def test_a_cell_is_compiled_once_for_every_host_of_this_python():
    hosts = {name: SimpleNamespace(fast=fast, info={"runner": runner, "optimize": level}) for name, fast, runner, level in
             (("plain", True, "plain", 0), ("plain2", True, "plain", 0), ("ipython", True, "ipython", 0),
              ("other", False, "plain", 0), ("optimized", True, "plain", 1))}
    frames = Broadcast({"op": "exec", "id": 7, "code": "y = 2\ny * 21", "count": 12})
    cut = {name: FrameCutter().feed(frames.for_host(host)) for name, host in hosts.items()}
    assert frames.for_host(hosts["plain"]) is frames.for_host(hosts["plain2"])  # encoded once
    [(message, blob)] = cut["plain"]
    assert message["compiled"] is True and message["code"] == "y = 2\ny * 21"
    body, last = marshal.loads(blob)
    namespace = {}
    exec(body, namespace)
    assert eval(last, namespace) == 42 and body.co_filename == last.co_filename == "<cell-12>"
    for name in ("ipython", "other", "optimized"):  # IPython transforms the cell itself; another Python (or -O) compiles it there
        [(message, blob)] = cut[name]
        assert "compiled" not in message and blob == b""
    assert protocol.decode_header(frames.for_host(hosts["other"])[:8])[2] is False
    assert protocol.decode_header(frames.for_host(hosts["ipython"])[:8])[2] is True
    bad = Broadcast({"op": "exec", "id": 8, "code": "x = (", "count": 13})
    [(message, blob)] = FrameCutter().feed(bad.for_host(hosts["plain"]))
    assert "compiled" not in message and blob == b""  # the host reports the syntax error


def test_a_cell_sent_from_another_thread_is_compiled_by_its_hosts():
    """ast.parse off the main thread (a background cell's) would race IPython's parse of the next
    cell in CPython (gh-106905): the hosts compile such a cell."""
    import threading

    host = SimpleNamespace(fast=True, info={"runner": "plain", "optimize": 0})
    frames, cut = Broadcast({"op": "exec", "id": 9, "code": "y = 2", "count": 14}), []
    worker = threading.Thread(target=lambda: cut.extend(FrameCutter().feed(frames.for_host(host))))
    worker.start()
    worker.join()
    [(message, blob)] = cut
    assert "compiled" not in message and blob == b""


def test_protocol_version_mismatch_is_refused(monkeypatch):
    monkeypatch.setattr(protocol, "PROTOCOL_VERSION", 999)
    session = Session([LocalTransport("local:0")], lambda i: {"env": {}})
    with pytest.raises(ProtocolError, match="agent protocol v5, this tpunb speaks v999"):
        session.start()


@pytest.mark.parametrize("fast", [False, True], ids=["json", "marshal"])
def test_frames_round_trip(fast):
    frame = protocol.encode({"op": "x", "text": "é"}, b"\x00blob", fast)
    data = iter([frame])
    buffer = bytearray(next(data))

    def read_exact(n):
        out = bytes(buffer[:n])
        del buffer[:n]
        return out

    assert protocol.read_frame(read_exact) == ({"op": "x", "text": "é"}, b"\x00blob")
    assert protocol.read_frame(read_exact) is None


def test_a_value_marshal_refuses_goes_as_json():
    class Score(float):  # as numpy's float64: JSON takes it, marshal does not
        pass

    frame = protocol.encode({"op": "display", "metadata": {"score": Score(0.5)}}, b"", fast=True)
    assert protocol.decode_header(frame[:8])[2] is False
    assert FrameCutter().feed(frame) == [({"op": "display", "metadata": {"score": 0.5}}, b"")]


def test_a_marshal_body_that_is_not_a_message_is_refused():
    for body in (marshal.dumps([1, 2]), b"\xff\x00"):
        with pytest.raises(ValueError):
            FrameCutter().feed(protocol.HEADER.pack(len(body) | protocol.MARSHAL_BIT, 0) + body)


def test_tpunb_log_works_on_a_host_without_tpunb(tmp_path):
    """A host with only the agent (python -S: no site-packages, so no tpunb, no IPython)."""
    import queue
    import sys

    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec env -u PYTHONPATH {sys.executable} -S "$@"\n')  # no tpunb on any path
    bare.chmod(0o755)
    session = Session([LocalTransport("local:0", python=str(bare))],
                      lambda i: {"env": {}, "cwd": str(tmp_path), "metrics": {"interval": 0.1}})
    frames: queue.Queue = queue.Queue()
    session.on_metrics = lambda host, message: frames.put(message)
    session.start()
    try:
        assert session.hosts[0].info["runner"] == "plain"
        result = session.execute("import tpunb\ntpunb.log(3, loss=0.25)\ntpunb.__doc__", [0])[0]
        assert result.status == "ok" and "only tpunb.log" in result.value["text/plain"]
        sent = []  # the cell's logged value came before its reply: no waiting for a sampler tick
        while not frames.empty():
            sent.extend(frames.get_nowait()["samples"])
        assert [s[2:] for s in sent if s[1] == "loss"] == [[0.25, None, 3]]
    finally:
        session.close()


def test_interleaved_runtime_chatter_is_dropped_and_user_lines_kept():
    """Gloo's C++ threads write their connection lines in pieces that interleave (recorded from a
    loaded 2-host slice); what is left of them must not reach the notebook as '7' or blank lines."""
    import re

    from tpunb.host.io import OutputPump
    from tpunb.provision.common import GLOO_CHATTER, GLOO_FRAGMENTS

    pump = OutputPump.__new__(OutputPump)  # the filter alone: no pipes, no pump thread
    pump.drop, pump.fragments = re.compile(GLOO_CHATTER), re.compile(GLOO_FRAGMENTS)
    pump._noise_at, pump._held, pump._dropping = float("-inf"), {}, {}
    pieces = ["[Gloo] Rank ", "[Gloo] Rank ", "4", " is connected to ", "7", "6", " is connected to ",
              "7 peer ranks. Expected number of connected peer ranks is : 7\n",
              " peer ranks. Expected number of connected peer ranks is : 7\n", "7\n", "\n", "loss 7\n"]
    shown = "".join(pump._filter(1, piece, final=False) for piece in pieces)
    assert shown == "loss 7\n"
    pump._noise_at = float("-inf")  # long after any chatter, a user's bare number and blank line stay
    assert pump._filter(1, "7\n\n", final=False) == "7\n\n"


def test_a_print_between_the_pieces_of_a_runtime_line_is_kept():
    """Gloo's C++ threads write a line in pieces; a print landing between them made one line with
    the noise, and the filter dropped it whole (a notebook's '[s0]' line lost on a loaded machine).
    Python's own output has pipes of its own now, so only the runtime's writes meet the filter."""
    from tpunb.provision.common import DROP_NOISE

    session = Session([LocalTransport("local:0")], lambda i: {"env": {}, "ipython": False, **DROP_NOISE})
    session.start()
    try:
        result = session.execute("import os\nos.write(1, b'[Gloo] Rank 0 is connected to ')\n"
                                 "print('kept', flush=True)\n"
                                 "os.write(1, b'1 peer ranks. Expected number of connected peer ranks is : 1\\n')\n"
                                 "print('after')\nos.system('echo from a subprocess')", [0])[0]
        lines = result.stdout.splitlines()  # a subprocess writes to fd 1 as before (not ordered with a buffered print)
        assert result.status == "ok" and lines.count("from a subprocess") == 1, result.stdout
        assert [line for line in lines if line != "from a subprocess"] == ["kept", "after"], result.stdout
    finally:
        session.close()


class _Gate(OutputSink):
    """Opens a file gate once a host's printed text has reached the kernel: a cell waiting on
    the gate ends only if its output streamed while it ran, never at its end."""

    def __init__(self, gate) -> None:
        self.gate, self.seen = gate, ""

    def stream(self, host: int, name: str, text: str) -> None:
        self.seen += text
        if "waiting" in self.seen:
            self.gate.write_text("open")


def test_print_in_a_long_cell_streams_while_it_runs_every_cell_and_between_cells(tmp_path):
    """The host's flusher sleeps until a write wakes it: each cell's first print (and a
    background thread's between cells) must still arrive within moments, not at the cell's end."""
    session = Session([LocalTransport("local:0")], lambda i: {"env": {}, "ipython": False})
    session.start()
    wait = ("import os, time\nprint('waiting')\ndeadline = time.monotonic() + 30\n"
            "while not os.path.exists({gate!r}) and time.monotonic() < deadline:\n    time.sleep(0.01)\n"
            "print('gate', os.path.exists({gate!r}))")
    try:
        for n in range(3):  # the hook steps aside after a write and must be re-armed for the next cell
            gate = tmp_path / f"gate{n}"
            result = session.execute(wait.format(gate=str(gate)), [0], sink=_Gate(gate))[0]
            assert result.stdout == "waiting\ngate True\n", result.stdout
        gate, started = tmp_path / "background", tmp_path / "started"
        session.execute("import os, threading, time\n"  # a background thread prints once the next cell runs
                        f"def later():\n    while not os.path.exists({str(started)!r}):\n        time.sleep(0.01)\n"
                        "    print('waiting')\nthreading.Thread(target=later).start()", [0])
        result = session.execute(f"open({str(started)!r}, 'w').close()\n"
                                 + wait.format(gate=str(gate)).replace("print('waiting')\n", ""), [0],
                                 sink=_Gate(gate))[0]
        assert result.stdout.endswith("gate True\n"), result.stdout
    finally:
        session.close()


@pytest.mark.parametrize("inbox", ["sigio", "thread"])
def test_frames_that_come_while_a_cell_runs_are_read_beside_it(monkeypatch, inbox):
    """The main thread reads its own requests between cells; while a cell runs, another thread
    must read: an interrupt (also one that came in the same read as its cell, before any signal
    was asked for), and the end of the session, which ends the host at once."""
    if inbox == "thread":
        monkeypatch.setenv("TPUNB_AGENT_INBOX", "thread")
    session = Session([LocalTransport("local:0")], lambda i: {"env": {}, "ipython": False})
    session.start()
    host = session.hosts[0]
    long_cell = "import time\nfor _ in range(600):\n    time.sleep(0.05)"
    try:
        assert host.info["inbox"] == inbox
        for _ in range(2):  # interrupted (not killed) when the deadline passes, cell after cell
            result = session.execute(long_cell, [0], timeout=0.5)[0]
            assert result.status == "timeout" and result.error["ename"] == "KeyboardInterrupt", result
        assert session.execute("6 * 7", [0])[0].value == {"text/plain": "42"}

        with session.request([0]) as request:
            host.send_frame(Broadcast({"op": "exec", "id": request.rid, "code": long_cell, "count": 9}).for_host(host)
                            + Broadcast({"op": "interrupt", "id": request.rid}).for_host(host))
            message = {}
            while message.get("op") != "done":
                _, message, _ = request.inbox.get(10)
        assert message["status"] == "interrupted"

        process = host.process._proc
        host.send({"op": "exec", "id": -1, "code": long_cell, "count": 10})
        process.stdin.close()  # the kernel's end of the host's requests: the session is gone
        process.wait(timeout=10)  # not the cell's 30 s: ended (with its process group) as soon as it read the end
    finally:
        session.close()


def test_the_ops_table_is_what_the_agent_dispatches():
    """host/protocol.OPS is the one list of which thread answers each op: the agent runs exactly its
    MAIN ops as requests (an ``op_`` method each) and answers its SIDE ops where they are read."""
    from tpunb.host import agent as host_agent
    from tpunb.host.profiler import OPS as PROFILE_OPS
    from tpunb.host.relay import OPS as RELAY_OPS
    from tpunb.host.spread import OPS as FETCH_OPS

    requests = {name[3:] for name in dir(host_agent.Agent) if name.startswith("op_")}  # its mixins' too (exchange)
    assert requests == protocol.MAIN_THREAD_OPS
    assert set(PROFILE_OPS) | set(RELAY_OPS) | set(FETCH_OPS) <= {op for op, thread in protocol.OPS.items() if thread == protocol.SIDE}
    seen: list = []
    stub = SimpleNamespace(
        arriving={}, lent=set(), jax=None, send=seen.append, channel=SimpleNamespace(heartbeat=seen.append),
        profiler=SimpleNamespace(handle=seen.append), fetches=SimpleNamespace(handle=lambda m, b: seen.append(m)),
        relay=SimpleNamespace(handle=lambda m: seen.append(m) or None),
        _take_part=lambda message, blob: seen.append(message), _interrupt_cell=seen.append,
        _set_metrics_interval=seen.append)
    for op in protocol.MAIN_THREAD_OPS | {"no_such_op"}:
        assert host_agent.Agent._dispatch(stub, {"op": op, "id": 1}, b"") is True, op
    assert not seen  # a request is left to the main loop, untouched
    for op in ("part", "interrupt", "heartbeat", "metrics_interval", "start_jax", "release", *PROFILE_OPS, *RELAY_OPS,
               *FETCH_OPS):
        assert host_agent.Agent._dispatch(stub, {"op": op, "id": 1}, b"") is False, op
    assert len(seen) == 4 + len(PROFILE_OPS) + len(RELAY_OPS) + len(FETCH_OPS)  # part, interrupt, heartbeat, metrics_interval
