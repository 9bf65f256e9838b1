"""Bounded output: the notebook gets a capped view, the host logs get everything, the kernel keeps
a bounded tail, \r progress lines update in place, and nothing a cell prints or returns breaks the
stream. Pure rendering first, then real host processes through a real IPython shell."""
from __future__ import annotations

import io

import psutil
import pytest

import tpunb
from tpunb import manager
from tpunb.display import CellOutput, LineSplitter
from tpunb.errors import RemoteError
from tpunb.host import protocol
from tpunb.results import TAIL_CHARS, Tail
from tests.conftest import wait_for, wait_for_files


class Live:
    """Stands in for display/update_display: records every output and its updates."""

    def __init__(self) -> None:
        self.outputs: dict[str, list[str]] = {}

    def __call__(self, data: dict, display_id: str | None) -> str:
        display_id = display_id or f"bar-{len(self.outputs)}"
        self.outputs.setdefault(display_id, []).append(data["text/plain"])
        return display_id


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def sink(hosts=(0, 1), **kwargs):
    out, live = io.StringIO(), Live()
    return CellOutput(list(hosts), len(hosts), out=out, err=out, live=live, **kwargs), out, live


# -- the notebook's view, without hosts ----------------------------------------------------------
def test_the_byte_cap_stops_the_view_and_the_notice_counts_what_was_left_out():
    view, out, _ = sink(cap_lines=1000, cap_bytes=100)
    for host in (0, 1):
        view.stream(host, "stdout", "".join(f"{host} line {i}\n" for i in range(50)))
    view.finish()
    lines = out.getvalue().splitlines()
    shown = [line for line in lines if not line.startswith("[tpunb]")]
    assert sum(len(line) - len("[0] ") + 1 for line in shown) <= 100 and 0 < len(shown) < 20
    assert "output capped at 1,000 lines / 100 bytes" in lines[len(shown)]
    notice = lines[-1]
    hidden_0, hidden_1 = 50 - sum(line.startswith("[0]") for line in shown), 50 - sum(line.startswith("[1]") for line in shown)
    assert notice.startswith(f"[tpunb] {hidden_0 + hidden_1:,} lines not shown here (host 0: {hidden_0:,}")
    assert f"host 1: {hidden_1:,}" in notice


def test_a_host_over_its_own_cap_leaves_room_for_the_others():
    view, out, _ = sink(host_cap_lines=3)
    view.stream(0, "stdout", "".join(f"noisy {i}\n" for i in range(100)))
    view.stream(1, "stdout", "quiet 0\nquiet 1\n")
    view.finish()
    text = out.getvalue()
    assert text.count("[0] noisy") == 3 and "[1] quiet 0" in text and "[1] quiet 1" in text
    assert "97 lines not shown here (host 0: 97" in text


def test_carriage_return_rewrites_one_line_that_updates_in_place():
    clock = Clock()
    view, out, live = sink(hosts=(0,), clock=clock, live_interval=0.1)
    view.stream(0, "stdout", "before\n")
    for i in range(1, 101):
        clock.now = i * 0.01  # 100 updates over one second
        view.stream(0, "stdout", f"\r{i:3d}%|{'#' * (i // 10):10s}|")
    view.stream(0, "stdout", "\nafter\n")
    view.finish()
    assert out.getvalue() == "before\nafter\n"  # the bar is not in the stream...
    (updates,) = live.outputs.values()  # ...but in one output, updated in place
    assert updates[0] == "  1%|          |" and updates[-1] == "100%|##########|"
    assert 5 <= len(updates) <= 12  # throttled to about 10 a second, not 100
    assert view.printed == 3  # before, the bar, after: the bar counts as one line


def test_bars_of_several_hosts_share_one_output_and_a_new_bar_opens_another():
    view, out, live = sink(live_interval=0)
    for host in (0, 1):
        view.stream(host, "stdout", f"\rh{host} 50%\rh{host} 100%\n")
    view.stream(0, "stdout", "\rsecond bar\n")
    view.finish()
    first, second = live.outputs.values()
    assert first[-1] == "[0] h0 100%\n[1] h1 100%" and second[-1] == "[0] second bar"


def test_a_bar_waits_for_the_lines_printed_before_it():
    view, out, live = sink(live_interval=0)
    view.stream(0, "stdout", "start\n\rbar 1")
    assert live.outputs == {}  # host 0's "start" waits for host 1's: so does the bar
    view.stream(1, "stdout", "start\n")
    assert out.getvalue() == "[0-1] start\n" and list(live.outputs.values()) == [["[0] bar 1"]]


