"""The engine's public request (tpunb.engine.request): a cell on a thread of its own, stopped
from another thread; the hooks a running request offers (which hosts finished and when, which
ones did not stop before SIGTERM); and which hosts a running request holds."""
from __future__ import annotations

import os
import queue
import threading
import time
from types import SimpleNamespace

import pytest

from tests.conftest import wait_for
from tpunb.display import OutputSink
from tpunb.engine.request import Requests
from tpunb.engine.routes import Frame
from tpunb.errors import CellInterrupted
from tpunb.engine.session import Session
from tpunb.transport.pipes import LocalTransport


@pytest.fixture
def session():
    made = Session([LocalTransport(f"local:{i}") for i in range(2)],
                   lambda i: {"env": {"TPUNB_HOST_INDEX": str(i)}, "ipython": False})
    made.start()
    yield made
    made.close()


class _Said(OutputSink):
    """Lines the hosts printed, as they arrive."""

    def __init__(self) -> None:
        self.text: dict[int, str] = {}

    def stream(self, host: int, name: str, text: str) -> None:
        self.text[host] = self.text.get(host, "") + text


def test_a_background_cell_is_held_interrupted_from_another_thread_and_gives_its_result(session):
    said = _Said()
    cell = session.cell("import time\nprint('running', flush=True)\ntime.sleep(60)", [0, 1], sink=said).start()
    wait_for(lambda: all("running" in said.text.get(i, "") for i in (0, 1)), 30, "both hosts to run the cell")
    assert not cell.done() and session.holding([1]) == [cell] and cell.holds([0, 1])
    # meanwhile this thread asks the hosts something they answer beside the cell, and is not held
    replies = session.call([0, 1], {"op": "diagnose", "probe_s": 0.1}, timeout=30)
    assert sorted(replies) == [0, 1] and not cell.done()
    threading.Thread(target=cell.interrupt).start()  # from yet another thread
    assert cell.wait(15), "the interrupted cell did not end"
    with pytest.raises(CellInterrupted) as raised:
        cell.result()
    assert {i: r.status for i, r in raised.value.results.items()} == {0: "interrupted", 1: "interrupted"}
    assert session.holding([0, 1]) == [] and not cell.holds([0, 1])
    again = session.cell("6 * 7", [0, 1]).start()
    assert {i: r.value for i, r in again.result(30).items()} == {0: {"text/plain": "42"}, 1: {"text/plain": "42"}}


def test_ticks_see_who_finished_and_on_stuck_sees_hosts_before_sigterm(session):
    """Host 0 answers at once; host 1 ignores the interrupt the deadline sends: ticks see host 0
    finished while host 1 runs, and on_stuck gets host 1 while its process still runs, before
    SIGTERM ends it."""
    session.interrupt_grace = 0.5
    seen: list[tuple[set, set]] = []
    stuck: list[tuple[list[int], bool]] = []
    pid = session.hosts[1].info["pid"]

    def on_stuck(request, hosts):
        stuck.append((hosts, os.path.exists(f"/proc/{pid}") and _state(pid) not in "ZX"))

    code = ("import os, signal, time\n"
            "if os.environ['TPUNB_HOST_INDEX'] == '1':\n"
            "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "    time.sleep(60)\n")
    request = session.cell(code, [0, 1], timeout=1.0, on_stuck=on_stuck,
                           on_tick=lambda r: seen.append((set(r.finished), set(r.pending))))
    results = request.run()
    assert ({0}, {1}) in seen  # a tick while host 0 was done and host 1 still ran
    assert request.finished[0] < request.finished[1] and request.elapsed() > 1.0
    assert stuck == [([1], True)]  # once, naming host 1, whose process had not been signalled yet
    assert (results[0].status, results[1].status) == ("ok", "killed") and request.killed == [1]
    assert request.stopped == "timeout" and request.stopped_hosts == [1]


def test_a_request_sent_along_a_route_collects_what_its_handler_keeps(session):
    replies = {}
    with session.request([0, 1], kind="pull", timeout=30) as request:
        request.send(Frame({"op": "diagnose", "probe_s": 0.1}))
        request.collect(lambda host, reply, blob: reply.get("op") == "done" and replies.setdefault(host, reply))
    request.raise_for_stop()
    assert sorted(replies) == [0, 1] and request.stopped is None and request.pending == set()
    with pytest.raises(RuntimeError, match="inside"):
        request.send(Frame({"op": "diagnose"}))


def _state(pid: int) -> str:
    raw = open(f"/proc/{pid}/stat", "rb").read()
    return raw[raw.rindex(b")") + 2:].decode()[0]


def test_quiet_means_no_request_open_for_the_whole_time():
    """Standbys are prepared ahead once a slice is quiet: an open request (a background cell)
    keeps it from being quiet however long it runs; its end starts the quiet time afresh."""
    requests = Requests()
    running = SimpleNamespace(rid=requests.next_id())
    requests.add(running)
    asked = []
    assert not requests.wait_quiet(0.0, lambda: len(asked) > 2 or asked.append(1))  # gave up while it ran
    requests.remove(running)
    assert not requests.wait_quiet(3600.0, lambda: len(asked) > 4 or asked.append(1))  # quiet for a moment only
    assert requests.wait_quiet(0.0, lambda: False)
    asked.clear()  # quiet counted from a later moment (a restart that just ended): not yet
    assert not requests.wait_quiet(0.0, lambda: len(asked) > 2 or asked.append(1), since=time.monotonic() + 3600)


def test_a_wait_wakes_for_the_frame_that_comes_not_for_a_token_an_earlier_frame_left():
    """A frame that found the inbox empty rings its token; taken without a wait, it leaves the token
    behind. The next wait used to wake to that token, find nothing and give up at once (a cell's
    ``done`` then read as silence: the flake of the sigio inbox test under load). It waits on for
    the frame, and a ring still ends a wait at once."""
    from tpunb.engine.ctrl_c import CtrlC, Inbox

    inbox, ctrl_c = Inbox(), CtrlC()
    inbox.put((0, {"op": "error"}, b""))
    assert inbox.get(10, ctrl_c)[1]["op"] == "error"  # taken without a wait: its token stays

    def put_while_waiting() -> None:
        given_up = time.monotonic() + 10
        while not ctrl_c.waiting and time.monotonic() < given_up:  # the consumer is inside its wait
            pass
        inbox.put((0, {"op": "done"}, b""))

    producer = threading.Thread(target=put_while_waiting, daemon=True)
    producer.start()
    assert inbox.get(10, ctrl_c)[1]["op"] == "done"
    producer.join()

    inbox.ring()
    with pytest.raises(queue.Empty):  # a ring ends the wait without a frame, not after 10 s
        inbox.get(10, ctrl_c)
