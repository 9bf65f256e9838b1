"""The first launch on a real Compute Engine image and project, on the sandbox that models each trap:

- the ``ubuntu-accel-*`` images' Python has no pip (the sandbox's Compute Engine VMs have none): uv
  comes from PyPI's wheel, its sha256 checked against PyPI's JSON API before it is unpacked;
- a TPU7x slice needs a newer jax and libtpu than a notebook may have: the hosts get the minimum,
  and arrays move between the two versions;
- ``--internal-ip`` from outside the VPC is refused; inside it without Cloud NAT the VMs cannot
  reach PyPI (the sandbox gives such a VM a proxy that refuses), which the launch warns of and the
  failed preparation names;
- Compute Engine's TPU quota is a pool of its own, not the Cloud TPU API's (``--api tpu``).

One prepared launch (the expensive part: a cold environment on a fresh image) serves the image and
the jax tests; the others fail before any environment is made.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from tests.compute_fixture import Google, cloud, made, sandbox  # noqa: F401 - cloud is a fixture
from tests.conftest import wait_for
from tpunb import catalog, manager
from tpunb.errors import UsageError
from tpunb.host import jax_start, prepare, uv_wheel
from tpunb.provision import hostenv
from tpunb.provision.gcp.compute import network
from tpunb.provision.gcp.config import CloudOptions
from tpunb.provision.gcp.vm_setup import host_setup

pytestmark = pytest.mark.sandbox

TPU7X_ZONE, V6E_ZONE = "us-central1-c", "us-east5-b"
FAMILY = "TPUS-PER-TPU-FAMILY-per-project-region"


@pytest.fixture(scope="module")
def box():
    yield from sandbox(2, 0.2, 0.05, 0.05)


@pytest.fixture
def traps(cloud):
    """The module's sandbox, every Compute Engine fault this module sets off again afterwards."""
    yield cloud
    cloud.emulator.compute_faults(quotas=None, routers=None, routers_denied=None, subnets=None)


def on_host(cell, command: str) -> str:
    """What ``bash -c COMMAND`` prints on host 0, as a VM's own shell runs it (its image's PATH)."""
    run = cell(f"%%on_tpu\nimport subprocess\nsubprocess.run(['bash', '-c', {command!r}], capture_output=True, "
               "text=True)")
    assert run.error is None, run.shown
    return run.shown


@pytest.mark.jax
@pytest.mark.fresh_slice
def test_a_pipless_image_gets_uv_from_pypi_and_tpu7x_the_jax_it_needs(traps, cell, monkeypatch):
    """TPU7x's image (Ubuntu 24.04, Python 3.12 without pip) gets uv from PyPI's checked wheel. The
    notebook's jax (said to be 0.9.2 here) is older than the generation's minimum, so the hosts get
    the minimum, named in one line. The minimum is set to 0.10.1 for this test, one release below
    this kernel's real jax, so arrays really cross two jax versions: push, pull, gather."""
    gen = catalog.generation("tpu7x")
    monkeypatch.setitem(catalog._generations(), "tpu7x", dataclasses.replace(gen, jax_min={**gen.jax_min, "jax": "0.10.1"}))
    monkeypatch.setattr(hostenv, "kernel_jax", lambda: ("0.9.2", ">=3.11"))
    run = cell(f"%tpu_launch tpu7x-8 --zone {TPU7X_ZONE} --name pipless")
    assert run.error is None, run.shown
    assert "this notebook's jax 0.9.2 is older, so the hosts get jax 0.10.1" in run.shown, run.shown
    assert "one tpu7x-standard-4t (4 chips, 8 JAX devices)" in run.shown, run.shown
    assert "No module named pip" in on_host(cell, "python3 -m pip --version")  # the image as it is
    assert f"uv {uv_wheel.UV_VERSION}" in on_host(cell, "~/.local/bin/uv --version")  # unpacked from PyPI's wheel
    import jax

    versions = cell("%%on_tpu\nimport jax\njax.__version__, jax.device_count()")
    assert versions.error is None and versions.shown.strip() == "('0.10.1', 8)", versions.shown
    assert jax.__version__ != "0.10.1"  # the kernel's is another release
    sl = manager.current()
    sl.push({"pushed": jax.numpy.arange(6.0).reshape(2, 3)})
    assert cell("%%on_tpu\nimport jax\ntotal = jax.numpy.asarray(pushed).sum()\nfloat(total)").shown.strip() == "15.0"
    made_there = cell("%%on_tpu\nimport jax, numpy as np\nfrom jax.sharding import NamedSharding, PartitionSpec as P\n"
                      "mesh = jax.make_mesh((8,), ('x',))\n"
                      "spread = jax.device_put(np.arange(16.0).reshape(8, 2), NamedSharding(mesh, P('x')))\n"
                      "whole = jax.numpy.ones((2, 2))")
    assert made_there.error is None, made_there.shown
    np.testing.assert_array_equal(np.asarray(sl.pull("whole")[0]), np.ones((2, 2)))
    np.testing.assert_array_equal(sl.gather("spread"), np.arange(16.0).reshape(8, 2))
    assert cell("%tpu_down pipless").error is None