def test_a_huge_line_is_cut_for_the_notebook_and_never_held_whole():
    view, out, _ = sink(hosts=(0,), line_chars=1000)
    chunk = "y" * (1 << 20)
    for _ in range(20):  # a 20 MB line arriving in 1 MB frames
        view.stream(0, "stdout", chunk)
        assert len(view.splitters[("stdout", 0)].text) <= 1000
    view.stream(0, "stdout", "\n")
    view.finish()
    first = out.getvalue().splitlines()[0]
    assert first == "y" * 1000 + f"… [{20 * (1 << 20) - 1000:,} more characters in the log]"


def test_splitter_keeps_what_a_terminal_shows():
    splitter = LineSplitter()
    assert splitter.feed("abc\r") == ([], []) and splitter.live == "abc"
    assert splitter.feed("de") == ([], []) and splitter.live == "de"
    assert splitter.feed("\r\n") == (["de"], [0]) and splitter.live is None
    assert splitter.feed("plain\nmore") == (["plain"], []) and splitter.live is None
    assert splitter.end() == ("more", False)


def test_the_tail_is_bounded_and_says_so():
    tail = Tail(limit=1000)
    for i in range(100_000):
        tail.add(f"{i}\n")
    text = str(tail)
    assert len(text) == 1000 and text.endswith("99999\n") and tail.truncated
    assert not Tail().truncated


def test_frames_over_the_limit_are_refused_by_the_sender(monkeypatch):
    monkeypatch.setattr(protocol, "MAX_JSON", 1000)
    with pytest.raises(protocol.FrameTooLarge):
        protocol.encode({"op": "result", "data": {"text/plain": "x" * 2000}})


