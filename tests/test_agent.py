"""The agent on its own: the plain runner (no IPython on the host) and the protocol check."""
from __future__ import annotations

import pytest

from tpunb.host import protocol
from tpunb.errors import ProtocolError
from tpunb.session import Session
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
    with pytest.raises(ProtocolError, match="agent protocol v2, this tpunb speaks v999"):
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
