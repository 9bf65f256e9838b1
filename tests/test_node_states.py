"""What a Cloud TPU node can do besides READY: a queued resource that waits and expires, a node
lost in any of its states, an --internal-ip launch from outside the VPC, spot said once, and the
errors that name them. Against the emulator, whose hosts are real sshd hosts with metadata servers."""
from __future__ import annotations

import json

import pytest

from tpunb import manager
from tpunb.errors import CellInterrupted, ProvisionError
from tpunb.provision.gcp import failures as errors
from tpunb.provision.gcp.tpu import api
from tpunb.registry import Registry
from tests.conftest import interrupt_kernel_when, wait_for
from tests.emulator_fixture import on_sshd

ZONE = "us-central2-b"


@pytest.fixture
def tpu_emulator_options(sshd):
    return on_sshd(sshd)


@pytest.fixture
def cloud(tpu_emulator, monkeypatch, isolated_home):
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")
    monkeypatch.setenv("CLOUDSDK_COMPUTE_ZONE", ZONE)
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # this machine is no Google Cloud VM
    monkeypatch.setenv("TPUNB_WATCH_INTERVAL", "0.2")
    yield tpu_emulator
    manager.detach_all()


@pytest.fixture
def launch(cell, sshd):
    """%tpu_launch with no option: the (emulated) hosts are bare TPU VM images that tpunb prepares."""
    return lambda extra="", accel="v4-8": cell(f"%tpu_launch {accel} {extra}")


def test_a_queued_request_is_given_its_wait_and_the_api_ends_it(cloud, launch, monkeypatch, isolated_home):
    """--queued --timeout T: the queued resource carries valid_until_duration T (the API fails it
    then, not a client-side clock), the wait shows its state and time waited, and the failed request
    is deleted."""
    monkeypatch.setattr(api, "WAIT_REPORT", 0.3)
    cloud.faults(no_capacity=True)
    wire = cloud.record()
    run = launch("--name patient --queued --timeout 2")
    assert isinstance(run.error, ProvisionError) and "\n" not in str(run.error), run.shown
    assert ("queued resource patient was still WAITING_FOR_RESOURCES after 2 s (--timeout, its "
            "valid_until_duration)") in str(run.error)
    assert "WAITING_FOR_RESOURCES, waited" in run.shown  # the state and how long, while it waits
    assert "waits at most" not in run.shown  # the limit given is the one the error names
    [create] = [e for e in wire if e.method == "POST" and e.path.endswith("/queuedResources")]
    assert json.loads(create.request)["queueingPolicy"] == {"validUntilDuration": "2s"}
    state = cloud.state()
    assert state["queuedResources"] == [] and state["nodes"] == []
    assert Registry(isolated_home / "registry.db").list_slices() == []


def test_ctrl_c_while_queued_deletes_the_request_and_says_so(cloud, launch):
    cloud.faults(no_capacity=True)
    interrupt_kernel_when(lambda: [q for q in cloud.queued_resources() if q["provisionAttempts"] >= 3], timeout=30)
    run = launch("--name waiting --queued")
    assert isinstance(run.error, CellInterrupted), run.shown
    assert "its queued resource request" in str(run.error) and "was deleted, nothing is left running" in str(run.error)
    assert "the queued resource waits at most 20m for capacity (its valid_until_duration)" in run.stdout, run.stdout
    assert cloud.state()["queuedResources"] == []


@pytest.mark.parametrize("state, words", [
    ("PREEMPTED", "Relaunch it with %tpu_launch --recover lost"),
    ("TERMINATED", "Relaunch it with %tpu_launch --recover lost"),
    ("STOPPED", "gcloud compute tpus tpu-vm start lost --zone us-central2-b --project proj"),
    ("STOPPING", "gcloud compute tpus tpu-vm start lost"),
    ("DELETING", "It is going away: %tpu_down lost forgets it"),
    ("HIDDEN", "Relaunch it with %tpu_launch --recover lost"),
    ("REPAIRING", "Google is repairing it: run the cell again in a few minutes"),
    ("UNKNOWN", "Google cannot tell its state (its hosts may come back): run the cell again in a few minutes"),
])
@pytest.mark.fresh_slice
def test_each_lost_node_state_is_one_line_at_the_next_cell(cloud, cell, launch, state, words):
    assert launch("--name lost").error is None
    cloud.preempt("lost", state=state)
    node = manager.current().node
    wait_for(lambda: node.info is not None and node.info.state == state, 10, "the background watch")
    run = cell("%%on_tpu\n1")
    text = str(run.error)
    assert isinstance(run.error, ProvisionError) and "\n" not in text and "Traceback" not in run.shown
    assert f"slice lost cannot run cells: its node is {state}" in text and words in text, text
    assert cell("%tpu_down lost").error is None


