"""The sidebar's REST API through jupyter_server's own fixtures (pytest-jupyter): a real ServerApp
in this process with tpunb.server loaded, the real registry under a temp TPUNB_HOME, real local
slices (in this process, and in another process as another kernel would own one), and the
Cloud TPU API emulator for orphans."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import tornado.httpclient

from pytest_jupyter.jupyter_core import jp_asyncio_loop  # noqa: F401 - the real ones, here only (conftest.py)
from pytest_jupyter.jupyter_server import jp_server_cleanup  # noqa: F401
from tests.conftest import wait_for
from tpunb import manager
from tpunb.registry import Registry
from tpunb.machine import procs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"tpunb.server": True}}}


@pytest.fixture
def call(jp_fetch):
    """call(method, path) -> (status, JSON body), for errors too."""

    async def call(method: str, *path: str, **params: str) -> tuple[int, dict]:
        try:
            response = await jp_fetch("tpunb", "api", *path, method=method, params=params)
        except tornado.httpclient.HTTPClientError as exc:
            response = exc.response
        return response.code, json.loads(response.body)

    return call


def _host_pids(sl) -> list[int]:
    return [host.info["pid"] for host in sl.session.hosts]


@pytest.fixture
def other_kernel(isolated_home):
    """Start a process that launches a local slice and keeps it, as another notebook's kernel does;
    returns (process, slice name)."""
    kernels = []

    def start(accelerator: str = "v4-8") -> tuple[subprocess.Popen, str]:
        code = (f"import sys, tpunb; sl = tpunb.launch({accelerator!r}); print('NAME', sl.name, flush=True); "
                "sys.stdin.read()")
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONPATH": ROOT})
        kernels.append(proc)
        line = proc.stdout.readline()
        while line and not line.startswith("NAME "):  # launch's own messages come first
            line = proc.stdout.readline()
        return proc, line.split()[-1]

    yield start
    for proc in kernels:
        proc.kill()
        proc.wait()


@pytest.mark.fresh_slice
async def test_slices_lists_a_local_slice_with_its_hosts_and_cost(call):
    status, body = await call("GET", "slices")
    assert status == 200 and body["slices"] == [] and body["orphans"] == []
    manager.launch("v4-16")
    status, body = await call("GET", "slices")
    assert status == 200
    [row] = body["slices"]
    assert {k: row[k] for k in ("name", "backend", "accelerator", "state", "usd_per_hour", "orphan")} == {
        "name": "v4-16", "backend": "local", "accelerator": "v4-16", "state": "running", "usd_per_hour": 0.0,
        "orphan": False}
    # what the same 8 v4 chips would cost on Cloud TPU: 8 x $3.22 per chip-hour (public on-demand price)
    assert row["list_usd_per_hour"] == pytest.approx(8 * 3.22) and row["usd_so_far"] == 0
    assert 0 <= row["age_s"] < 60
    assert row["num_slices"] == 1
    assert [(h["index"], h["slice_index"], h["label"], h["state"]) for h in row["hosts"]] == [
        (0, 0, "0", "running"), (1, 0, "1", "running")]


@pytest.mark.fresh_slice
async def test_a_multislice_is_one_row_with_hosts_labelled_slice_by_slice(call):
    single = manager.launch("v4-16", name="one")
    manager.launch("v4-16", name="pair", slices=2)
    rows = {row["name"]: row for row in (await call("GET", "slices"))[1]["slices"]}
    pair = rows["pair"]
    assert (pair["accelerator"], pair["num_slices"], pair["state"]) == ("2 x v4-16", 2, "running")
    assert [(h["index"], h["slice_index"], h["label"], h["state"]) for h in pair["hosts"]] == [
        (0, 0, "s0/0", "running"), (1, 0, "s0/1", "running"), (2, 1, "s1/0", "running"), (3, 1, "s1/1", "running")]
    assert pair["list_usd_per_hour"] == pytest.approx(2 * rows["one"]["list_usd_per_hour"])  # both slices billed
    assert single.name == "one" and rows["one"]["num_slices"] == 1


@pytest.mark.fresh_slice
async def test_hosts_carry_the_latest_metrics_their_kernel_published(call):
    manager.launch("v4-16")
    wait_for(lambda: {h for h, *_ in Registry().latest_metrics("v4-16")} == {0, 1}, 20, "published metrics")
    [row] = (await call("GET", "slices"))[1]["slices"]
    for host in row["hosts"]:
        metrics = host["metrics"]
        assert 0 <= metrics["cpu"] <= 1 and 0 < metrics["memory"] < 1  # the panel's bars, as fractions
        assert metrics["rss_bytes"] > 10 * 2**20 and metrics["memory_total_bytes"] > metrics["rss_bytes"]


@pytest.mark.fresh_slice
@pytest.mark.jax
async def test_status_and_the_sidebar_show_the_same_numbers(call):
    """One status model per slice: %tpu_status's DataFrame (this kernel, live), the server's JSON
    (what the sidebar fetches, from what the kernel published) and the sidebar's bars agree on
    every host's numbers, HBM summed over its chips included."""
    sl = manager.launch("v4-16")
    sl.run("import jax.numpy as jnp\nx = jnp.ones((1024, 256))", output=None).raise_for_status()
    store = sl.metrics_store
    wait_for(lambda: all(store.latest_value(h, "hbm_used_bytes") and store.latest_value(h, "cpu_percent") is not None
                         for h in (0, 1)), 30, "HBM and CPU samples from both hosts")
    sl.set_metrics_interval(0)
    columns = ("cpu_percent", "rss_bytes", "memory_used_bytes", "hbm_used_bytes")
    for _ in range(50):  # until no sample arrives between the publish and both reads
        version = store.version
        Registry().save_latest_metrics(sl.name, store.latest_rows())  # the feed's publish, now
        table = manager.status()
        [card] = (await call("GET", "slices"))[1]["slices"]
        if store.version == version:
            break
    chips = {h: len({c for (host, m, c), _ in store.latest_items() if host == h and m == "hbm_used_bytes"}) for h in (0, 1)}
    assert chips == {0: 4, 1: 4}  # per chip: the sums below add four values
    for host in card["hosts"]:
        row = table[table["host"] == host["index"]].iloc[0]
        metrics = host["metrics"]
        assert {c: row[c] for c in columns} == {c: metrics[c] for c in columns}, (host["index"], metrics)
        assert row["state"] == host["state"] == "running"
        assert metrics["cpu"] == pytest.approx(min(1.0, metrics["process_cpu_percent"] / 100))  # a local host's own process
        assert metrics["memory"] == pytest.approx(metrics["rss_bytes"] / metrics["memory_total_bytes"])
    assert card["usd_per_hour"] == 0.0 and card["idle_delete_in"] is None and "idle_delete_in" not in table.columns


