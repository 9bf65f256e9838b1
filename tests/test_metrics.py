"""Live metrics: the agent's sampler on real host processes and real sshd hosts, the kernel's
ring, the DataFrame, %tpu_metrics and %tpu_status, and the TPU path against a real gRPC server."""
from __future__ import annotations

import threading

import pytest

from tests.conftest import wait_for
from tpunb import report, manager
from tpunb.metrics import MetricsStore
from tpunb.widgets.live_metrics import render_html, stragglers


def latest(sl, metric: str, host: int):
    frame = sl.metrics()
    rows = frame[(frame.metric == metric) & (frame.host == host)]
    return None if rows.empty else rows.value.iloc[-1]


@pytest.mark.fresh_slice  # a warm host keeps the memory earlier tests freed: its rss would not grow
def test_memory_allocated_on_one_host_shows_on_that_host_only(make_slice):
    sl = make_slice(2)
    wait_for(lambda: latest(sl, "rss_bytes", 0) and latest(sl, "rss_bytes", 1), 20, "first samples")
    before = [latest(sl, "rss_bytes", h) for h in (0, 1)]
    sl.run("import os\nif os.environ['TPUNB_HOST_INDEX'] == '1':\n    block = bytearray(300 * 2**20)\n"
           "    block[::4096] = b'x' * len(block[::4096])", output=None).raise_for_status()
    wait_for(lambda: latest(sl, "rss_bytes", 1) - before[1] > 250 * 2**20, 20, "host 1's rss to grow")
    assert latest(sl, "rss_bytes", 0) - before[0] < 100 * 2**20  # host 0 did not grow
    frame = sl.metrics()
    assert set(frame.columns) >= {"time", "host", "metric", "value", "chip", "step"}
    assert {"cpu_percent", "memory_used_bytes", "memory_total_bytes", "rss_bytes"} <= set(frame.metric)


def test_user_metrics_logged_in_a_long_cell_appear_while_it_runs(make_slice, flags):
    sl = make_slice(2)
    code = (f"import os, time, tpunb\nfor step in range(3):\n    tpunb.log(step, loss=1.0 / (step + 1))\n"
            f"while not os.path.exists('{flags}/go'):\n    time.sleep(0.01)\n")
    outcome = {}
    runner = threading.Thread(target=lambda: outcome.setdefault("result", sl.run(code, output=None)))
    runner.start()
    try:
        def logged():
            frame = sl.metrics()
            loss = frame[frame.metric == "loss"]
            return len(loss) == 6 and "result" not in outcome
        wait_for(logged, 20, "the losses of both hosts while the cell runs")
    finally:
        (flags / "go").touch()
        runner.join(30)
    assert outcome["result"].ok
    loss = sl.metrics().query("metric == 'loss'")
    assert sorted(loss[loss.host == 1].step.tolist()) == [0, 1, 2]
    assert loss[loss.step == 1].value.tolist() == [0.5, 0.5]


def test_a_host_whose_metric_source_fails_still_runs_cells(make_slice):
    sl = make_slice(2)
    wait_for(lambda: latest(sl, "rss_bytes", 1) is not None, 20, "first samples")
    sl.run("import os, sys\nif os.environ['TPUNB_HOST_INDEX'] == '1':\n"
           "    def broken(now):\n        raise OSError('no /proc here')\n"
           "    sys.modules['tpunb_host.metrics'].memory.__code__ = broken.__code__", output=None).raise_for_status()
    count = len(sl.metrics())
    wait_for(lambda: len(sl.metrics()) > count + 4, 20, "more samples")
    result = sl.run("6 * 7", output=None)
    assert result.ok and result.reprs == {0: "42", 1: "42"}
    wait_for(lambda: latest(sl, "cpu_percent", 1) is not None, 20, "cpu samples from host 1")


