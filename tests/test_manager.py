"""Slice lifecycle: the registry, several slices, re-attaching after a kernel restart, down."""
from __future__ import annotations

import os
import stat

import pandas as pd
import pytest

import tpunb
from tpunb import manager
from tpunb.errors import NoSliceError, UsageError
from tpunb.registry import Registry
from tests.conftest import wait_for


@pytest.mark.fresh_slice
def test_status_lists_slices_and_hosts_as_a_dataframe(cell, ip):
    cell("%tpu_launch v4-16 --name alpha")
    cell("%tpu_launch v4-8 --name beta")
    run = cell("%tpu_status")
    frame = ip.user_ns["_"]
    assert list(frame["slice"]) == ["alpha", "alpha", "beta"]
    assert list(frame["host"]) == [0, 1, 0]
    assert list(frame["state"]) == ["running"] * 3
    assert list(frame["current"]) == ["", "", "*"]  # the last launched is current
    assert run.error is None


@pytest.mark.fresh_slice
def test_several_slices_and_slice_flag(cell):
    cell("%tpu_launch v4-16 --name alpha")
    cell("%tpu_launch v4-32 --name beta")
    assert "Out[0-3]: 4" in cell("%%on_tpu\nimport os\nint(os.environ['TPUNB_NUM_HOSTS'])").shown
    assert "Out[0-1]: 'alpha'" in cell("%%on_tpu --slice alpha\nimport os\nos.environ['TPUNB_SLICE']").shown
    cell("%tpu_use alpha")
    assert "Out[0-1]: 2" in cell("%%on_tpu\nimport os\nint(os.environ['TPUNB_NUM_HOSTS'])").shown


@pytest.mark.fresh_slice
def test_registry_persists_under_tpunb_home_without_secrets(isolated_home):
    manager.launch("v4-16", name="kept", env={"TOKEN": "hunter2-secret"})
    path = isolated_home / "registry.db"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    record = Registry(path).get_slice("kept")
    assert record.accelerator == "v4-16" and record.backend == "local" and len(record.hosts) == 2
    assert b"hunter2-secret" not in path.read_bytes()


@pytest.mark.fresh_slice
def test_use_after_kernel_restart_restarts_local_hosts(cell, ip):
    cell("%tpu_launch v4-16 --name survivor")
    cell("%%on_tpu\nkept = 1")
    old_pids = [h.info["pid"] for h in manager.current().session.hosts]
    manager.detach_all()  # what a kernel restart does: this kernel's host processes end
    assert "no slice yet" in cell("%%on_tpu\npass").shown
    cell("%tpu_status")
    assert set(ip.user_ns["_"]["state"]) == {"stopped: its kernel ended (%tpu_use restarts it)"}
    run = cell("%tpu_use survivor")
    assert run.error is None
    assert "their state was lost" in run.stderr
    assert "current slice: survivor" in run.stdout
    assert [h.info["pid"] for h in manager.current().session.hosts] != old_pids
    assert "Out[0-1]: False" in cell("%%on_tpu\n'kept' in globals()").shown


@pytest.mark.fresh_slice
def test_use_unknown_slice_says_what_exists(cell):
    cell("%tpu_launch v4-8 --name known")
    run = cell("%tpu_use nosuch")
    assert "no slice named 'nosuch': known slices: known" in run.shown


@pytest.mark.fresh_slice
def test_down_is_idempotent_and_all(cell, isolated_home):
    cell("%tpu_launch v4-16 --name one")
    cell("%tpu_launch v4-8 --name two")
    pids = [h.info["pid"] for h in manager.current("one").session.hosts]
    assert "deleted one" in cell("%tpu_down one").stdout
    assert "already down" in cell("%tpu_down one").stdout
    assert cell("%tpu_down one").error is None
    for pid in pids:  # the host processes are gone, not orphaned
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert "deleted two" in cell("%tpu_down --all").stdout
    assert Registry(isolated_home / "registry.db").list_slices() == []
    assert cell("%tpu_down --all").error is None