def _without_clocks(body: dict) -> dict:
    """A listing without what moves between two reads of it (its time, ages, samples)."""
    return {**{k: v for k, v in body.items() if k not in ("time", "deleted", "messages")},
            "slices": [{**{k: v for k, v in row.items() if k not in ("age_s", "usd_so_far", "hosts")},
                        "hosts": [h["index"] for h in row["hosts"]]} for row in body["slices"]]}


@pytest.mark.fresh_slice
async def test_delete_ends_the_slice_and_answers_with_the_fresh_view(call):
    sl = manager.launch("v4-16")
    manager.launch("v4-8", name="kept")
    pids = _host_pids(sl)
    assert all(procs.alive(p) for p in pids)
    status, answer = await call("DELETE", "slices", "v4-16")
    assert (status, answer["deleted"], answer["messages"]) == (200, ["v4-16"], [])
    assert not any(procs.alive(p) for p in pids)
    # the answer is the listing after the delete: the sidebar redraws from it, without another GET
    assert [row["name"] for row in answer["slices"]] == ["kept"] and answer["orphans"] == []
    assert _without_clocks(answer) == _without_clocks((await call("GET", "slices"))[1])


@pytest.mark.fresh_slice
async def test_the_dataframe_the_json_and_the_serve_listing_read_one_view(call, cell):
    """One status view: %tpu_status's DataFrame, the server's JSON (what the sidebar draws) and
    %tpu_serve's listing say the same cost, idle timer, services with their ports, and snapshots
    of one slice; the JSON read from the registry and hosts' files, the others live."""
    from tests.test_serve import free_port, http_server
    from tpunb.snapshot import snapshot

    sl = manager.launch("v4-16", name="one")
    try:
        port = free_port()
        sl.serve("web", http_server(port), hosts=[1], wait_port=port)
        sl.serve("once", "exit 3", hosts=[0], port=9009)
        sl.run("n = 7", output=None).raise_for_status()
        made = snapshot(sl, ["n"])
        Registry().mark_idle("one", 600, busy=False)  # what a cloud slice's idle clock writes
        wait_for(lambda: {s.name: s.state for s in sl.services()}.get("once") == "exited", 30, "once to exit")

        def read() -> tuple:
            table = cell("%tpu_status").result.result
            listed = cell("%tpu_serve").stdout.splitlines()
            return table, listed

        started = time.monotonic()
        table, listed = read()
        body = (await call("GET", "slices"))[1]
        between = time.monotonic() - started  # how far apart the DataFrame and the JSON were read
        [card] = body["slices"]
        # services: each host's, its state wording, port, whether it holds the slice, what that costs
        framed = {(r.service, r.host): (r.state, r.port, r.busy, None if r.usd_per_hour != r.usd_per_hour else
                                        r.usd_per_hour) for r in table.attrs["services"].itertuples()}  # NaN: none
        served = {(s["service"], s["host"]): (s["state"], s["port"], s["busy"], s["usd_per_hour"])
                  for s in card["services"]}
        assert framed == served == {("web", 1): ("ready", port, True, 0.0), ("once", 0): ("exited with code 3", 9009,
                                                                                            False, None)}
        assert listed[0].split() == ["service", "host", "port", "state", "restarts", "command"]
        rows = [(line[:16].strip(), line[17:21], line[22:27], line[29:49].strip()) for line in listed[1:]]  # columns
        assert {(name, int(host)): (state, int(p)) for name, host, p, state in rows} == {
            key: value[:2] for key, value in served.items()}
        # the idle timer: held by the running service everywhere, then counting down everywhere
        assert card["idle_held"] and card["idle_delete_in"] is None and "idle_delete_in" not in table.columns
        assert card["usd_per_hour"] == 0.0 and card["usd_so_far"] == 0.0
        # snapshots: the same rows in the DataFrame and the JSON
        [snap] = body["snapshots"]
        assert (snap["uri"], snap["slice"], snap["names"], snap["where"], snap["complete"]) == (
            made.uri, "one", "n", "local", True)
        assert snap["shape"] == "v4-16 (2 hosts)" and snap["size_bytes"] > 0  # no JAX ran: no devices counted
        [framed_snap] = table.attrs["snapshots"].to_dict("records")
        assert {k: framed_snap[k] for k in ("uri", "slice", "names", "shape", "size_bytes", "where")} == {
            k: snap[k] for k in ("uri", "slice", "names", "shape", "size_bytes", "where")}
        assert -0.2 <= snap["age_s"] - framed_snap["age_s"] <= between + 0.2

        sl.stop_service("web")
        started = time.monotonic()
        table, listed = read()
        [card] = (await call("GET", "slices"))[1]["slices"]
        between = time.monotonic() - started
        timer = set(table["idle_delete_in"])
        assert len(timer) == 1 and not card["idle_held"] and 0 < card["idle_delete_in"] < 600
        assert -0.2 <= timer.pop() - card["idle_delete_in"] <= between + 0.2  # counting down, the same clock
        assert [line.split()[:4] for line in listed[1:]] == [["once", "0", "9009", "exited"],
                                                             ["web", "1", str(port), "stopped"]]
    finally:
        manager.down("one")