@pytest.mark.fresh_slice
def test_a_cells_logged_steps_arrive_with_the_cell(make_slice, ip):
    """Slice.metrics() and %tpu_metrics right after a cell hold every step it logged, without
    waiting for a sampler tick (an hour away here, so only the cell's end can bring them)."""
    sl = make_slice(2)
    sl.set_metrics_interval(3600)
    sl.run("import tpunb\nfor step in range(40):\n    tpunb.log(step, loss=1.0 / (step + 1))",
           output=None).raise_for_status()
    loss = sl.metrics().query("metric == 'loss'")
    assert {h: sorted(loss[loss.host == h].step) for h in (0, 1)} == {0: list(range(40)), 1: list(range(40))}
    with report.captured() as said:
        ip.run_line_magic("tpu_metrics", "loss")
    rows = said[0].text.splitlines()[2:]  # a host may carry a note after its value ("<- idle ...")
    assert len(rows) == 2 and all(row.split()[:2] == [str(h), "0.025"] for h, row in enumerate(rows)), said[0].text


@pytest.mark.fresh_slice
def test_the_sampler_survives_a_tick_that_fails_and_says_so_once(make_slice, cell):
    """A sample no frame can carry makes host 1's tick fail for real; sampling goes on, and
    the host says it once."""
    sl = make_slice(2)
    sl.set_metrics_interval(0.1)
    broke = cell("%%on_tpu\nimport gc, os, threading\nif os.environ['TPUNB_HOST_INDEX'] == '1':\n"
                 "    sampler = next(o for o in gc.get_objects() if type(o).__name__ == 'Sampler' and not o._stopped)\n"
                 "    failed = threading.Event()\n"
                 "    def unsendable(now):\n"
                 "        if failed.is_set():\n            return []\n"
                 "        failed.set()\n        return [[now, 'weird', object(), None, None]]\n"
                 "    sampler.sources['unsendable'] = unsendable\n"
                 "    assert failed.wait(30)")
    assert broke.error is None, broke.shown
    before = len(sl.metrics().query("host == 1 and metric == 'rss_bytes'"))
    wait_for(lambda: len(sl.metrics().query("host == 1 and metric == 'rss_bytes'")) > before + 3, 20,
             "host 1 to keep sampling after its bad tick")
    later = cell("%%on_tpu\n1")
    said = broke.shown + later.shown
    assert said.count("a metrics sample failed on this host (TypeError") == 1, said
    assert "sampling goes on" in said and cell("%%on_tpu\n2").stderr == ""


def test_the_ring_cap_holds_under_a_long_run(make_slice):
    sl = make_slice(1)
    sl.metrics_store = store = MetricsStore(1, cap_per_host=500)
    sl.session.on_metrics = store.add
    sl.run("import tpunb\nfor i in range(5000):\n    tpunb.log(i, loss=float(i))", output=None).raise_for_status()
    wait_for(lambda: store.latest.get((0, "loss", None), (None,))[0] == 4999.0, 20, "the last logged value")
    assert len(store.rings[0]) == 500 and len(sl.metrics()) == 500
    assert sl.metrics().step.max() == 4999  # the newest are kept


@pytest.mark.fresh_slice
def test_interval_can_be_changed_and_sampling_turned_off(make_slice, ip):
    sl = make_slice(1)
    wait_for(lambda: latest(sl, "rss_bytes", 0) is not None, 20, "first samples")
    ip.run_line_magic("tpu_metrics", "--interval 0")
    ip.run_cell("%%on_tpu\n1")  # a round trip: the host has handled the interval change before this
    count = len(sl.metrics())
    sl.run("import time\ntime.sleep(1.5)", output=None)
    assert len(sl.metrics()) == count  # nothing sampled while off
    ip.run_line_magic("tpu_metrics", "--interval 0.2")
    wait_for(lambda: len(sl.metrics()) > count, 20, "samples again")


