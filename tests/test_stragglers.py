"""While a long cell runs, which hosts are done and which still run, and for how long: one line,
updated in place in a notebook, plain text in a terminal, nothing at all for fast cells."""
from __future__ import annotations

import pytest
import re

from tpunb.display import HostsProgress
from tests.test_display import Clock
from tests.test_kernel import execute, kernel  # noqa: F401 - the real-kernel fixture


def straggler_seconds(line: str) -> float:
    """How long the first progress line says host 1 has been running (first shown after 1 s)."""
    found = re.search(r"host 1 running (\d+\.\d) s", line)
    assert found, line
    return float(found.group(1))


def test_the_line_names_done_and_running_hosts_once_the_first_was_done_a_second():
    clock, shown = Clock(), []
    progress = HostsProgress([0, 1, 2, 3], clock=clock, publish=lambda text, final: shown.append((text, final)))
    clock.now += 1.1
    for host in (0, 1):
        progress.host_done(host)
    clock.now += 0.2
    progress.host_done(2)
    progress.tick()
    assert shown == []  # the first host finished 0.2 s ago: nothing yet
    clock.now += 0.9
    progress.tick()
    assert shown == [("hosts 0-2 done (1.1-1.3 s) · host 3 running 2.2 s", False)]
    clock.now += 10.5
    progress.tick()
    assert shown[-1] == ("hosts 0-2 done (1.1-1.3 s) · host 3 running 12.7 s", False)
    progress.host_done(3)
    progress.finish()
    assert shown[-1] == ("hosts 0-3 done (1.1-12.7 s)", True)


def test_a_fast_cell_shows_no_line():
    clock, shown = Clock(), []
    progress = HostsProgress([0, 1], clock=clock, publish=lambda text, final: shown.append(text))
    clock.now += 0.3
    progress.host_done(0)
    clock.now += 0.5
    progress.tick()
    progress.host_done(1)
    progress.finish()
    assert shown == []


def test_a_straggler_is_shown_as_plain_text_in_a_terminal_shell(make_slice, cell):
    make_slice(2)
    run = cell("%%on_tpu\nimport os, time\nif os.environ['TPUNB_HOST_INDEX'] == '1':\n    time.sleep(2.5)\n'done'")
    assert run.error is None, run.shown
    lines = [line for line in run.stdout.splitlines() if line.startswith("[tpunb] host 0 done")]
    assert lines and 1.0 <= straggler_seconds(lines[0]) < 2.5, run.stdout
    fast = cell("%%on_tpu\n'quick'")
    assert "[tpunb]" not in fast.shown


@pytest.mark.fresh_slice
def test_straggler_and_laggard_lines_update_in_place_in_a_notebook(kernel):  # noqa: F811 - the fixture
    manager, client = kernel
    reply, _ = execute(client, "%load_ext tpunb\n%tpu_launch v4-16")
    assert reply["status"] == "ok"
    reply, outputs = execute(client, "%%on_tpu\nimport os, time\nif os.environ['TPUNB_HOST_INDEX'] == '1':\n"
                                     "    time.sleep(3)\n'done'")
    assert reply["status"] == "ok"
    texts = [o.get("data", {}).get("text/plain", "") for o in outputs]
    shown = [o for o, text in zip(outputs, texts) if text.startswith("[tpunb] host")]
    assert shown[0]["data"]["text/plain"].startswith("[tpunb] host 0 done (0.")
    assert 1.0 <= straggler_seconds(shown[0]["data"]["text/plain"]) < 3.0
    display_id = shown[0]["transient"]["display_id"]
    updates = [o for o in shown[1:] if o.get("transient", {}).get("display_id") == display_id]
    assert updates, "the line is updated in place, not printed again"
    assert updates[-1]["data"]["text/plain"].startswith("[tpunb] hosts 0-1 done (")
    assert not any(", at " in o["data"]["text/plain"] for o in shown), "3 s is no laggard (10 s at least)"

    execute(client, "import tpunb.stuck.laggards as l\nl.AT_LEAST = 1.0")  # a laggard after 1 s, not 10
    reply, outputs = execute(client, "%%on_tpu\nimport os, time\ndef slow_step():\n    time.sleep(4)\n"
                                     "if os.environ['TPUNB_HOST_INDEX'] == '1':\n    slow_step()\n'done'")
    assert reply["status"] == "ok"
    lines = [o for o in outputs if o.get("data", {}).get("text/plain", "").startswith("[tpunb] host")]
    display_id = lines[0]["transient"]["display_id"]
    assert all(o.get("transient", {}).get("display_id") == display_id for o in lines), "one line, in place"
    where = [o["data"]["text/plain"] for o in lines if ", at " in o["data"]["text/plain"]]
    assert where and re.search(r"· host 1 running \d\.\d s, at In\[\d+\]:3 slow_step$", where[0]), where
    assert lines[-1]["data"]["text/plain"].startswith("[tpunb] hosts 0-1 done (")
    reply, outputs = execute(client, "%%on_tpu\n'quick'")
    assert not any("[tpunb]" in o.get("data", {}).get("text/plain", "") for o in outputs)
    execute(client, "%tpu_down")