async def test_a_bucket_that_cannot_be_read_is_one_line_and_this_machines_snapshots_still_show(call, cell, monkeypatch,
                                                                                                  isolated_home):
    """No slice needed: the view lists snapshots on their own. A folder a snapshot left here stays
    listed in %tpu_status and the JSON while the named bucket cannot be reached; each says why once."""
    from tests.test_serve import free_port

    folder = isolated_home / "snapshots" / "gone-slice" / "20261128-080000-000"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"names": {"step": {}}, "slice": "gone-slice", "time": time.time(),
                                                      "accelerator": "v4-8", "hosts": 1, "size": 2048}))
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("TPUNB_BUCKET", "snaps")
    run = cell("%tpu_status")
    why = "snapshots on Cloud Storage not listed: gs://snaps: Cloud Storage at http://127.0.0.1:"
    assert run.error is None and run.stderr.count(why) == 1 and len(run.stderr.strip().splitlines()) == 1, run.shown
    [row] = run.result.result.attrs["snapshots"].to_dict("records")
    assert (row["uri"], row["names"], row["shape"], row["size_bytes"], row["where"]) == (
        str(folder), "step", "v4-8 (1 host)", 2048, "local")
    body = (await call("GET", "slices"))[1]
    assert body["snapshots_error"].startswith(why) and [s["uri"] for s in body["snapshots"]] == [str(folder)]


