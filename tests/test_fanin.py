"""One thread reads every local host's frames (tpunb.transport.fanin): frames cut from any split of the
bytes, and hosts that die or freeze in the middle of a frame while the other hosts go on being
read (on local hosts, read by that thread, and SSH hosts, read by a thread each)."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

import pytest

from tpunb.errors import HostDiedError
from tpunb.transport.fanin import FanIn, FrameCutter
from tpunb.host import protocol
from tests.conftest import wait_for

FRAMES = [({"op": "stream", "id": 1, "name": "stdout", "text": "héllo\n" * n}, b"") for n in range(5)] + \
         [({"op": "done", "id": 1}, bytes(range(256)) * 40), ({"op": "beat"}, b"")]

#: a cell in which host 1 writes the first part of a 1 MB frame on its frame channel, then ``{after}``;
#: the other hosts print a line and finish
HALF_A_FRAME = """%%on_tpu
import gc, os, signal, struct, time
if os.environ["TPUNB_HOST_INDEX"] == "1":
    while not all(os.path.exists(f"{flags}/{{h}}") for h in (0, 2, 3)):  # the others printed first
        time.sleep(0.01)
    channel = next(o for o in gc.get_objects() if type(o).__name__ == "Channel" and hasattr(o, "out_fd"))
    os.write(channel.out_fd, struct.pack("!II", 1 << 20, 0) + b"{{" * 1000)
    {after}
print("fine", flush=True)
open(f"{flags}/" + os.environ["TPUNB_HOST_INDEX"], "w").close()
"""


def test_frames_are_cut_whatever_the_pieces_they_arrive_in():
    """JSON and marshal frames alike (an agent changes to marshal after its first frames)."""
    stream = b"".join(protocol.encode(m, b, fast=i % 2 == 1) for i, (m, b) in enumerate(FRAMES))
    rng = random.Random(15)
    for _ in range(50):
        cutter, got, at = FrameCutter(), [], 0
        while at < len(stream):
            size = rng.choice([1, 2, 7, 8, 9, 100, 4096, len(stream)])
            got += cutter.feed(stream[at:at + size])
            at += size
        assert got == FRAMES and not cutter.inside_frame


def test_bytes_that_are_not_frames_raise():
    with pytest.raises(ValueError):
        FrameCutter().feed(b"\xff" * 16)


def test_one_thread_reads_many_processes_and_says_how_each_ended():
    """Real processes: one sends whole frames and exits, one dies inside a frame, one stays."""
    fanin = FanIn()
    whole = b"".join(protocol.encode(m, b) for m, b in FRAMES)
    programs = {
        "clean": f"import os; os.write(1, {whole!r})",
        "broken": f"import os; os.write(1, {whole[:-3]!r})",
        "silent": "import sys; sys.stdin.read()",
    }
    procs = {name: subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
             for name, code in programs.items()}
    frames: dict[str, list] = {name: [] for name in procs}
    ends: dict[str, str] = {}
    streams = {name: fanin.add(p.stdout.fileno(), frames[name].extend, lambda why, n=name: ends.__setitem__(n, why))
               for name, p in procs.items()}
    try:
        wait_for(lambda: {"clean", "broken"} <= set(ends), 30, "both ends to be seen")
        assert frames["clean"] == FRAMES and ends["clean"] == ""
        assert frames["broken"] == FRAMES[:-1]
        assert ends["broken"] == "broken stream: stream ended inside a frame"
        assert "silent" not in ends
        assert fanin.remove(streams["silent"]) and not fanin.remove(streams["silent"])
        assert not fanin.remove(streams["clean"])  # it had already ended
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
            p.stdout.close()
            p.stdin.close()
        fanin.close()
    assert "silent" not in ends  # removed, never ended by the reader


def test_closing_ends_a_stream_still_registered_so_its_waiter_hears_at_once():
    """A host started while its session closed (a revival racing a delete): the close ends its
    stream, so a handshake waiting on it fails now instead of at its 120 s timeout. Streams removed
    before the close are not ended again."""
    fanin = FanIn()
    procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE) for _ in range(2)]
    ends: dict[int, str] = {}
    try:
        streams = [fanin.add(p.stdout.fileno(), lambda frames: None, lambda why, i=i: ends.__setitem__(i, why))
                   for i, p in enumerate(procs)]
        assert fanin.remove(streams[0])
        fanin.close()
        assert ends == {1: "its slice's host sessions were closed"}  # said by close() itself, before it returned
        with pytest.raises(Exception, match="closed"):
            fanin.add(procs[0].stdout.fileno(), lambda frames: None, lambda why: None)
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdout.close()
            p.stdin.close()


@pytest.mark.parametrize("make_slice", ["local"], indirect=True)
@pytest.mark.fresh_slice
def test_local_hosts_share_one_reader_thread(make_slice, cell):
    before = set(threading.enumerate())
    sl = make_slice(4)
    assert "Out[0-3]: 4" in cell("%%on_tpu\n4").shown
    new = [t for t in threading.enumerate() if t not in before and t.name.startswith(("tpunb-host-", "tpunb-fanin"))]
    assert new == [sl.session.fanin._thread]  # no thread of its own for any host


@pytest.mark.fresh_slice
def test_host_dying_inside_a_frame_fails_the_cell_and_others_are_read(patient_grouping, make_slice, cell, flags):
    make_slice(4)
    cell("%%on_tpu\nkept = 1")
    run = cell(HALF_A_FRAME.format(after="os._exit(1)", flags=flags))
    assert isinstance(run.error, HostDiedError), run.shown
    assert "host 1 died" in str(run.error) and "stream ended inside a frame" in str(run.error)
    assert "[0,2-3] fine" in run.shown
    after = cell("%%on_tpu\n'kept' in globals()")  # host 1 restarted, the others untouched
    assert "Out[0,2-3]: True" in after.shown and "Out[1]: False" in after.shown


@pytest.mark.fresh_slice
def test_host_freezing_inside_a_frame_is_given_up_while_others_run(patient_grouping, make_slice, cell, flags):
    sl = make_slice(4)
    sl.heartbeat_timeout = 1.5
    started = time.perf_counter()
    run = cell(HALF_A_FRAME.format(after="os.kill(os.getpid(), signal.SIGSTOP)", flags=flags))
    assert isinstance(run.error, HostDiedError), run.shown
    assert "host 1 stopped answering" in str(run.error)
    assert time.perf_counter() - started < 1.5 + 5
    # while host 1 held half a frame, the others' frames were read: their cell finished as usual
    assert [run.error.results[h].status for h in (0, 2, 3)] == ["ok", "ok", "ok"] and "[0,2-3] fine" in run.shown
    assert "Out[0-3]: 3" in cell("%%on_tpu\n3").shown