@pytest.mark.fresh_slice
def test_tpu_runtime_metrics_from_libtpus_grpc_service(monkeypatch):
    from tests.libtpu_metrics import HBM_TOTAL, serve

    server, servicer, address = serve()
    monkeypatch.setenv("TPUNB_TPU_METRICS_ADDRESS", address)  # what /dev/accel* turns on, on a TPU VM
    try:
        sl = manager.launch("v4-8")
        wait_for(lambda: latest(sl, "duty_cycle_percent", 0) is not None, 30, "TPU runtime metrics")
        frame = sl.metrics()
        duty = frame[frame.metric == "duty_cycle_percent"].groupby("chip").value.last()
        hbm = frame[frame.metric == "hbm_used_bytes"].groupby("chip").value.last()
        assert duty.to_dict() == {0: 10.0, 1: 20.0, 2: 30.0, 3: 40.0}
        assert hbm.to_dict() == {i: (i + 1) * 2**30 for i in range(4)}
        assert set(frame[frame.metric == "hbm_total_bytes"].value) == {HBM_TOTAL}
        assert "tpu.runtime.tensorcore.dutycycle.percent" in servicer.requests
        row = manager.status().iloc[0]
        assert row["hbm_used_bytes"] == 10 * 2**30  # all chips of the host
    finally:
        server.stop(0)


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_libtpus_slice_wide_chip_ids_are_the_hosts_chips_0_to_3(monkeypatch):
    """tpu-info's real output on a v6e host numbers its chips 8, 9, 12, 13 (tests/fixtures/tpu_info):
    tpunb shows them as chips 0-3 in that order, the numbers JAX's local devices (and so the HBM
    tpunb reads from JAX) have on that host."""
    from tests.libtpu_metrics import runtime_rows, serve

    rows = runtime_rows("v6e-host-streaming.txt")
    assert [r[0] for r in rows] == [8, 9, 12, 13]
    server, _, address = serve(rows)
    monkeypatch.setenv("TPUNB_TPU_METRICS_ADDRESS", address)
    try:
        sl = manager.launch("v4-8")
        wait_for(lambda: len(set(sl.metrics().query("metric == 'hbm_used_bytes'").chip)) == 4, 30, "every chip's HBM")
        frame = sl.metrics()
        hbm = frame[frame.metric == "hbm_used_bytes"].groupby("chip").value.last()
        assert hbm.to_dict() == {i: row[1] for i, row in enumerate(rows)}  # 17.26 GiB on chip 0, ...
        assert set(frame[frame.metric == "hbm_total_bytes"].value) == {round(31.25 * 2**30)}
        run = sl.run("import jax\nx = jax.numpy.ones((1 << 20,))\n[d.id for d in jax.local_devices()]")
        assert run.reprs[0] == "[0, 1, 2, 3]"  # the chip numbers JAX gives this host's devices
    finally:
        server.stop(0)


def test_status_shows_latest_cpu_memory_and_the_registry_has_them(make_slice, ip):
    sl = make_slice(2)
    wait_for(lambda: all(latest(sl, "cpu_percent", h) is not None for h in (0, 1)), 20, "cpu samples")
    table = ip.run_line_magic("tpu_status", "")
    assert {"cpu_percent", "rss_bytes", "memory_used_bytes"} <= set(table.columns)
    assert table["rss_bytes"].notna().all()
    wait_for(lambda: {h for h, *_ in sl.registry.latest_metrics(sl.name)} == {0, 1}, 20,
             "the latest values published for other processes")


def test_widget_model_shows_hosts_values_and_stragglers():
    store = MetricsStore(3)
    for host in range(3):
        store.add(host, {"samples": [[100.0 + i, "loss", 1.0 / (i + 1), None, i] for i in range(50 if host < 2 else 20)]
                          + [[150.0, "rss_bytes", 2**30 * (host + 1), None, None]]})
    late = stragglers(store, 3, interval=1.0)
    assert [s.host for s in late] == [2] and "step 19 while the leader is at 49" in late[0].why
    page = render_html("demo", store, 3, None, 1.0)
    assert page.count('class="tpunb-host') == 3 and page.count("tpunb-straggler") == 1
    assert "<svg" in page and "loss" in page and "3.0 GiB" in page and "stragglers: 2" in page


@pytest.mark.fresh_slice
def test_metrics_widget_updates_from_the_feed_thread(make_slice, monkeypatch):
    from tpunb.widgets.live_metrics import MetricsView

    sl = make_slice(1)
    view = MetricsView("t", sl.metrics_store, sl.metrics_feed, sl.num_hosts)
    first = view.widget.value
    sl.run("import tpunb\ntpunb.log(1, accuracy=0.5)", output=None)
    wait_for(lambda: "accuracy" in view.widget.value, 20, "the widget to show the new metric")
    assert view.widget.value != first
    view.close()


def test_log_outside_a_host_says_where_it_works():
    import tpunb

    with pytest.raises(tpunb.TpunbError, match="inside a %%on_tpu cell"):
        tpunb.log(1, loss=0.5)
