"""Multislice: several slices joined in one JAX job, one slice in tpunb (labels, --hosts, status, down)."""
from __future__ import annotations

import io

import pytest

from tpunb import manager
from tpunb.display import CellOutput, render_values
from tpunb.errors import CellInterrupted, ProvisionError, UsageError
from tpunb.display.hosts import Layout
from tpunb.results import HostResult
from tests.conftest import interrupt_kernel_when, wait_for
from tests.emulator_fixture import on_sshd

TWO_BY_TWO = Layout(4, 2)  # 2 slices of 2 hosts: hosts 0-1 are slice 0, hosts 2-3 slice 1

CROSS_SLICE_PSUM = (
    "%%on_tpu\n"
    "import jax, jax.numpy as jnp, numpy as np\n"
    "from jax.sharding import NamedSharding, PartitionSpec as P\n"
    "mesh = jax.make_mesh((2, 8), ('dcn', 'data'))  # CPU devices: jax.devices() in process order, slice by slice\n"
    "rows = {d.process_index // 2 for d in mesh.devices[1]}\n"
    "x = jax.make_array_from_process_local_data(NamedSharding(mesh, P('dcn', 'data')),\n"
    "    np.full((1, 4), 1.0 + 10 * int(os.environ['TPUNB_SLICE_INDEX'])))\n"
    "@jax.jit\n"
    "@jax.shard_map(mesh=mesh, in_specs=P('dcn', 'data'), out_specs=P(None, 'data'))\n"
    "def across_slices(block):\n"
    "    return jax.lax.psum(block, 'dcn')\n"
    "print('mesh row 1 is slice', rows)\n"
    "float(across_slices(x).addressable_data(0)[0, 0])\n")


def test_hosts_are_named_slice_by_slice_and_whole_slices_once():
    assert TWO_BY_TWO.names(range(4)) == "s0-1"
    assert TWO_BY_TWO.names([0, 1, 3]) == "s0,s1/1"
    assert TWO_BY_TWO.names([1, 3]) == "s0/1,s1/1"
    assert Layout(6, 3).names([0, 1, 4, 5]) == "s0,s2"
    assert Layout(4).names([0, 1, 3]) == "0-1,3"  # one slice: the labels of today, unchanged


@pytest.mark.parametrize("spec, hosts", [
    ("s1", [2, 3]), ("s0/0,s1/0", [0, 2]), ("s*/0", [0, 2]), ("s0-1", [0, 1, 2, 3]), ("s1/-1", [3]),
    ("s1/0:", [2, 3]), ("s0/0-1", [0, 1]), ("0,2", [0, 2]), ("-1", [3]), ("1:3", [1, 2]), ("all", [0, 1, 2, 3]),
])
def test_hosts_spec_picks_slices_and_hosts_in_them(spec, hosts):
    assert TWO_BY_TWO.parse(spec) == hosts


@pytest.mark.parametrize("spec, says", [
    ("s2", "slice 2 does not exist (this multislice has slices 0-1)"),
    ("s0/5", "host 5 does not exist (each slice has hosts 0-1)"),
    ("sx", "sx is not a host; use all, 0, 0,2, 1:3, s1 (a slice)"),
    ("s1/x", "use all, 0, 0,2, 1:3, s1 (a slice), s1/0 (host 0 of slice 1)"),
    ("4", "host 4 does not exist (this slice has hosts 0-3)"),
])
def test_bad_hosts_specs_say_what_exists(spec, says):
    with pytest.raises(UsageError) as error:
        TWO_BY_TWO.parse(spec)
    assert says in str(error.value) and "\n" not in str(error.value)


def test_a_single_slice_refuses_slice_names():
    with pytest.raises(UsageError, match="this is one slice: use all, 0, 0,2 or 1:3"):
        Layout(2).parse("s1")


