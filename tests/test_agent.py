"""The agent on its own: the plain runner (no IPython on the host) and the protocol check."""
from __future__ import annotations

import pytest

from tpunb.host import protocol
from tpunb.errors import ProtocolError
from tpunb.session import OutputSink, Session
from tpunb.transport.local import LocalTransport


def test_plain_runner_without_ipython():
    session = Session([LocalTransport("local:0")], lambda i: {"env": {}, "ipython": False})
    session.start()
    try:
        assert session.hosts[0].info["runner"] == "plain"
        ok = session.execute("x = 6\nprint('out')\nx * 7", [0])[0]
        assert (ok.status, ok.stdout, ok.value) == ("ok", "out\n", {"text/plain": "42"})
        bad = session.execute("def f():\n    return 1 / 0\nf()", [0])[0]
        assert bad.status == "error" and bad.error["ename"] == "ZeroDivisionError"
        text = "\n".join(bad.error["traceback"])
        assert "return 1 / 0" in text and "tpunb" not in text  # the cell's lines, none of ours
        assert session.execute("x", [0])[0].value == {"text/plain": "6"}
    finally:
        session.close()


def test_protocol_version_mismatch_is_refused(monkeypatch):
    monkeypatch.setattr(protocol, "PROTOCOL_VERSION", 999)
    session = Session([LocalTransport("local:0")], lambda i: {"env": {}})
    with pytest.raises(ProtocolError, match="agent protocol v4, this tpunb speaks v999"):
        session.start()


def test_frames_round_trip():
    frame = protocol.encode({"op": "x", "text": "é"}, b"\x00blob")
    data = iter([frame])
    buffer = bytearray(next(data))

    def read_exact(n):
        out = bytes(buffer[:n])
        del buffer[:n]
        return out

    assert protocol.read_frame(read_exact) == ({"op": "x", "text": "é"}, b"\x00blob")
    assert protocol.read_frame(read_exact) is None


def test_tpunb_log_works_on_a_host_without_tpunb(tmp_path):
    """A host with only the agent (python -S: no site-packages, so no tpunb, no IPython)."""
    import queue
    import sys

    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
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
        while True:
            samples = frames.get(timeout=20)["samples"]
            logged = [s for s in samples if s[1] == "loss"]
            if logged:
                break
        assert logged[0][2:] == [0.25, None, 3]
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
        gate = tmp_path / "background"
        session.execute("import threading, time\n"
                        "threading.Thread(target=lambda: (time.sleep(0.2), print('waiting'))).start()", [0])
        result = session.execute(wait.format(gate=str(gate)).replace("print('waiting')\n", ""), [0],
                                 sink=_Gate(gate))[0]
        assert result.stdout.endswith("gate True\n"), result.stdout
    finally:
        session.close()