def test_internal_ip_from_outside_the_vpc_is_refused_before_any_node(cloud, launch, isolated_home):
    wire = cloud.record()
    run = launch("--name inside --internal-ip")
    assert isinstance(run.error, ProvisionError) and "\n" not in str(run.error)
    assert "--internal-ip: this machine is not a Google Cloud VM" in str(run.error)
    assert not [e for e in wire if e.method == "POST"] and cloud.state()["nodes"] == []
    assert Registry(isolated_home / "registry.db").list_slices() == []


@pytest.mark.fresh_slice
def test_internal_ip_from_a_vm_in_the_network_connects_to_internal_addresses(cloud, cell, launch, monkeypatch,
                                                                            sshd):
    """The notebook on a VM of the default network (here: a node's worker answers as its metadata
    server): --internal-ip creates the node without external IPs and reaches it; another network is refused."""
    assert launch("--name notebook-vm").error is None
    monkeypatch.setenv("GCE_METADATA_HOST", f"{sshd.addresses[0]}:{sshd.metadata_port}")
    refused = launch("--name elsewhere --internal-ip --network projects/proj/global/networks/tpu")
    assert "this machine is in network default, the nodes would be in tpu" in str(refused.error)
    run = launch("--name inside --internal-ip")
    assert run.error is None, run.shown
    node = next(n for n in cloud.nodes() if n["name"].endswith("/inside"))
    assert not node["networkConfig"].get("enableExternalIps")
    assert "--internal-ip: the hosts have no external address" in run.stdout and "Cloud NAT on network default" in run.stdout
    assert cell("%%on_tpu --slice inside\n1").error is None
    cell("%tpu_down inside")
    cell("%tpu_down notebook-vm")


def test_spot_is_said_once_where_the_proto_says(cloud):
    """A queued resource (a multislice is one) says spot as QueuedResource.spot; only a plain node
    says it in its schedulingConfig."""
    wire = cloud.record()
    api.create(api.NodeSpec(name="pair", accelerator="v4-8", project="proj", zone=ZONE, spot=True, slices=2))
    api.create(api.NodeSpec(name="plain", accelerator="v4-8", project="proj", zone=ZONE, spot=True))
    [queued] = [json.loads(e.request) for e in wire if e.method == "POST" and e.path.endswith("/queuedResources")]
    [plain] = [json.loads(e.request) for e in wire if e.method == "POST" and e.path.endswith("/nodes")]
    assert queued["spot"] == {} and "schedulingConfig" not in queued["tpu"]["nodeSpec"][0]["node"]
    assert plain["schedulingConfig"] == {"spot": True}
    api.delete("proj", ZONE, "pair")
    api.delete("proj", ZONE, "plain")


def test_a_call_refused_because_the_node_is_preempted_is_named_so():
    """The API refuses a call on a node that is not READY with a code 3 (INVALID_ARGUMENT) naming
    its state: that is the node's state, not a rejected request. (No real body of this error was
    found in public sources; the pattern, "state PREEMPTED", is what issue 29 reports.)"""
    ctx = errors.Context("demo-tpu", "my-project", ZONE, "v4-8", spot=True)
    for status in ("INVALID_ARGUMENT", "FAILED_PRECONDITION"):
        error = errors.error(errors.from_status(3 if status == "INVALID_ARGUMENT" else 9,
                                                "The node demo-tpu is in state PREEMPTED."), ctx)
        assert error.reason == "preempted" and "demo-tpu is PREEMPTED (spot capacity was reclaimed)" in str(error)
        assert "rejected the request" not in str(error)
    stopped = errors.error(errors.Failure("INVALID_ARGUMENT", "Node is in state STOPPED"), ctx)
    assert stopped.reason == "lost" and "demo-tpu is STOPPED" in str(stopped)


@pytest.mark.fresh_slice
def test_in_colab_a_launch_without_idle_delete_arms_the_default_and_says_so(cloud, launch, monkeypatch):
    """Colab recycles runtimes with the notebook machine's files: a node nobody uses must not bill on.
    (Colab itself cannot run here: tests/colab_stand_in.py stands in for google.colab.)"""
    from tests import colab_stand_in

    monkeypatch.delenv("TPUNB_IDLE_DELETE", raising=False)
    colab_stand_in.install()
    try:
        run = launch("--name colab-node")
        assert run.error is None, run.shown
        assert "in Colab, idle autodelete is on by default: the node is deleted after 1h without a cell" in run.shown
        node = cloud.nodes()[0]
        assert json.loads(node["metadata"]["tpunb-idle"])["seconds"] == 3600 and node["labels"]["tpunb-idle"] == "3600"
        kept = launch("--name colab-kept --idle-delete off")  # said otherwise: nothing armed, nothing said
        assert kept.error is None and "idle autodelete is on by default" not in kept.shown
        assert "tpunb-idle" not in cloud.nodes()[1]["metadata"] and cloud.nodes()[1]["labels"]["tpunb-idle"] == "off"
    finally:
        colab_stand_in.uninstall()
        manager.down(all=True)