@pytest.mark.fresh_slice
def test_launch_name_clash_and_bad_names(cell):
    cell("%tpu_launch v4-8 --name taken")
    assert "a slice named 'taken' exists: attach with %tpu_use taken" in cell("%tpu_launch v4-8 --name taken").shown
    assert "slice name 'Bad_Name'" in cell("%tpu_launch v4-8 --name Bad_Name").shown
    second = manager.launch("v4-8")
    third = manager.launch("v4-8")
    assert (second.name, third.name) == ("v4-8", "v4-8-2")


@pytest.mark.fresh_slice
def test_python_api_mirrors_the_magics():
    sl = tpunb.launch("v4-16", name="api")
    result = sl.run("import os\nprint('hi')\nint(os.environ['TPUNB_HOST_INDEX'])", output=None)
    assert result.ok and result.reprs == {0: "0", 1: "1"} and result.stdout == {0: "hi\n", 1: "hi\n"}
    failed = sl.run("1/0", hosts="1", output=None)
    assert not failed.ok and failed[1].error["ename"] == "ZeroDivisionError" and list(failed) == [1]
    with pytest.raises(tpunb.TpunbError, match="ZeroDivisionError"):
        failed.raise_for_status()
    sl.push({"a": 2})
    assert sl.pull("a") == {0: 2, 1: 2}
    assert tpunb.use("api") is sl and tpunb.current() is sl
    assert "api" in set(tpunb.status()["slice"])
    sl.delete()
    with pytest.raises(NoSliceError):
        tpunb.current()
    with pytest.raises(UsageError):
        tpunb.launch("v4-8", backend="nowhere")


@pytest.mark.fresh_slice
def test_down_all_deletes_every_slice_it_can_and_names_the_one_it_cannot(cell, isolated_home):
    import subprocess
    import sys

    from tpunb.registry import HostRecord, SliceRecord

    other_kernel = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        reg = Registry(isolated_home / "registry.db")
        reg.save_slice(SliceRecord(name="aaa-theirs", accelerator="v4-8", backend="local", state="running",
                                   owner_pid=other_kernel.pid, hosts=[HostRecord(0, "localhost")]))
        cell("%tpu_launch v4-8 --name zzz-mine")  # sorted after the one that cannot be deleted here
        mine = [h.info["pid"] for h in manager.current().session.hosts]
        run = cell("%tpu_down --all")
        assert isinstance(run.error, UsageError)
        assert "deleted zzz-mine" in str(run.error) and "aaa-theirs" in str(run.error)
        assert [r.name for r in reg.list_slices()] == ["aaa-theirs"]
        for pid in mine:  # this kernel's host processes ended
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        other_kernel.kill()


@pytest.mark.fresh_slice
def test_tpu_status_shows_human_units_and_returns_the_raw_numbers(cell, ip):
    """A notebook reads 50.6 MiB and 1h30m; the DataFrame %tpu_status returns keeps bytes and seconds."""
    from tpunb.status import HostRow, frame
    from tpunb.units import format_bytes

    rows = [HostRow(slice="a", accelerator="v4-8", backend="local", host=0, address="localhost", state="running",
                    rss_bytes=53067776.0, memory_used_bytes=1177620420.0, uptime_s=5400.0, cpu_percent=12.3),
            HostRow(slice="a", accelerator="v4-8", backend="local", host=1, address="localhost", state="running")]
    table = frame(rows)
    assert table["rss_bytes"].tolist()[0] == 53067776.0 and table["uptime_s"].tolist()[0] == 5400.0
    html = table._repr_html_()
    for shown in ("50.6 MiB", "1.1 GiB", "1h30m", "12%"):
        assert shown in html
    assert all(raw not in text for raw in ("53067776", "1177620420", "5400") for text in (html, repr(table)))
    assert type(table[table["host"] == 0]) is pd.DataFrame  # what is derived from it is a plain DataFrame

    cell("%tpu_launch v4-16 --name units")
    sl = manager.current()
    wait_for(lambda: all(sl.metrics_store.latest_value(h, "rss_bytes") for h in (0, 1)), 30, "first samples")
    run = cell("%tpu_status")
    raw = ip.user_ns["_"]["rss_bytes"].tolist()
    assert all(isinstance(v, (int, float)) and v > 2**20 for v in raw), raw
    html = ip.user_ns["_"]._repr_html_()
    assert all(format_bytes(v) in html and str(int(v)) not in html for v in raw)
    assert not any(str(int(v)) in run.shown for v in raw), run.shown


