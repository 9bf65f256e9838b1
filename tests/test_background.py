"""%%on_tpu --bg: the cell returns at once with a handle, its output streams into its own cell while
other cells run, other magics keep working, a second cell on its hosts is refused naming it (or
waits with --queue), and the kernel's stop button interrupts it. Through a real Jupyter kernel,
and the handle itself on local and sshd hosts."""
from __future__ import annotations

import queue
import re
import time

import pytest

from tpunb.errors import UsageError
from tests.conftest import wait_for
from tests.test_kernel import kernel  # noqa: F401 - the real-kernel fixture


class Outputs:
    """Every output a kernel sends, by the cell (execute request) it belongs to, and each cell's reply."""

    def __init__(self, client) -> None:
        self.client = client
        self.by_cell: dict[str, list[dict]] = {}
        self.idle: set[str] = set()

    def run(self, code: str, timeout: float = 120) -> str:
        """Execute ``code`` and wait until the kernel is idle again; the cell's message id."""
        cell = self.client.execute(code)
        self.until(lambda: cell in self.idle, timeout)
        return cell

    def until(self, done, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; outputs so far: {self.by_cell}")
            try:
                msg = self.client.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            parent = msg["parent_header"].get("msg_id")
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                self.idle.add(parent)
            elif msg["msg_type"] in ("stream", "error", "display_data", "update_display_data", "execute_result"):
                self.by_cell.setdefault(parent, []).append(msg["content"])

    def text(self, cell: str) -> str:
        """What the cell shows, as text: streams, displays' and results' text, errors."""
        parts = []
        for content in self.by_cell.get(cell, []):
            parts.append(content.get("text") or content.get("data", {}).get("text/plain", "")
                         or f"{content.get('ename', '')}: {content.get('evalue', '')}")
        return "\n".join(parts)


@pytest.mark.fresh_slice
def test_a_background_cell_in_a_notebook(kernel):  # noqa: F811 - the fixture
    manager, client = kernel
    out = Outputs(client)
    out.run("%load_ext tpunb\n%tpu_launch v4-16")
    started = time.monotonic()
    bg = out.run("%%on_tpu --bg --output first\nimport os, time\ndef training_step(i):\n    time.sleep(1)\n"
                 "for i in range(5):\n    print('host', os.environ['TPUNB_HOST_INDEX'], 'step', i, flush=True)\n"
                 "    training_step(i)\n'done'")
    assert time.monotonic() - started < 10  # it returned at once (the cell itself takes 5 s)
    assert re.search(r"^<tpunb Run In\[2\] on hosts 0-1: running", out.text(bg), re.M), out.text(bg)

    other = out.run("import tpunb\nprint('still running:', not tpunb.last_run().done())\n"
                    "for _ in range(100):  # host 1 may be printing, not yet in its step\n"
                    "    if 'training_step' in tpunb.current().stacks(hosts=[1])[1].where:\n        break\n"
                    "%tpu_stacks --hosts 1\nprint(list(tpunb.status()['state']))\n%tpu_metrics")
    shown = out.text(other)
    assert "still running: True" in shown and "['running', 'running']" in shown, shown
    assert re.search(r"\[1\] main thread: In\[2\]:6 <module> -> In\[2\]:3 training_step$", shown, re.M), shown
    assert any("application/vnd.jupyter.widget-view+json" in c.get("data", {}) for c in out.by_cell[other])

    refused = out.run("%%on_tpu\n'second'")
    assert re.search(r"UsageError: hosts 0-1 are busy with cell In\[2\] \('import os, time'\), running in the "
                     r"background for \d+ s: .* add --queue", out.text(refused)), out.text(refused)
    queued = out.run("%%on_tpu --queue\n'after it'")
    assert "Out[0-1]: 'after it'" in out.text(queued)

    lines = out.text(bg)  # all of it arrived in the background cell's own output area, before the queued one ran
    assert [f"host 0 step {i}" in lines for i in range(5)] == [True] * 5, lines
    assert "host 1" not in lines and "Out[0]: 'done'" in lines  # --output first, as in the foreground

    waiting = out.run("%%on_tpu --bg\nimport time\ndef resting():\n    time.sleep(60)\nresting()")
    out.run("import tpunb\ntpunb.last_run().stacks()")  # it is in resting(): the hosts have the cell
    pressed = time.monotonic()
    manager.interrupt_kernel()  # the stop button, while no cell runs
    out.until(lambda: "CellInterrupted" in out.text(waiting), 30)
    assert time.monotonic() - pressed < 15  # the interrupt ended the 60 s sleep; none was killed (below)
    assert "interrupted on hosts 0-1; their state is kept" in out.text(waiting)
    after = out.run("r = tpunb.last_run()\nprint(r.done(), sorted(set(h.status for h in r.result().values())))")
    assert "True ['interrupted']" in out.text(after)
    out.run("%tpu_down")


def test_the_handle(make_slice, cell):
    sl = make_slice(2)
    run = sl.run("import time\ndef resting():\n    time.sleep(60)\nresting()", background=True, output=None)
    assert not run.done() and not run.wait(0.1)
    with pytest.raises(TimeoutError, match="still runs on hosts 0-1"):
        run.result(timeout=0)
    stacks = wait_for(lambda: (lambda s: s if all(w.endswith("resting") for w in s.where().values()) else None)(
        run.stacks()), 60, "both hosts in resting()")
    assert re.fullmatch(r"In\[\d+\]:4 <module> -> In\[\d+\]:3 resting", stacks.where()[0])
    with pytest.raises(UsageError, match="busy with cell"):
        sl.push({"x": 1})
    assert "busy with cell" in str(cell("%%on_tpu --hosts 1\n1").error)
    run.interrupt()
    assert run.wait(30) and run.done()
    assert {h: r.status for h, r in run.result().items()} == {0: "interrupted", 1: "interrupted"}
    assert "Out[0-1]: 2" in cell("%%on_tpu\n1 + 1").shown  # the hosts are free again, their state kept


def test_the_handle_is_a_future_also_while_it_waits_its_turn(make_slice):
    """asyncio.wrap_future, as_completed and add_done_callback work on it (as on ipyparallel's
    AsyncResult), from the start, and for a --queue cell before its request exists."""
    import asyncio
    import concurrent.futures
    import threading

    sl = make_slice(2)
    gate = sl.run("import time\ndef holding():\n    time.sleep(60)\nholding()", background=True, output=None)
    queued = sl.run("21 * 2", background=True, output=None, queue=True)
    assert isinstance(queued, concurrent.futures.Future) and queued.request is None  # waiting for the first
    assert queued.cancel() is False and not queued.cancelled()  # interrupt() stops a cell, cancel() never
    called, seen = threading.Event(), []
    queued.add_done_callback(lambda f: (seen.append(f.result()), called.set()))
    wait_for(lambda: all(w.endswith("holding") for w in gate.stacks().where().values()), 60, "both hosts in holding()")
    gate.interrupt()
    finished = [f for f in concurrent.futures.as_completed([gate, queued], timeout=60)]
    assert set(finished) == {gate, queued}
    assert called.wait(10) and seen[0].reprs == {0: "42", 1: "42"}

    async def awaited():
        return await asyncio.wrap_future(sl.run("6 * 7", background=True, output=None))

    assert asyncio.run(awaited()).reprs == {0: "42", 1: "42"}



HOLDS_THE_GIL = """import ctypes, os
if os.environ['TPUNB_HOST_INDEX'] == '1':
    open({flag!r}, 'w').close()
    nothing_comes = os.open({fifo!r}, os.O_RDWR)
    ctypes.PyDLL(None).read(nothing_comes, ctypes.create_string_buffer(1), 1)  # in C with the GIL held, for good
else:
    import time
    time.sleep(60)
"""


@pytest.mark.parametrize("make_slice", ["local"], indirect=True)
@pytest.mark.fresh_slice
def test_a_restart_during_an_interrupts_grace_says_the_restart_ended_the_cell(make_slice, cell, flags, capsys,
                                                                               monkeypatch):
    """Host 1 holds the GIL (a read in C), so an interrupt cannot stop it; %tpu_restart of host 1
    comes during the interrupt's grace, and the grace ends (a second press) while the restart waits
    for host 1's agent to exit (its watchdog ends it). The cell says the restart ended it there, not
    where a host that no longer runs it "was"; its handle's result says the same."""
    import os
    import threading

    from tpunb.stuck import restart

    # host 1's agent ends by its watchdog (2 s after its input closes), not by the restart's kill at
    # EXIT_GRACE: the second press falls in that window
    monkeypatch.setattr(restart, "EXIT_GRACE", 60.0)
    sl = make_slice(2)
    sl.heartbeat_timeout = 0  # host 1 cannot beat while it holds the GIL
    sl.session.interrupt_grace = 60.0  # the grace ends when the second press ends it
    os.mkfifo(flags / "never")
    run = sl.run(HOLDS_THE_GIL.format(flag=str(flags / "in"), fifo=str(flags / "never")), background=True)
    wait_for(lambda: (flags / "in").exists(), 60, "host 1 in its read")
    agent = sl.session.hosts[1]
    run.interrupt()

    def second_press() -> None:
        wait_for(lambda: not agent.alive, 60, "the restart to end host 1's agent")
        run.interrupt()  # the grace ends while the restart still waits for host 1 to exit

    pressing = threading.Thread(target=second_press, daemon=True)
    pressing.start()
    restarted = cell("%tpu_restart --hosts 1")
    pressing.join(60)
    assert "[tpunb] restarted host 1 of" in restarted.stdout, restarted.shown
    result = run.result(timeout=60)
    assert {h: r.status for h, r in result.items()} == {0: "interrupted", 1: "died"}, result.notes()
    restart_line = "host 1 was restarted (%tpu_restart) while the cell ran: the cell's work there is lost"
    assert result.notes() == [restart_line], result.notes()
    # the cell's output and its error (outside a kernel, in whatever captures output as they come: the restart's cell)
    said = restarted.shown + "".join(capsys.readouterr())
    assert restart_line in said and "was at" not in said and "not started" not in said, said
    assert "Out[0-1]: 2" in cell("%%on_tpu\n1 + 1").shown


@pytest.mark.parametrize("make_slice", ["local"], indirect=True)
def test_a_request_made_outside_background_cells_holds_its_hosts_by_the_same_rule(make_slice, cell):
    """Session.holding is the one answer to "are these hosts busy": a request opened on the session
    itself (on this thread, no background cell) makes a background cell, a cell and a push on its
    host refuse in one line, leaves the other host free, and a --queue cell waits for it."""
    sl = make_slice(2)
    with sl.session.request([1], kind="exec") as held:
        assert sl.session.holding([0, 1]) == [held] and sl.session.holding([0]) == []
        busy = r"host 1 is busy with another exec request \(running for \d+ s\): wait for it to end, or add --queue"
        with pytest.raises(UsageError, match=busy):
            sl.run("1", background=True)
        assert re.search(busy, str(cell("%%on_tpu\n1").error))
        with pytest.raises(UsageError, match=busy):
            sl.push({"x": 1}, hosts=[1])
        assert sl.run("'free'", hosts=[0], output=None).reprs == {0: "'free'"}
        queued = sl.run("6 * 7", background=True, output=None, queue=True)
        assert queued.request is None and not queued.done()
    assert queued.result(30).reprs == {0: "42", 1: "42"} and sl.session.holding([0, 1]) == []


@pytest.mark.parametrize("make_slice", ["local"], indirect=True)
def test_the_managers_stop_button_interrupts_running_and_waiting_background_cells(make_slice):
    """What the kernel's stop button calls between cells (the SliceManager's handler): every held
    slice's background cells are interrupted, the one running and the one waiting its turn, which
    then never runs. Outside a Jupyter kernel the manager installs no handler."""
    from tpunb import manager

    sl = make_slice(2)
    running = sl.run("import time\ndef resting():\n    time.sleep(60)\nresting()", background=True, output=None)
    waiting = sl.run("'never'", background=True, output=None, queue=True)
    wait_for(lambda: all(w.endswith("resting") for w in running.stacks().where().values()), 60, "both hosts resting")
    assert manager.MANAGER.stop_button is None  # no kernel here: Ctrl-C belongs to the prompt
    manager.MANAGER.interrupt_background(2, None)
    assert {h: r.status for h, r in running.result(30).items()} == {0: "interrupted", 1: "interrupted"}
    assert waiting.wait(30) and re.search(r"interrupted before it started", str(waiting.exception()))
