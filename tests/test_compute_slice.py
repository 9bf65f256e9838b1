"""Everything else works the same on a Compute Engine slice: one tpu7x-32 (a BULK MIG of 4 bare
TPU7x images, Ubuntu 24.04's Python 3.12) launched once for the module, in a project with OS Login
on, so every test here also proves OS Login. On it: the launch itself as Google's own
google-cloud-compute client sees it, host preparation with uv, JAX from each VM's metadata,
%tpu_status and the sidebar's JSON (API, machine type, "price unknown"), stacks, a background
cell, a snapshot to Cloud Storage and its restore, a service and a forward, the survey after a
Colab reset (an empty $TPUNB_HOME) and %tpu_use of what it finds, %tpu_restart (kept for last:
it ends the hosts' sessions), and %tpu_down, after which Google's client finds nothing."""
from __future__ import annotations

import json
import os
import re
import sys
import urllib.request
from pathlib import Path

import pytest
import tornado.httpclient
from pytest_jupyter.jupyter_core import jp_asyncio_loop  # noqa: F401 - the real ones (see conftest.py)
from pytest_jupyter.jupyter_server import jp_server_cleanup  # noqa: F401

from tests.compute_fixture import Google
from tests.conftest import run_cell, wait_for
from tests.test_serve import free_port, http_server
import tpunb
from tpunb import catalog, manager
from tpunb.sandbox.box import start_sandbox
from tpunb.host import gcs
from tpunb.provision.gcp.compute import found
from tpunb.status import readable

ZONE, NAME, BUCKET, USER = "us-central1-c", "iron", "ce-snaps", "user_example_com"
#: a cell that waits in a function of its own on every host, until the test drops a file
WAITING = ("%%on_tpu --bg\nimport os, time\ndef training_step():\n"
           "    while not os.path.exists(FLAG):\n        time.sleep(0.05)\ntraining_step()\n'trained'")


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    """The module's sandbox (Compute Engine, Cloud Storage, OS Login on) and tpunb pointed at it,
    under one $TPUNB_HOME for the whole module (the reset test swaps it for an empty one)."""
    with pytest.MonkeyPatch.context() as mp:
        home = tmp_path_factory.mktemp("tpunb-home")
        mp.setenv("TPUNB_HOME", str(home))
        mp.setenv("CLOUDSDK_CONFIG", str(home / "gcloud"))
        mp.delenv("CLOUDSDK_CORE_PROJECT", raising=False)
        sandbox = start_sandbox(hosts=4, zone=ZONE, create_seconds=0.3, storage=True, bucket=BUCKET)
        try:
            sandbox.emulator.timings(delete_seconds=0.1, queue_seconds=0.1)
            sandbox.emulator.faults(os_login=True)
            yield sandbox
        finally:
            manager.detach_all()
            sandbox.stop()


@pytest.fixture(autouse=True)
def isolated_home(box):
    """The module's home, kept between tests (conftest's would give each test an empty one and
    detach the shared slice after it)."""
    yield Path(os.environ["TPUNB_HOME"])


@pytest.fixture(scope="module")
def launched(box, ip):
    """%tpu_launch tpu7x-32 with no --api: the module's one slice."""
    return run_cell(ip, f"%tpu_launch tpu7x-32 --name {NAME} --zone {ZONE}")


