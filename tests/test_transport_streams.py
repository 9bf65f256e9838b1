"""A transport's generic streams (tpunb/transport/streams.py): what a transport without SSH channels
offers for %tpu_sync (tpunb's own SFTP server, sftp_server.py) and forwards (a relay program),
both started with ``spawn`` alone. Driven here through local host processes, which have ``spawn``
and nothing else used: the same code a exec-channel host runs (tests/test_exec_backend.py)."""
from __future__ import annotations

import socket
import threading

import pytest

from tpunb.errors import TransportError
from tpunb.transport.pipes import LocalTransport
from tpunb.transport.sync import MANIFEST, sync_tree
from tests.test_sync import EXCLUDE, EXPECTED, remote_files, tree  # noqa: F401 (tree: the fixture)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """The hosts' login directory: where SFTP's relative paths start."""
    place = tmp_path / "home"
    place.mkdir()
    monkeypatch.setenv("HOME", str(place))
    return place


def test_the_generic_file_stream_syncs_only_what_changed_into_the_home_directory(tree, home):  # noqa: F811
    transports = [LocalTransport(f"local:{i}") for i in range(2)]
    first = sync_tree(transports, tree, ["~/a", "b/c"], exclude=EXCLUDE)
    dests = [home / "a", home / "b" / "c"]
    assert first.files_sent == 2 * len(EXPECTED)
    for dest in dests:
        assert remote_files(dest) == EXPECTED and (dest / MANIFEST).is_file()
        for rel in EXPECTED:
            assert (dest / rel).read_bytes() == (tree / rel).read_bytes()
            assert int((dest / rel).stat().st_mtime) == int((tree / rel).stat().st_mtime)
        assert (dest / "run.sh").stat().st_mode & 0o777 == 0o755

    (tree / "new.py").write_text("new\n")
    (tree / "pkg" / "deep" / "er" / "leaf.txt").unlink()
    (dests[1] / "train.py").write_text("edited on the host\n")
    again = sync_tree(transports, tree, ["~/a", "b/c"], exclude=EXCLUDE)
    assert [h.sent for h in again.hosts] == [1, 2] and [h.deleted for h in again.hosts] == [1, 1]
    assert (dests[1] / "train.py").read_text() == (tree / "train.py").read_text()
    assert not (dests[0] / "pkg/deep/er/leaf.txt").exists() and (dests[0] / "new.py").read_text() == "new\n"


def test_a_host_whose_directory_cannot_be_made_is_named(tree, home):  # noqa: F811
    (home / "taken").write_text("a file where the directory should be")
    with pytest.raises(TransportError, match="sync failed on 1 of 1 hosts: local:0: cannot create directory taken"):
        sync_tree([LocalTransport("local:0")], tree, "taken")


@pytest.fixture
def upper_server():
    """A port on this machine that answers, once its client has finished writing, what it got in upper case."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        got = b""
        while chunk := conn.recv(65536):
            got += chunk
        conn.sendall(got.upper())
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def test_the_generic_stream_carries_both_ways_and_passes_a_half_close_on(upper_server):
    stream = LocalTransport("local:0").open_stream(upper_server, timeout=10)
    try:
        stream.sendall(b"hello " * 50_000)  # more than a pipe holds: the relay copies as it reads
        stream.shutdown_write()  # the server sees the end, then answers
        got = b""
        while chunk := stream.recv(65536):
            got += chunk
        assert got == b"HELLO " * 50_000
    finally:
        stream.close()


def test_a_port_nobody_answers_on_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TransportError, match=rf"^nothing answers on port {port} of local:0 \(Connection refused\)$"):
        LocalTransport("local:0").open_stream(port, timeout=10)