class _Index(BaseHTTPRequestHandler):
    """A package index that serves uv's JSON page with a sha256 the wheel it serves does not have."""

    wheel = b""

    def do_GET(self) -> None:
        if self.path.endswith("/json"):
            name = f"uv-{uv_wheel.UV_VERSION}-py3-none-{uv_wheel.platform_tags()[-1]}.whl"
            body = json.dumps({"urls": [{"filename": name, "packagetype": "bdist_wheel", "url": "/files/uv.whl",
                                         "digests": {"sha256": hashlib.sha256(b"another file").hexdigest()}}]})
            data, kind = body.encode(), "application/json"
        else:
            data, kind = self.wheel, "application/octet-stream"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


def test_a_uv_wheel_whose_sha256_differs_from_the_index_is_never_unpacked(tmp_path):
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr(f"uv-{uv_wheel.UV_VERSION}.data/scripts/uv", "#!/bin/sh\necho tampered\n")
    _Index.wheel = archive.getvalue()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        index = f"http://127.0.0.1:{server.server_address[1]}/simple"
        with pytest.raises(uv_wheel.BadWheel, match=r"has sha256 .*not the .* PyPI's JSON API gives: not unpacked"):
            uv_wheel.install(str(tmp_path / "bin"), environ={"UV_INDEX_URL": index, "UV_CACHE_DIR": str(tmp_path)})
    finally:
        server.shutdown()
    assert not (tmp_path / "bin" / "uv").exists()


@pytest.mark.fresh_slice
def test_internal_ip_from_outside_the_vpc_is_refused_before_anything_exists(traps, cell):
    run = cell(f"%tpu_launch v6e-4 --zone {V6E_ZONE} --internal-ip --no-setup --name outside")
    assert "--internal-ip: this machine is not a Google Cloud VM" in str(run.error), run.shown
    assert "\n" not in str(run.error) and all(not v for v in Google(traps).everything(V6E_ZONE).values())


@pytest.mark.fresh_slice
def test_internal_ip_without_cloud_nat_is_warned_and_the_failed_preparation_names_it(traps, cell, monkeypatch):
    """The notebook on a VM of the default network (its metadata server says so); the slice's VM has
    no external IP and no Cloud NAT covers its subnetwork, so it cannot reach PyPI for uv."""
    google = Google(traps)
    made(google, "notebook-vm", "v6e-4", V6E_ZONE)
    notebook = wait_for(lambda: (vm := google.instances.get(project=traps.project, zone=V6E_ZONE,
                                                            instance="notebook-vm")).status == "RUNNING" and vm, 30,
                        "the notebook's VM")
    monkeypatch.setenv("GCE_METADATA_HOST", f"{notebook.network_interfaces[0].network_i_p}:{traps.sshd.metadata_port}")
    try:
        run = cell(f"%tpu_launch v6e-4 --zone {V6E_ZONE} --internal-ip --name inside")
        text = str(run.error)
        assert "no Cloud NAT covers subnetwork default of network default in us-east5" in run.shown, run.shown
        assert "gcloud compute routers nats create default-nat --router default-nat-router" in run.shown
        assert "no route to the package index (https://pypi.org)" in text and "uv 0.13.9 from PyPI" in text, text
        assert "the VMs have no external IP (--internal-ip) and no Cloud NAT covers subnetwork default" in text, text
        assert google.everything(V6E_ZONE)["instances"] == ["notebook-vm"]

        # what the checks read, against the sandbox's routers and subnetworks
        traps.emulator.compute_faults(routers=[{"region": "us-east5", "name": "nat", "network": "default", "nat": "ALL"}])
        assert network.check_internal_ip(traps.project, V6E_ZONE, None, None, idle=True).nat is True
        traps.emulator.compute_faults(routers=None)
        warned = cell(f"from tpunb.provision.gcp.compute import network\n"
                      f"network.check_internal_ip({traps.project!r}, {V6E_ZONE!r}, None, None, idle=True).nat")
        assert "no Private Google Access and no Cloud NAT" in warned.shown and "--enable-private-ip-google-access" \
            in warned.shown and warned.result.result is False, warned.shown
        traps.emulator.compute_faults(routers_denied=True, subnets=[{"region": "us-east5", "name": "default",
                                                                     "network": "default", "pga": True}])
        unknown = cell(f"network.check_internal_ip({traps.project!r}, {V6E_ZONE!r}, None, None, idle=True).nat")
        assert "cannot check for a Cloud NAT" in unknown.shown and "Private Google Access" not in unknown.shown
        assert unknown.result.result is None, unknown.shown
    finally:
        google.instances.delete_unary(project=traps.project, zone=V6E_ZONE, instance="notebook-vm")