@pytest.mark.jax
def test_a_tpu7x_32_is_a_bulk_mig_of_bare_images_prepared_with_uv_as_the_os_login_user(box, launched, cell):
    assert launched.error is None, launched.shown
    assert "through Compute Engine" in launched.stdout and "4 x tpu7x-standard-4t" in launched.stdout, launched.stdout
    google, project = Google(box), box.project
    group = google.migs.get(project=project, zone=ZONE, instance_group_manager=NAME)
    assert group.target_size == 4 and group.target_size_policy.mode == "BULK"
    assert group.instance_lifecycle_policy.default_action_on_failure == "DO_NOTHING"
    policy = google.policies.get(project=project, region=catalog.region_of(ZONE),
                                 resource_policy=group.resource_policies.workload_policy.rsplit("/", 1)[-1])
    assert (policy.workload_policy.type_, policy.workload_policy.accelerator_topology) == ("HIGH_THROUGHPUT", "2x2x4")
    vms = [google.instances.get(project=project, zone=ZONE, instance=v.instance.rsplit("/", 1)[-1])
           for v in google.migs.list_managed_instances(project=project, zone=ZONE, instance_group_manager=NAME)]
    assert sorted(v.machine_type.rsplit("/", 1)[-1] for v in vms) == ["tpu7x-standard-4t"] * 4
    assert all(v.labels["created-by"] == "tpunb" for v in vms)
    assert all("ssh-keys" not in {i.key for i in v.metadata.items} for v in vms)  # OS Login: VMs ignore them

    jax = cell("%%on_tpu\nimport os, jax\nprint(jax.device_count(), jax.local_device_count())\n"
               "jax.process_index() == int(os.environ['TPUNB_HOST_INDEX'])")
    assert jax.error is None, jax.shown
    assert "[0-3] 32 8" in jax.stdout and "Out[0-3]: True" in jax.shown, jax.shown
    ids = cell("%%on_tpu\nimport urllib.request\nurllib.request.urlopen(urllib.request.Request("
               "f\"http://{os.environ['GCE_METADATA_HOST']}/computeMetadata/v1/instance/attributes/worker-id\", "
               "headers={'Metadata-Flavor': 'Google'})).read().decode()")
    assert all(re.search(fr"Out\[{i}\]: '{i}'", ids.shown) for i in range(4)), ids.shown  # host i is worker i

    # the image's own Python is Ubuntu 24.04's 3.12; tpunb's environment is a venv uv made beside it, at the
    # kernel's Python (uv's managed one), with jax in it
    env = cell("%%on_tpu\nimport getpass, subprocess, sys\n"
               "image = subprocess.run(['bash', '-c', 'python3 -c \"import sys; print(sys.version_info[:2])\"'], "
               "capture_output=True, text=True).stdout.strip()\n"
               "made_by = [l.split('=')[0].strip() for l in open(sys.prefix + '/pyvenv.cfg') if l.startswith('uv')]\n"
               "(getpass.getuser(), image, sys.version_info[:2], made_by, jax.__file__.startswith(sys.prefix))")
    assert env.error is None, env.shown
    kernel = tuple(sys.version_info[:2])
    assert f"Out[0-3]: ('{USER}', '(3, 12)', {kernel}, ['uv'], True)" in env.shown, env.shown
    assert all(list(box.sshd.logins(a)) == [USER] for a in box.sshd.addresses)  # the profile's user, only
    profile = box.emulator.accounts()["os_login_profiles"]["user@example.com"]
    assert profile["username"] == USER and profile["keys"] == 1


def test_status_and_the_sidebar_say_compute_its_machine_type_and_price_unknown(launched, cell, ip):
    cell("%tpu_status")
    frame = ip.user_ns["_"]
    shown = readable(frame)
    rows = frame[frame["slice"] == NAME]
    assert list(rows["api"]) == ["compute"] * 4 and list(rows["machine_type"]) == ["tpu7x-standard-4t"] * 4
    assert list(rows["cloud_state"]) == ["READY"] * 4 and list(rows["state"]) == ["running"] * 4
    assert list(shown[shown["slice"] == NAME]["usd_per_hour"]) == ["price unknown"] * 4  # never $0


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"tpunb.server": True}}}


async def test_the_sidebar_reads_the_same_from_the_server(launched, jp_fetch):
    try:
        response = await jp_fetch("tpunb", "api", "slices", method="GET")
    except tornado.httpclient.HTTPClientError as exc:
        response = exc.response
    assert response.code == 200, response.body
    card = next(s for s in json.loads(response.body)["slices"] if s["name"] == NAME)
    assert (card["api"], card["machine_type"], card["accelerator"]) == ("compute", "tpu7x-standard-4t", "tpu7x-32")
    assert card["usd_per_hour"] is None and card["backend"] == "gcp" and len(card["hosts"]) == 4


def test_stacks_of_a_background_cell(launched, cell, tmp_path):
    flag = tmp_path / "trained"
    assert cell(f"%%on_tpu\nFLAG = {str(flag)!r}").error is None
    bg = cell(WAITING)
    assert bg.error is None and re.search(r"<tpunb Run In\[\d+\] on hosts 0-3: running", bg.shown), bg.shown
    stacks = wait_for(lambda: (lambda s: s if "[0-3] main thread: " in s and "training_step" in s else None)(
        cell("%tpu_stacks").stdout), 60, "every host inside training_step()")
    assert re.search(r"^\[0-3\] main thread: In\[\d+\]:\d+ <module> -> In\[\d+\]:\d+ training_step$", stacks, re.M), stacks
    flag.touch()
    handle = tpunb.last_run()
    assert handle.wait(60), "the background cell did not finish"
    assert {h: r.status for h, r in handle.result().items()} == {i: "ok" for i in range(4)}