def test_output_values_and_errors_are_labelled_slice_slash_host():
    out = io.StringIO()
    sink = CellOutput([0, 1, 2, 3], 4, "grouped", out=out, err=out, names=TWO_BY_TWO.names, show=lambda d, m: None)
    for host in range(4):
        sink.stream(host, "stdout", "same\n" + ("last\n" if host == 3 else ""))
        sink.host_done(host)
    sink.finish()
    assert out.getvalue() == "[s0-1] same\n[s1/1] last\n"
    shown = []
    values = {h: HostResult(h, "ok", value={"text/plain": str(h // 2)}) for h in range(4)}
    render_values(values, "grouped", 4, show=lambda data, meta: shown.append(data["text/plain"]),
                  names=TWO_BY_TWO.names)
    assert shown == ["Out[s0]: 0", "Out[s1]: 1"]


def test_metrics_name_hosts_slice_by_slice():
    from tpunb.metrics import MetricsStore
    from tpunb.widgets.live_metrics import render_text

    text = render_text("pair", MetricsStore(4), 4, None, 1.0, TWO_BY_TWO.names)
    assert [line.split()[0] for line in text.splitlines()[2:]] == ["s0/0", "s0/1", "s1/0", "s1/1"]


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_local_multislice_is_one_jax_job_with_the_multislice_environment(patient_grouping, cell, ip):
    launched = cell("%tpu_launch v4-16 --slices 2")
    assert launched.error is None, launched.shown
    assert "2 x v4-16 as a local simulated multislice 'v4-16-x2'" in launched.shown
    sl = manager.current()
    assert (sl.num_hosts, sl.num_slices, sl.kind) == (4, 2, "2 x v4-16")

    env = cell("%%on_tpu\nimport os\nprint(*(os.environ[k] for k in ('TPUNB_SLICE_INDEX', 'MEGASCALE_SLICE_ID', "
               "'MEGASCALE_NUM_SLICES', 'MEGASCALE_COORDINATOR_ADDRESS', 'MEGASCALE_PORT')))\n"
               "int(os.environ['TPUNB_HOST_INDEX'])")
    assert env.error is None, env.shown
    assert env.stdout == "[s0] 0 0 2 localhost:8080 8080\n[s1] 1 1 2 localhost:8080 8080\n"
    assert [line for line in env.shown.splitlines() if line.startswith("Out")] == [
        "Out[s0/0]: 0", "Out[s0/1]: 1", "Out[s1/0]: 2", "Out[s1/1]: 3"]

    psum = cell(CROSS_SLICE_PSUM)
    assert psum.error is None, psum.shown
    assert "[s0-1] mesh row 1 is slice {1}" in psum.stdout
    assert "Out[s0-1]: 12.0" in psum.shown  # 1 from slice 0 plus 11 from slice 1, on every host

    picked = cell("%%on_tpu --hosts s*/0\nint(os.environ['TPUNB_HOST_INDEX'])")
    assert "Out[s0/0]: 0" in picked.shown and "Out[s1/0]: 2" in picked.shown and "s0/1" not in picked.shown
    assert "Out[s1]: 1" in cell("%%on_tpu --hosts s1\nint(os.environ['TPUNB_HOST_INDEX']) // 2").shown
    failed = cell("%%on_tpu\nif os.environ['TPUNB_HOST_INDEX'] == '3':\n    raise ValueError('only here')")
    assert "[host s1/1]" in failed.shown and "ValueError: only here" in failed.shown
    cell("%%on_tpu\nwho = int(os.environ['TPUNB_HOST_INDEX'])")
    assert cell("%tpu_pull who --host s1/0").error is None and ip.user_ns["who"] == 2
    several = cell("%tpu_pull who --host s1")
    assert "--host s1 picks 2 hosts: --host takes one (e.g. --host 0 or s1/0)" in several.shown
    assert "Traceback" not in several.shown and ip.user_ns["who"] == 2
    bad = cell("%%on_tpu --hosts s2\npass")
    assert "slice 2 does not exist (this multislice has slices 0-1)" in bad.shown and "Traceback" not in bad.shown

    manager.detach_all()  # a kernel restart: %tpu_use starts all four hosts again, still a multislice
    again = cell("%tpu_use v4-16-x2")
    assert "current slice: v4-16-x2 (2 x v4-16, 4 hosts, local)" in again.stdout, again.shown
    sl = manager.current()
    assert "[s1] 1\n" in cell("%%on_tpu\nimport os\nprint(os.environ['MEGASCALE_SLICE_ID'])").stdout

    table = manager.status()
    assert set(table["slice"]) == {"v4-16-x2"} and set(table["accelerator"]) == {"2 x v4-16"}
    assert list(table["slice_index"]) == [0, 0, 1, 1] and list(table["host"]) == [0, 1, 2, 3]
    pids = [h.info["pid"] for h in sl.session.hosts]
    assert cell("%tpu_down v4-16-x2").stdout == "deleted v4-16-x2\n"
    assert not any(_alive(pid) for pid in pids)
    assert manager.registry().get_slice("v4-16-x2") is None


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("line, says", [
    ("%tpu_launch v4-16 --slices 0", "--slices takes a whole number of slices >= 1"),
    ("%tpu_launch local --slices 2", "is this machine's own TPU, one slice: give no --slices"),
    ("%tpu_launch --recover x --slices 2", "give no --slices with it"),
    ("%tpu_launch v4-16 --slices 2 --project p --zone us-central2-b --idle-delete 30m",
     "--idle-delete watches one node, not yet a multislice"),
])
def test_bad_slices_are_one_line(cell, line, says):
    run = cell(line)
    assert says in run.shown and "Traceback" not in run.shown
    assert manager.registry().list_slices() == []


# -- Cloud TPU, through the emulator: one queued resource for every slice -----------------------------
ZONE = "us-central2-b"  # offers v4


@pytest.fixture
def tpu_emulator_options(sshd):
    return on_sshd(sshd)


@pytest.fixture
def cloud(tpu_emulator, monkeypatch):
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")
    monkeypatch.setenv("CLOUDSDK_COMPUTE_ZONE", ZONE)
    monkeypatch.setenv("TPUNB_WATCH_INTERVAL", "0.2")
    return tpu_emulator


def _launch(cell, sshd, line: str):
    return cell(f"%tpu_launch {line}")


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_a_cloud_multislice_is_one_queued_resource_and_one_slice_in_tpunb(patient_grouping, cloud, cell, ip, sshd):
    run = _launch(cell, sshd, "v4-16 --slices 2 --name pair")
    assert run.error is None, run.shown
    assert "Launching 2 x v4-16 multislice (2 nodes in one queued resource) 'pair'" in run.stdout
    assert "$51.52/hour" in run.stdout  # two v4-16 at 25.76 each
    (queued,) = cloud.state()["queuedResources"]
    assert queued["tpu"]["nodeSpec"][0]["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": "pair"}
    nodes = {n["name"].rsplit("/", 1)[-1]: n for n in cloud.state()["nodes"]}
    assert sorted(nodes) == ["pair-0", "pair-1"] and {n["state"] for n in nodes.values()} == {"READY"}

    sl = manager.current()
    first = nodes["pair-0"]["hosts"][0]  # host 0 of slice 0 coordinates the slices
    assert [h.address.split(":")[0] for h in sl.record.hosts] == nodes["pair-0"]["hosts"] + nodes["pair-1"]["hosts"]
    env = cell("%%on_tpu\nimport os\nprint(os.environ['MEGASCALE_COORDINATOR_ADDRESS'], "
               "os.environ['MEGASCALE_SLICE_ID'], os.environ['TPUNB_SLICE_INDEX'], os.environ.get('MEGASCALE_PORT'))"
               "\nimport jax\njax.process_index()")
    assert env.error is None, env.shown
    assert env.stdout == f"[s0] {first} 0 0 None\n[s1] {first} 1 1 None\n"  # the VMs' own tpu-env values, no port of ours
    assert "Out[s1/1]: 3" in env.shown  # one JAX job over both slices, processes numbered slice by slice

    cell("%tpu_status")
    table = ip.user_ns["_"]
    assert set(table["slice"]) == {"pair"} and set(table["accelerator"]) == {"2 x v4-16"}  # no orphan rows
    assert set(table["usd_per_hour"]) == {51.52} and set(table["cloud_state"]) == {"READY"}
    assert list(table["slice_index"]) == [0, 0, 1, 1]

    cloud.preempt("pair-1")  # one slice lost: the multislice cannot run, and --recover relaunches both
    wait_for(lambda: sl.node.info is not None and sl.node.info.state == "PREEMPTED", 10, "the background watch")
    lost = cell("%%on_tpu\n1")
    assert isinstance(lost.error, ProvisionError) and "a node of this multislice is PREEMPTED" in str(lost.error)
    recovered = cell("%tpu_launch --recover pair")
    assert recovered.error is None, recovered.shown
    assert "Out[s1/1]: 3" in cell("%%on_tpu\nimport os\nint(os.environ['TPUNB_HOST_INDEX'])").shown
    assert sorted(n["name"].rsplit("/", 1)[-1] for n in cloud.state()["nodes"]) == ["pair-0", "pair-1"]

    down = cell("%tpu_down pair")
    assert down.error is None and down.stdout == "deleted pair\n"
    assert cloud.state()["nodes"] == [] and cloud.state()["queuedResources"] == []
    assert manager.registry().get_slice("pair") is None


def test_a_multislice_that_cannot_all_fit_is_deleted_whole_on_timeout(cloud, cell, sshd):
    run = _launch(cell, sshd, "v4-32 --slices 2 --name big --timeout 1")  # room for one v4-32 of two
    assert isinstance(run.error, ProvisionError), run.shown
    assert "WAITING_FOR_RESOURCES after 1 s" in str(run.error) and "\n" not in str(run.error)
    assert cloud.state()["nodes"] == [] and cloud.state()["queuedResources"] == []
    assert manager.registry().get_slice("big") is None


def test_interrupting_a_multislice_launch_deletes_every_slice(cloud, cell, sshd):
    cloud.faults(slow_create=60)
    interrupt_kernel_when(lambda: len(cloud.state()["nodes"]) == 2, timeout=30)
    run = _launch(cell, sshd, "v4-16 --slices 2 --name halfway")
    assert isinstance(run.error, CellInterrupted), run.shown
    assert "nothing is left running" in str(run.error)
    assert cloud.state()["nodes"] == [] and cloud.state()["queuedResources"] == []
    assert manager.registry().get_slice("halfway") is None