async def test_delete_ends_a_slice_another_kernel_owns(call, other_kernel):
    owner, name = other_kernel("v4-16")
    [row] = (await call("GET", "slices"))[1]["slices"]
    assert row["name"] == name and row["owner_pid"] == owner.pid and row["state"] == "running"
    from tpunb.registry import Registry

    pids = [h.info.pid for h in Registry().get_slice(name).hosts]
    status, answer = await call("DELETE", "slices", name)
    assert (status, answer["deleted"], answer["messages"], answer["slices"]) == (200, [name], [], [])
    assert not any(procs.alive(p) for p in pids)
    assert owner.poll() is None, "the owning kernel itself must keep running"
    assert (await call("GET", "slices"))[1]["slices"] == []


async def test_a_slice_whose_kernel_died_is_not_reported_running(call, other_kernel):
    owner, name = other_kernel()
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    [row] = (await call("GET", "slices"))[1]["slices"]
    assert row["state"].startswith("stopped: its kernel ended") and {h["state"] for h in row["hosts"]} == {"gone"}
    status, answer = await call("DELETE", "slices", name)
    assert (status, answer["deleted"], answer["messages"], answer["slices"]) == (200, [name], [], [])


async def test_errors_are_json_with_a_message_to_act_on(call):
    status, body = await call("DELETE", "slices", "nope")
    assert status == 404 and body == {"message": "no slice named 'nope': it may already be deleted (refresh the list)"}


async def test_catalog_offers_accelerators_zones_and_the_default_backend(call):
    status, body = await call("GET", "catalog")
    assert status == 200 and {"v4-16", "v5litepod-8", "v6e-16"} <= set(body["accelerators"])
    assert "us-central2-b" in body["zones"]
    launched = {b["name"]: b for b in body["backends"] if b["launch"]}  # the panel names no backend: the server does
    assert list(launched) == ["local", "gcp"] and launched["local"]["free"] and not launched["gcp"]["free"]
    assert launched["gcp"]["label"] == "gcp (Cloud TPU)" and "{hosts}" in launched["local"]["ends"]
    assert body["default_backend"] == "local"


async def test_requests_without_a_token_are_refused(jp_fetch):
    for method, path in (("GET", "slices"), ("DELETE", "slices/x"), ("GET", "catalog")):
        with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
            await jp_fetch("tpunb", "api", path, method=method, headers={"Authorization": ""})
        assert refused.value.code == 403


async def test_orphaned_cloud_nodes_are_listed_and_deleted(call, tpu_emulator, monkeypatch):
    from tpunb.provision.gcp.tpu import api as gcp

    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")
    monkeypatch.setenv("CLOUDSDK_COMPUTE_ZONE", "us-central2-b")
    gcp.create(gcp.NodeSpec(name="forgotten", accelerator="v4-8", project="proj", zone="us-central2-b"))
    status, body = await call("GET", "slices")
    [orphan] = body["orphans"]
    assert status == 200 and body["slices"] == []
    assert orphan["name"] == "forgotten" and orphan["orphan"] and orphan["state"] == "READY"
    assert orphan["usd_per_hour"] > 0 and "still billed" in orphan["message"]
    status, answer = await call("DELETE", "slices", "forgotten")
    assert (status, answer["deleted"], answer["messages"], answer["orphans"]) == (200, ["forgotten"], [], [])
    assert tpu_emulator.state()["nodes"] == []