@pytest.mark.jax
def test_a_snapshot_goes_to_cloud_storage_and_comes_back(launched, cell):
    made = cell("%%on_tpu\nimport numpy as np\nfrom jax.sharding import NamedSharding, PartitionSpec as P\n"
                "mesh = jax.make_mesh((32,), ('x',))\n"
                "x = jax.device_put(np.arange(64 * 4, dtype=np.float32).reshape(64, 4), NamedSharding(mesh, P('x')))\n"
                "n = 5")
    assert made.error is None, made.shown
    snap = cell("%tpu_snapshot x n")  # no --to: the bucket TPUNB_BUCKET names
    assert snap.error is None and f"gs://{BUCKET}/tpunb-snapshots/{NAME}/" in snap.stdout, snap.shown
    assert any(name.endswith("/manifest.json") for name, _ in gcs.Bucket(BUCKET).list(f"tpunb-snapshots/{NAME}/"))
    assert cell("%%on_tpu\nn = 0\nx = None").error is None
    back = cell("%tpu_restore x n")
    assert back.error is None and "restored x, n onto tpu7x-32 (4 hosts)" in back.stdout, back.shown
    check = cell("%%on_tpu\n(n, float(jax.numpy.sum(x)), tuple(x.sharding.spec))")
    assert check.error is None and f"Out[0-3]: (5, {float(sum(range(256)))}, ('x',))" in check.shown, \
        check.shown


def test_a_service_on_worker_0_is_reached_through_a_forward(launched, cell):
    port = free_port()
    run = cell(f"%tpu_serve web --hosts 0 --wait-http {port}/ -- {http_server(port)}")
    assert run.error is None and "[tpunb] 'web' ready on host 0 in" in run.stdout, run.shown
    forward = cell(f"url = %tpu_forward {port}\nprint(url)")
    assert forward.error is None, forward.shown
    with urllib.request.urlopen(forward.stdout.strip(), timeout=30) as reply:
        assert reply.status == 200
    assert cell("%tpu_serve --stop web").error is None


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_after_a_colab_reset_the_survey_finds_the_mig_and_use_attaches_it(box, cell, ip, tmp_path):
    manager.detach_all()  # the runtime was recycled: no kernel, no registry, no key
    os.environ["TPUNB_HOME"] = str(tmp_path / "new-home")  # the module's MonkeyPatch restores it
    (tmp_path / "new-home").mkdir()
    cell("%tpu_status")
    frame = ip.user_ns["_"]
    row = frame[frame["slice"] == NAME].iloc[0]
    assert row["state"].startswith("ORPHAN") and f"%tpu_use {NAME}" in row["state"], row["state"]
    assert (row["accelerator"], row["cloud_state"], row["api"], row["machine_type"]) == \
        ("tpu7x-32", "READY", "compute", "tpu7x-standard-4t")
    assert row["address"] == f"{box.project}/{ZONE}"
    used = cell(f"%tpu_use {NAME}")
    assert used.error is None, used.shown
    assert f"current slice: {NAME} (tpu7x-32, 4 hosts, gcp)" in used.stdout, used.stdout
    jax = cell("%%on_tpu\nimport os, jax\nprint(jax.device_count())\n"
               "jax.process_index() == int(os.environ['TPUNB_HOST_INDEX'])")
    assert jax.error is None and "Out[0-3]: True" in jax.shown and "[0-3] 32" in jax.stdout, jax.shown
    profile = box.emulator.accounts()["os_login_profiles"]["user@example.com"]
    assert profile["keys"] == 2  # the new kernel's key, through OS Login


@pytest.mark.jax
def test_restart_gives_fresh_sessions_on_the_same_slice(box, cell):
    sl = manager.current()
    assert cell("%%on_tpu\nkept = 1").error is None
    run = cell("%tpu_restart")
    assert run.error is None and re.search(rf"restarted hosts 0-3 of '{NAME}'", run.stdout), run.shown
    assert manager.current() is sl
    after = cell("%%on_tpu\nimport jax\n('kept' in globals(), jax.device_count())")
    assert after.error is None and "Out[0-3]: (False, 32)" in after.shown, after.shown
    assert Google(box).everything(ZONE)["migs"] == [NAME]


def test_down_leaves_nothing_google_can_see(box, cell):
    down = cell(f"%tpu_down {NAME}")
    assert down.error is None, down.shown
    assert Google(box).everything(ZONE) == {"instances": [], "migs": [], "templates": [], "policies": []}
    assert found.everything(box.project) == {}  # the survey finds nothing of it in any zone either