@pytest.mark.fresh_slice
def test_a_quota_refusal_names_the_other_pool_and_doctor_reads_both(traps, cell):
    traps.emulator.compute_faults(quotas={FAMILY: {"us-east5": 0, "us-central1": 0}})
    run = cell(f"%tpu_launch v6e-4 --zone {V6E_ZONE} --no-setup --name pooled")
    text = str(run.error)
    assert f"Quota '{FAMILY}' exceeded. Limit: 0.0 in region us-east5." in text and "\n" not in text, text
    assert "or --api tpu: the Cloud TPU API's TPU quota is a separate pool (the one TRC and older projects hold" in text
    tpu7x = str(cell(f"%tpu_launch tpu7x-8 --zone {TPU7X_ZONE} --no-setup --name only-compute").error)
    assert "exceeded" in tpu7x and "--api tpu" not in tpu7x, tpu7x  # only Compute Engine makes TPU7x
    assert all(not v for z in (V6E_ZONE, TPU7X_ZONE) for v in Google(traps).everything(z).values())
    from tpunb.magics.checkup import doctor

    rows = {r.check: r for r in doctor(accelerator="v6e-4", zone=V6E_ZONE)}
    assert rows["Compute Engine TPU quota"].status == "failed" and "is 0 chips" in rows["Compute Engine TPU quota"].why
    other = rows["Cloud TPU API TPU quota (--api tpu)"]
    assert other.status == "ok" and other.why.startswith("TPUV6EPerProjectPerZoneForTPUAPI in us-east5-b: 4096 "
                                                         "TensorCores, v6e-4 needs 4"), other.why
    v5p = {r.check: r for r in doctor(accelerator="v5p-8", zone="us-east5-a")}["Compute Engine TPU quota"]
    assert v5p.status == "ok" and v5p.why.startswith("TPU-V5P-per-project-region in us-east5"), v5p.why


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_tpu7x_needs_python_3_11_and_its_jax_minimum(traps, cell, monkeypatch):
    python = str(cell(f"%tpu_launch tpu7x-8 --zone {TPU7X_ZONE} --python 3.10 --name old").error)
    assert python.startswith("TPU7x needs jax 0.10.2 or newer with libtpu 0.0.42.1 or newer, which needs Python 3.11")
    assert python.endswith("add --python 3.12 (the hosts get it from uv)"), python
    jax = str(cell(f"%tpu_launch tpu7x-8 --zone {TPU7X_ZONE} --jax 0.9.2 --name old").error)
    assert jax.startswith("--jax 0.9.2: TPU7x needs jax 0.10.2 or newer") and "\n" not in jax, jax
    assert all(not v for v in Google(traps).everything(TPU7X_ZONE).values())
    monkeypatch.setattr(hostenv, "kernel_jax", lambda: ("0.9.2", ">=3.11"))
    spec = host_setup(CloudOptions(), catalog.lookup("tpu7x-8"))["setup"]
    assert (spec["jax"], spec["jax_pinned"], spec["libtpu"]) == ("0.10.2", True, "0.0.42.1")
    assert prepare.jax_requirement(spec, (3, 12, 0), tpu=True) == ["jax[tpu]==0.10.2", "libtpu>=0.0.42.1"]
    assert prepare.digest(spec, tpu=True) != prepare.digest({**spec, "libtpu": None}, tpu=True)
    assert "libtpu" not in host_setup(CloudOptions(), catalog.lookup("v6e-8"))["setup"]  # no minimum on record


@pytest.mark.jax
def test_jax_on_the_cpu_of_a_tpu_host_is_an_error_naming_jax_and_libtpu():
    import jax

    with pytest.raises(jax_start.JaxStartError, match=rf"has TPU chips, but JAX started on cpu: jax {jax.__version__} with "
                                            r"(no libtpu|libtpu \S+) cannot drive them"):
        jax_start.check_backend(jax, tpu=True, environ={})
    jax_start.check_backend(jax, tpu=True, environ={"JAX_PLATFORMS": "cpu"})  # asked for: no error
    jax_start.check_backend(jax, tpu=False, environ={})  # no chips: nothing to drive


def test_bad_minimums_and_options_are_one_line():
    for given, message in [(dict(spot=True, reservation="r"), "--spot with --reservation: Compute Engine cannot "
                                                               "consume a reservation with Spot VMs"),
                           (dict(reservation_bound=True), "--reservation-bound goes with --reservation NAME"),
                           (dict(disk_size=5), "--disk-size 5: give the boot disk's size in GB")]:
        with pytest.raises(UsageError, match=message):
            CloudOptions(**given)


@pytest.mark.jax
def test_the_plan_counts_two_jax_devices_per_tpu7x_chip():
    """jax.make_mesh over a TPU7x slice sees twice its chips: the plan says so where it gives a mesh."""
    from tpunb.plan import plan
    from tpunb.plan.result import render_text

    p = plan("llama3-8b", batch_tokens=1e6, seq_len=8192, tokens=1e10, tpu="tpu7x,v6e")
    table = p.table()
    tpu7x, v6e = table[table["generation"] == "tpu7x"], table[table["generation"] == "v6e"]
    assert len(tpu7x) and (tpu7x["devices"] == 2 * tpu7x["chips"]).all() and (v6e["devices"] == v6e["chips"]).all()
    assert "(of chips: 2 JAX devices each)" in render_text(p)