def test_a_host_record_is_typed_and_an_older_or_newer_registry_still_loads(tmp_path):
    """HostInfo's fields are what the code reads; a registry row written by another tpunb version
    (keys it names differently or does not know) loads, and its unknown keys survive a save."""
    import json
    import sqlite3

    from tpunb.registry import HostInfo, HostRecord, SliceRecord

    reg = Registry(tmp_path / "registry.db")
    reg.save_slice(SliceRecord(name="old", accelerator="v4-16", backend="local", state="running",
                               hosts=[HostRecord(0, "localhost"), HostRecord(1, "localhost")]))
    with sqlite3.connect(tmp_path / "registry.db") as db:  # as an older (or newer) tpunb wrote them
        db.execute("UPDATE hosts SET info = ? WHERE idx = 0",
                   (json.dumps({"pid": 41, "needs_restart": True, "devices": 4, "watchdog": 7}),))
        db.execute("UPDATE hosts SET info = '{}' WHERE idx = 1")
    record = reg.get_slice("old")
    first, second = record.hosts[0].info, record.hosts[1].info
    assert (first.pid, first.needs_restart, first.devices, first.extra) == (41, True, 4, {"watchdog": 7})
    assert second == HostInfo()
    first.pid, first.needs_restart, first.stacks = 42, False, {"main": "/proc/42/fd/9"}
    reg.save_slice(record)
    again = reg.get_slice("old").hosts[0].info
    assert (again.pid, again.needs_restart, again.stacks, again.extra) == (42, False, {"main": "/proc/42/fd/9"},
                                                                           {"watchdog": 7})


@pytest.mark.fresh_slice
@pytest.mark.sandbox
def test_a_ctrl_c_while_agents_start_leaves_no_agent_running(isolated_home, monkeypatch, sshd, ssh_key):
    """A press ends the connect's wait for its hosts' agents and closes the slice; a host whose agent
    was still on its way (in its fan-out thread) reconnects and starts it after that close: it is
    ended there too, not left running on a host one brought, with nobody to end it."""
    import signal
    import threading

    from tpunb.engine import connection
    from tpunb.errors import CellInterrupted
    from tpunb.machine import procs

    launch, closed, late = connection.HostConnection.launch, threading.Event(), []

    def slow_launch(self, init=None):
        if self.index == 1:
            os.kill(os.getpid(), signal.SIGINT)  # the user's press while host 1's agent is on its way
            closed.wait(30)  # ... which starts only once the launch has given up and closed the slice
            try:
                launch(self, init)
            except BaseException as e:
                late.append(e)
                raise
            late.append(self.process)
            return
        launch(self, init)

    monkeypatch.setattr(connection.HostConnection, "launch", slow_launch)
    with pytest.raises(CellInterrupted, match="nothing is left running"):
        manager.connect([f"{a}:{sshd.port}" for a in sshd.addresses[:2]], key=str(ssh_key), python=sshd.python,
                        name="cut")
    closed.set()
    wait_for(lambda: late, 30, "host 1's late agent start")
    assert not isinstance(late[0], BaseException), repr(late[0])
    pid = late[0].pid
    wait_for(lambda: not procs.alive(pid), 30, "the late agent to be ended")
    assert Registry().list_slices() == []