async def test_an_orphaned_multislice_is_one_row_priced_for_every_slice(call, tpu_emulator, monkeypatch):
    from tpunb.provision.gcp.tpu import api as gcp

    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")
    monkeypatch.setenv("CLOUDSDK_COMPUTE_ZONE", "us-central2-b")
    gcp.create(gcp.NodeSpec(name="lost-pair", accelerator="v4-16", project="proj", zone="us-central2-b", slices=2))
    gcp.create(gcp.NodeSpec(name="lost-one", accelerator="v4-16", project="proj", zone="us-central2-b"))
    orphans = {o["name"]: o for o in (await call("GET", "slices"))[1]["orphans"]}
    assert sorted(orphans) == ["lost-one", "lost-pair"]
    pair, one = orphans["lost-pair"], orphans["lost-one"]
    assert (pair["accelerator"], pair["num_slices"], one["accelerator"], one["num_slices"]) == (
        "2 x v4-16", 2, "v4-16", 1)
    assert one["usd_per_hour"] > 0 and pair["usd_per_hour"] == pytest.approx(2 * one["usd_per_hour"])


async def test_a_watchdog_that_cannot_delete_shows_why_instead_of_a_countdown(call, sshd, monkeypatch, isolated_home):
    """A cloud slice whose VMs' service account may not delete TPUs: its watchdog says so on worker 0
    (tests/test_idle_delete.py), and the sidebar's row carries that line in place of the timer."""
    from tests.emulator_fixture import FAST
    from tpunb.sandbox import start_emulator
    from tpunb.provision.gcp.tpu import api as gcp
    from tpunb.registry import HostRecord, SliceRecord

    url, emulator = start_emulator(**FAST, **sshd.emulator_options())
    try:
        monkeypatch.setenv("TPUNB_TPU_API_ENDPOINT", url)
        monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")
        emulator.accounts(permissions={"proj-compute@developer.gserviceaccount.com": ["roles/tpu.viewer"]})
        info = gcp.create(gcp.NodeSpec(name="stuck", accelerator="v4-8", project="proj", zone="us-central2-b",
                                       idle_delete=3600, connect_wait=0))
        reg = Registry()
        reg.save_slice(SliceRecord("stuck", "v4-8", "gcp", "running", spec={"project": "proj", "zone": "us-central2-b",
                                                                            "idle_delete": 3600},
                                   hosts=[HostRecord(0, info.hosts[0].address())]))
        reg.mark_idle("stuck", 3600, busy=False)

        from tpunb.provision.gcp.tpu import lookups

        wait_for(lambda: lookups.idle_problem("proj", "us-central2-b", "stuck"), 10, "the watchdog's check at boot")
        status, body = await call("GET", "slices")
        seen = body["slices"][0]
        assert seen["idle_delete_failing"] == ("idle delete failing: 403 proj-compute@developer.gserviceaccount.com "
                                               "lacks tpu.nodes.delete in project proj")
        assert seen["idle_delete_in"] is None
        gcp.delete("proj", "us-central2-b", "stuck")
    finally:
        emulator.stop()


async def test_stacks_of_a_slice_another_kernel_owns(call, other_kernel):
    proc, name = other_kernel("v4-16")
    status, body = await call("GET", "slices", name, "stacks")
    assert status == 200, body
    assert body["hosts"] == {"0": {"where": "not in a cell (waiting for the next one)", "error": "", "state": "ok"},
                             "1": {"where": "not in a cell (waiting for the next one)", "error": "", "state": "ok"}}
    assert body["text"].splitlines()[1:] == ["[0-1] main thread: not in a cell (waiting for the next one)"]
    status, body = await call("GET", "slices", name, "stacks", hosts="1")
    assert status == 200 and list(body["hosts"]) == ["1"]
    status, body = await call("GET", "slices", name, "stacks", hosts="7")
    assert status == 400 and "host" in body["message"]
    status, body = await call("GET", "slices", "nope", "stacks")
    assert status == 404 and "no slice named 'nope'" in body["message"]
    proc.kill()
    proc.wait()
    status, body = await call("GET", "slices", name, "stacks")  # its kernel is gone, and its hosts with it
    assert status == 404 and "no kernel runs" in body["message"]
