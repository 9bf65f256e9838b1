"""Grouping of per-host lines and values (pure logic, no hosts)."""
from __future__ import annotations

import io

from tpunb.display import CellOutput, LineMerger, format_hosts, render_values
from tpunb.results import HostResult


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_format_hosts():
    assert format_hosts([0, 1, 2, 3]) == "0-3"
    assert format_hosts([0, 2]) == "0,2"
    assert format_hosts([5, 0, 1, 2]) == "0-2,5"


def test_identical_lines_wait_for_every_host_then_print_once():
    merger = LineMerger([0, 1, 2])
    assert merger.feed(0, "a\nb\n") == []
    assert merger.feed(1, "a\n") == []
    assert merger.feed(2, "a\nc\n") == [([0, 1, 2], "a")]
    assert merger.feed(1, "b\n") == [([0, 1], "b"), ([2], "c")]


def test_a_slow_host_does_not_hold_output_back_for_long():
    clock = Clock()
    merger = LineMerger([0, 1], max_wait=0.25, clock=clock)
    assert merger.feed(0, "early\n") == []
    clock.now = 0.1
    assert merger.tick() == []
    clock.now = 0.3
    assert merger.tick() == [([0], "early")]


def test_finished_hosts_do_not_block_the_others_and_partial_lines_flush():
    merger = LineMerger([0, 1])
    assert merger.host_done(1) == []
    assert merger.feed(0, "only me\n") == [([0], "only me")]
    assert merger.feed(0, "no newline") == []
    assert merger.finish() == [([0], "no newline")]


def test_cell_output_caps_and_labels():
    out = io.StringIO()
    sink = CellOutput([0, 1], 2, cap_lines=3, out=out)
    sink.stream(0, "stdout", "".join(f"{i}\n" for i in range(5)))
    sink.stream(1, "stdout", "".join(f"{i}\n" for i in range(5)))
    sink.finish()
    lines = out.getvalue().splitlines()
    assert lines[:3] == ["[0-1] 0", "[0-1] 1", "[0-1] 2"]
    assert "output capped at 3 lines" in lines[3] and len(lines) == 5
    assert lines[4].startswith("[tpunb] 4 lines not shown here (host 0: 2 (4 bytes), host 1: 2 (4 bytes))")


def test_single_host_slices_are_not_labelled():
    out = io.StringIO()
    sink = CellOutput([0], 1, out=out)
    sink.stream(0, "stdout", "plain\n")
    sink.finish()
    assert out.getvalue() == "plain\n"


def test_values_collapse_and_rich_comes_from_host_zero():
    shown = []
    results = {h: HostResult(h, "ok", value={"text/plain": "1" if h < 3 else "2"}) for h in range(4)}
    render_values(results, "grouped", 4, show=lambda data, md: shown.append(data))
    assert shown == [{"text/plain": "Out[0-2]: 1"}, {"text/plain": "Out[3]: 2"}]
    shown.clear()
    rich = {h: HostResult(h, "ok", value={"text/plain": "T", "text/html": f"<b>{h}</b>"}) for h in range(2)}
    render_values(rich, "grouped", 2, show=lambda data, md: shown.append(data))
    assert shown == [{"text/plain": "Out[0-1]:"}, {"text/plain": "T", "text/html": "<b>0</b>"}]