def test_the_line_says_where_laggards_are():
    clock, shown = Clock(), []
    progress = HostsProgress([0, 1, 2, 3], clock=clock, publish=lambda text, final: shown.append(text))
    clock.now += 0.5
    progress.host_done(0)
    progress.host_done(1)
    clock.now += 11.0
    progress.tick()
    progress.laggards({2: "train.py:42 step -> psum", 3: "data.py:88 next_batch"})
    clock.now += 0.1
    progress.tick()
    assert shown[-1] == ("hosts 0-1 done (0.5 s) · hosts 2-3 running 11.6 s (2 at train.py:42 step -> psum; "
                         "3 at data.py:88 next_batch)")
    progress.laggards({2: "train.py:42 step -> psum", 3: "train.py:42 step -> psum"})
    clock.now += 0.1
    progress.tick()
    assert shown[-1].endswith("running 11.7 s (2-3 at train.py:42 step -> psum)")
    progress.host_done(2)
    clock.now += 0.1
    progress.tick()
    assert shown[-1].endswith("· host 3 running 11.8 s, at train.py:42 step -> psum")


def test_laggards_are_the_hosts_far_behind_the_finished_ones():
    from types import SimpleNamespace

    from tpunb.stuck.laggards import lagging

    def request(finished: dict, pending: set):
        return SimpleNamespace(started=100.0, finished=finished, pending=pending)

    assert lagging(request({0: 101.0}, {1}), 109.9) == []  # 10 s at least
    assert lagging(request({0: 101.0}, {1}), 110.0) == [1]
    assert lagging(request({0: 105.0, 2: 104.0}, {1, 3}), 114.0) == []  # 3x the slowest finished host's 5 s
    assert lagging(request({0: 105.0}, {1, 3}), 115.0) == [1, 3]
    assert lagging(request({}, {0, 1}), 200.0) == [] and lagging(request({0: 101.0}, set()), 200.0) == []


@pytest.mark.fresh_slice
def test_a_laggard_is_shown_where_it_is_once_in_a_terminal(make_slice, cell, monkeypatch):
    from tpunb.stuck import laggards

    monkeypatch.setattr(laggards, "AT_LEAST", 1.0)
    make_slice(2)
    run = cell("%%on_tpu\nimport os, time\ndef slow_step():\n    time.sleep(4)\n"
               "if os.environ['TPUNB_HOST_INDEX'] == '1':\n    slow_step()\n'done'")
    assert run.error is None, run.shown
    said = [line for line in run.stdout.splitlines() if ", at " in line]
    assert len(said) == 1, run.stdout
    assert re.fullmatch(r"\[tpunb\] host 0 done \(\d\.\d s\) · host 1 running \d\.\d s, at In\[\d+\]:3 slow_step",
                        said[0]), said