# -- real hosts ------------------------------------------------------------------------------------
def _log_lines(sl, host: int) -> int:
    with open(sl.cell_logs.path(host), "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


@pytest.mark.fresh_slice
def test_a_million_lines_per_host_reach_the_logs_with_the_kernel_bounded(patient_grouping, cell, isolated_home):
    sl = manager.launch("v4-16")
    kernel = psutil.Process()
    before = kernel.memory_info().rss
    run = cell('%%on_tpu\nfor i in range(1_000_000):\n    print(i, "x" * 20)')
    grew = kernel.memory_info().rss - before
    assert run.error is None, run.shown
    assert len(run.stdout) < 200_000  # the notebook's share: 2,000 lines and the notices
    # 2,000 lines shown, each printed by both hosts; the rest counted exactly, per host
    assert "[tpunb] 1,996,000 lines not shown here (host 0: 998,000 (26.5 MiB), host 1: 998,000" in run.stdout
    for host in (0, 1):
        assert _log_lines(sl, host) == 1_000_000 + 2  # every line, after the cell's two header lines
        result = tpunb.last_result()[host]
        assert result.stdout_truncated and len(result.stdout) == TAIL_CHARS
        assert result.stdout.endswith("999999 xxxxxxxxxxxxxxxxxxxx\n")
    assert grew < 100e6, f"the kernel grew by {grew / 1e6:.0f} MB"  # 2 x 27 MB went through it


def test_tqdm_on_hosts_is_one_updating_line_per_host(patient_grouping, make_slice, cell):
    sl = make_slice(2)
    run = cell("%%on_tpu\nimport sys, time\nfrom tqdm import tqdm\nprint('start')\n"
               "for _ in tqdm(range(20), file=sys.stdout, mininterval=0, ncols=60):\n    time.sleep(0.05)\nprint('end')")
    assert run.error is None, run.shown
    assert run.stdout.splitlines() == ["[0-1] start", "[0-1] end"]
    bars = [o.data["text/plain"] for o in run.outputs]
    final = bars[-1].splitlines()
    assert [line[:4] for line in final] == ["[0] ", "[1] "] and all("20/20" in line for line in final)
    assert all(o.update for o in run.outputs[1:]) and not run.outputs[0].update  # one output, updated
    assert any("/20 " in bar and "20/20" not in bar for bar in bars)  # seen while it ran
    assert len(bars) <= 30  # about 10 updates a second, not one per \r (2 hosts x 21)
    log = sl.cell_logs.path(1).read_bytes()
    assert log.count(b"\r") > 20 and b"20/20" in log  # the log has every update


def test_a_20_mb_line_is_cut_in_the_notebook_and_whole_in_the_log(make_slice, cell):
    sl = make_slice(2)
    run = cell("%%on_tpu\nprint('y' * 20_000_000)\nprint('next')")
    assert run.error is None, run.shown
    assert len(run.stdout) < 100_000
    assert "more characters in the log]" in run.stdout and "next" in run.stdout
    assert "y" * 20_000_000 + "\n" in sl.cell_logs.path(0).read_text()


def test_a_huge_value_is_capped_on_the_host_and_the_hosts_live_on(make_slice, cell):
    make_slice(2)
    assert cell("%%on_tpu\nkept = 7").error is None
    run = cell("%%on_tpu\nbytes(200_000_000)")
    assert run.error is None, run.shown[:2000]
    shown = run.shown
    assert 990_000 < len(shown) < 1_010_000  # one capped repr, shown once for both hosts
    assert "a bytes of length 200,000,000: its repr is cut at 999,800 characters" in shown
    after = cell("%%on_tpu\nkept + 1")
    assert after.error is None and "Out[0-1]: 8" in after.shown  # same processes, state kept


def test_a_huge_display_or_error_does_not_break_the_stream(patient_grouping, make_slice, cell):
    make_slice(2)
    run = cell("%%on_tpu\nfrom IPython.display import HTML, display\n"
               "display({'text/plain': 'z' * 50_000_000}, raw=True)\n"
               "display(HTML('<b>' + 'h' * 20_000_000 + '</b>'))")
    assert run.error is None, run.shown[:2000]
    texts = [o.data.get("text/plain", "") for o in run.outputs]
    assert len(texts[0]) < 1_100_000 and "more characters of 50,000,000 not sent" in texts[0]
    assert "text/html output over 16,000,000 characters not sent" in texts[1]
    failed = cell("%%on_tpu\nraise ValueError('e' * 300_000_000)")
    assert isinstance(failed.error, RemoteError) and len(failed.shown) < 5_000_000
    assert cell("%%on_tpu\nprint('alive')").stdout == "[0-1] alive\n"


@pytest.mark.fresh_slice
def test_output_printed_between_cells_is_capped_before_the_next_cell(cell, flags):
    sl = manager.launch("v4-16")
    go = flags / "go"
    started = cell("%%on_tpu\nimport os, threading, time\n"
                   f"def later():\n    while not os.path.exists({str(go)!r}):\n        time.sleep(0.01)\n"
                   "    for i in range(1000):\n        print('background', i)\n"
                   "threading.Thread(target=later).start()")
    assert started.error is None, started.shown
    go.touch()

    def backlog_lines() -> int:
        return sum(m["text"].count("\n") for _, m, _ in list(sl.session.backlog.queue) if m.get("op") == "stream")

    wait_for(lambda: backlog_lines() == 2000, what="both hosts' background output")
    run = cell("%%on_tpu\nprint('next')")
    lines = run.stdout.splitlines()
    assert sum("between cells] background" in line for line in lines) == 200
    assert "[tpunb] 1,800 more lines printed between cells are in" in run.stdout and lines[-1] == "[0-1] next"
    assert _log_lines(sl, 1) >= 1000


@pytest.mark.fresh_slice
def test_output_printed_just_before_a_cell_is_not_that_cells(cell, flags):
    """Between cells a host's stdout is flushed only every second (an idle host stays asleep);
    what a background thread printed before a cell starts is still shown as between-cell output."""
    manager.launch("v4-16")
    go, printed = flags / "go", flags / "printed"
    started = cell("%%on_tpu\nimport os, threading, time\n"
                   f"def later():\n    while not os.path.exists({str(go)!r}):\n        time.sleep(0.01)\n"
                   "    print('background', os.environ['TPUNB_HOST_INDEX'])\n"
                   f"    open({str(printed)!r} + os.environ['TPUNB_HOST_INDEX'], 'w').close()\n"
                   "threading.Thread(target=later).start()")
    assert started.error is None, started.shown
    go.touch()
    wait_for_files(flags, ["printed0", "printed1"])
    run = cell("%%on_tpu\nprint('next')")  # it starts while the lines may still wait in the hosts' buffers
    after = cell("%%on_tpu\nprint('after')")  # by now they arrived, before the first cell's end
    assert "[0-1] next" in run.stdout and "[0-1] after" in after.stdout
    assert not [line for line in run.stdout.splitlines() if line.startswith(("[0] background", "[1] background"))]
    shown = run.stdout + after.stdout
    assert "[0, between cells] background 0" in shown and "[1, between cells] background 1" in shown, shown
