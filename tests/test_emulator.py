"""The Cloud TPU API emulator, driven by the official google-cloud-tpu client over HTTP."""

from __future__ import annotations

import time

import pytest
from google.api_core import exceptions
from google.api_core.future.polling import DEFAULT_POLLING
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from tpunb.sandbox import AdminClient, AdminError, start_emulator, start_emulator_process


ZONE = "us-central2-b"
PARENT = f"projects/p/locations/{ZONE}"
POLL = DEFAULT_POLLING.with_delay(initial=0.01, maximum=0.02, multiplier=1.5)  # the default starts at 1 s


def make_client(url: str) -> tpu_v2.TpuClient:
    return tpu_v2.TpuClient(
        transport="rest", credentials=AnonymousCredentials(), client_options={"api_endpoint": url}
    )


def node(accelerator: str = "v4-8", **kw) -> tpu_v2.Node:
    return tpu_v2.Node(accelerator_type=accelerator, runtime_version="tpu-ubuntu2204-base", **kw)


def queued(node_id: str, spot: bool = False, **kw) -> tpu_v2.QueuedResource:
    qr = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(
            node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(parent=PARENT, node_id=node_id, node=node(**kw))]
        )
    )
    if spot:
        qr.spot = tpu_v2.QueuedResource.Spot()
    return qr


def states_until(read, final: set[str], timeout: float = 10.0) -> list[str]:
    """Every distinct state ``read()`` returns until one of ``final`` (a condition wait)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while not seen or seen[-1] not in final:
        state = read()
        if not seen or seen[-1] != state:
            seen.append(state)
        assert time.monotonic() < deadline, f"stuck at {seen}"
        time.sleep(0.005)
    return seen


@pytest.fixture
def api(tpu_emulator):
    return make_client(tpu_emulator.url)


def test_module_runs_as_subprocess_with_fault_flags():
    """`python -m tpunb.sandbox` serves the real client; a zone-scoped fault flag applies."""
    flags = ["--create-seconds", "0.05", "--delete-seconds", "0.02", "--fault-no-capacity", "us-central1-a"]
    proc, url = start_emulator_process(*flags)
    try:
        assert url.startswith("http://127.0.0.1:")
        api = make_client(url)
        created = api.create_node(parent=PARENT, node_id="sub", node=node()).result(timeout=10, polling=POLL)
        assert created.state == tpu_v2.Node.State.READY
        assert [n.name for n in api.list_nodes(parent=PARENT)] == [f"{PARENT}/nodes/sub"]
        stockout = api.create_node(
            parent="projects/p/locations/us-central1-a", node_id="x", node=node("v5litepod-8")
        )
        with pytest.raises(exceptions.ResourceExhausted, match="no more capacity"):
            stockout.result(timeout=10, polling=POLL)
        api.delete_node(name=f"{PARENT}/nodes/sub").result(timeout=10, polling=POLL)
        assert AdminClient(url).state()["nodes"] == []
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_node_create_get_list_delete_with_real_shapes(api, tpu_emulator):
    tpu_emulator.timings(create_seconds=1.0, delete_seconds=1.0)  # seen CREATING/DELETING even when busy
    op = api.create_node(
        parent=PARENT,
        node_id="n1",
        node=node(
            "v4-16",
            labels={"created-by": "tpunb"},
            metadata={"startup-script": "true"},
            network_config=tpu_v2.NetworkConfig(enable_external_ips=True),
        ),
    )
    assert api.get_node(name=f"{PARENT}/nodes/n1").state == tpu_v2.Node.State.CREATING
    ready = op.result(timeout=10, polling=POLL)
    assert ready.state == tpu_v2.Node.State.READY and ready.health == tpu_v2.Node.Health.HEALTHY
    assert len(ready.network_endpoints) == 2  # v4-16: two hosts
    assert all(
        e.ip_address.startswith("10.") and e.access_config.external_ip for e in ready.network_endpoints
    )
    assert ready.labels["created-by"] == "tpunb" and ready.metadata["startup-script"] == "true"
    assert ready.accelerator_config.topology == "2x2x2" and ready.create_time is not None
    raw = tpu_emulator.state()["nodes"][0]
    assert raw["state"] == "READY" and raw["networkEndpoints"][0]["port"] == 8470 and "id" in raw
    assert [n.name for n in api.list_nodes(parent="projects/p/locations/-")] == [f"{PARENT}/nodes/n1"]
    assert list(api.list_nodes(parent="projects/other/locations/-")) == []
    delete = api.delete_node(name=f"{PARENT}/nodes/n1")
    assert api.get_node(name=f"{PARENT}/nodes/n1").state == tpu_v2.Node.State.DELETING
    delete.result(timeout=10, polling=POLL)
    with pytest.raises(exceptions.NotFound):
        api.get_node(name=f"{PARENT}/nodes/n1")


def test_list_pages(api):
    for i in range(3):
        api.create_node(parent=PARENT, node_id=f"n{i}", node=node())
    pager = api.list_nodes(request=tpu_v2.ListNodesRequest(parent=PARENT, page_size=2))
    assert [n.name.rsplit("/", 1)[-1] for n in pager] == ["n0", "n1", "n2"]


def test_queued_resource_state_path_and_force_delete(api, tpu_emulator):
    tpu_emulator.timings(queue_seconds=0.6, create_seconds=0.6)  # each state seen even when busy
    op = api.create_queued_resource(parent=PARENT, queued_resource_id="q1", queued_resource=queued("q1"))
    assert op.result(timeout=10, polling=POLL).name == f"{PARENT}/queuedResources/q1"
    seen = states_until(
        lambda: api.get_queued_resource(name=f"{PARENT}/queuedResources/q1").state.state.name, {"ACTIVE"}
    )
    assert seen == ["WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
    made = api.get_node(name=f"{PARENT}/nodes/q1")
    assert made.state == tpu_v2.Node.State.READY and made.queued_resource == f"{PARENT}/queuedResources/q1"
    with pytest.raises(exceptions.BadRequest, match="force"):
        api.delete_queued_resource(name=f"{PARENT}/queuedResources/q1")
    api.delete_queued_resource(
        request=tpu_v2.DeleteQueuedResourceRequest(name=f"{PARENT}/queuedResources/q1", force=True)
    ).result(timeout=10, polling=POLL)
    assert list(api.list_queued_resources(parent=PARENT)) == [] and list(api.list_nodes(parent=PARENT)) == []


def multislice(count: int, prefix: str | None = None) -> tpu_v2.QueuedResource:
    params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(node_count=count, node_id_prefix=prefix or "")
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=PARENT, multislice_params=params, node=node())
    return tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]))


def test_multislice_queued_resource_is_active_with_every_node_and_deleted_with_them(api, tpu_emulator):
    api.create_queued_resource(parent=PARENT, queued_resource_id="ms", queued_resource=multislice(2, "pod"))
    states_until(lambda: api.get_queued_resource(name=f"{PARENT}/queuedResources/ms").state.state.name, {"ACTIVE"})
    made = {n.name.rsplit("/", 1)[-1]: n for n in api.list_nodes(parent=PARENT)}
    assert sorted(made) == ["pod-0", "pod-1"]  # {prefix}-{i}, as Cloud TPU names them
    assert {n.state for n in made.values()} == {tpu_v2.Node.State.READY}
    assert {n.queued_resource for n in made.values()} == {f"{PARENT}/queuedResources/ms"}
    params = api.get_queued_resource(name=f"{PARENT}/queuedResources/ms").tpu.node_spec[0].multislice_params
    assert (params.node_count, params.node_id_prefix) == (2, "pod")
    api.delete_queued_resource(
        request=tpu_v2.DeleteQueuedResourceRequest(name=f"{PARENT}/queuedResources/ms", force=True)
    ).result(timeout=10, polling=POLL)
    assert list(api.list_queued_resources(parent=PARENT)) == [] and list(api.list_nodes(parent=PARENT)) == []
    api.create_queued_resource(parent=PARENT, queued_resource_id="bare", queued_resource=multislice(2))
    states_until(lambda: api.get_queued_resource(name=f"{PARENT}/queuedResources/bare").state.state.name, {"ACTIVE"})
    assert sorted(n.name.rsplit("/", 1)[-1] for n in api.list_nodes(parent=PARENT)) == ["bare-0", "bare-1"]
    with pytest.raises(exceptions.BadRequest, match="nodeCount must be > 1"):
        api.create_queued_resource(parent=PARENT, queued_resource_id="one", queued_resource=multislice(1))


@pytest.mark.parametrize(
    "parent, body, node_id, error, text",
    [
        (
            "projects/p/locations/mars-central1-a",
            node(),
            "x",
            exceptions.Forbidden,
            "Location mars-central1-a is not found",
        ),
        (PARENT, node("v4-9"), "x", exceptions.BadRequest, 'Invalid accelerator type "v4-9"'),
        (PARENT, node("v5p-8"), "x", exceptions.BadRequest, 'is not available in zone "us-central2-b"'),
        (PARENT, node(), "Bad_Id", exceptions.BadRequest, "Invalid resource id"),
        (
            PARENT,
            tpu_v2.Node(accelerator_type="v4-8"),
            "x",
            exceptions.BadRequest,
            "runtimeVersion is required",
        ),
        (PARENT, node(labels={"Team": "x"}), "x", exceptions.BadRequest, "Invalid label"),
    ],
)
def test_create_is_validated_against_the_catalog(api, tpu_emulator, parent, body, node_id, error, text):
    with pytest.raises(error, match=text):
        api.create_node(parent=parent, node_id=node_id, node=body)
    assert tpu_emulator.nodes() == []


def test_duplicate_node_is_already_exists(api):
    api.create_node(parent=PARENT, node_id="dup", node=node())
    with pytest.raises(exceptions.Conflict, match="already exists"):
        api.create_node(parent=PARENT, node_id="dup", node=node())


def test_fault_quota_through_the_operation_and_http(api, tpu_emulator):
    tpu_emulator.faults(quota="operation")
    op = api.create_node(parent=PARENT, node_id="q", node=node())
    with pytest.raises(
        exceptions.ResourceExhausted, match="Quota 'TPUV4PodPerProjectPerRegionForTPUAPI' exhausted. Limit 0 in region us-central2"
    ):
        op.result(timeout=10, polling=POLL)
    assert tpu_emulator.nodes() == []
    tpu_emulator.faults(quota="http")
    with pytest.raises(exceptions.TooManyRequests, match="exhausted"):
        api.create_node(parent=PARENT, node_id="q", node=node())


def test_fault_permission_denied_and_api_disabled(api, tpu_emulator):
    tpu_emulator.faults(permission_denied=True)
    with pytest.raises(exceptions.Forbidden, match="Permission 'tpu.nodes.create' denied") as info:
        api.create_node(parent=PARENT, node_id="x", node=node())
    assert info.value.reason == "IAM_PERMISSION_DENIED"
    assert list(api.list_nodes(parent=PARENT)) == []  # only creates are denied
    tpu_emulator.faults(permission_denied=False, api_disabled=True)
    with pytest.raises(exceptions.Forbidden, match="has not been used in project p"):
        api.list_nodes(parent=PARENT)


def test_fault_slow_create_holds_creating(api, tpu_emulator):
    tpu_emulator.faults(slow_create=30)
    api.create_node(parent=PARENT, node_id="slow", node=node())
    assert tpu_emulator.timings(create_seconds=0.0)["create_seconds"] == 0.0
    assert api.get_node(name=f"{PARENT}/nodes/slow").state == tpu_v2.Node.State.CREATING
    assert tpu_emulator.state()["pendingOperations"]


def test_admin_rejects_unknown_faults_and_nodes(tpu_emulator):
    with pytest.raises(AdminError, match="unknown fault"):
        tpu_emulator.faults(meteor_strike=True)
    with pytest.raises(AdminError, match="no node"):
        tpu_emulator.preempt("ghost")


def test_preempt_now_and_after(api, tpu_emulator):
    for node_id in ("now", "later"):
        api.create_node(
            parent=PARENT, node_id=node_id, node=node(scheduling_config=tpu_v2.SchedulingConfig(spot=True))
        ).result(timeout=10, polling=POLL)
    tpu_emulator.preempt("now")
    assert api.get_node(name=f"{PARENT}/nodes/now").state == tpu_v2.Node.State.PREEMPTED
    tpu_emulator.preempt(f"{PARENT}/nodes/later", after=1.0, state="TERMINATED")
    assert api.get_node(name=f"{PARENT}/nodes/later").state == tpu_v2.Node.State.READY
    seen = states_until(lambda: api.get_node(name=f"{PARENT}/nodes/later").state.name, {"TERMINATED"})
    assert seen == ["READY", "TERMINATED"]


def test_preempt_after_fault_preempts_spot_nodes_only(api, tpu_emulator):
    tpu_emulator.faults(preempt_after=0.05)
    api.create_node(parent=PARENT, node_id="steady", node=node())
    states_until(lambda: api.get_node(name=f"{PARENT}/nodes/steady").state.name, {"READY"})
    # the spot node is READY after the steady one: by the time it is preempted, a preemption due to
    # the steady node (had the fault hit every node) would have come first
    api.create_node(
        parent=PARENT, node_id="spot", node=node(scheduling_config=tpu_v2.SchedulingConfig(spot=True))
    )
    states_until(lambda: api.get_node(name=f"{PARENT}/nodes/spot").state.name, {"PREEMPTED"})
    assert api.get_node(name=f"{PARENT}/nodes/steady").state == tpu_v2.Node.State.READY


def test_preempted_queued_spot_resource_is_suspended(api, tpu_emulator):
    api.create_queued_resource(
        parent=PARENT, queued_resource_id="qs", queued_resource=queued("qs", spot=True)
    )
    states_until(
        lambda: api.get_queued_resource(name=f"{PARENT}/queuedResources/qs").state.state.name, {"ACTIVE"}
    )
    assert api.get_node(name=f"{PARENT}/nodes/qs").scheduling_config.spot
    tpu_emulator.timings(delete_seconds=0.6)  # SUSPENDING lasts long enough to be seen on a busy machine
    tpu_emulator.preempt("qs")
    assert api.get_node(name=f"{PARENT}/nodes/qs").state == tpu_v2.Node.State.PREEMPTED
    seen = states_until(
        lambda: api.get_queued_resource(name=f"{PARENT}/queuedResources/qs").state.state.name, {"SUSPENDED"}
    )
    assert seen == ["SUSPENDING", "SUSPENDED"]  # the service suspends it, as Cloud TPU does a preempted spot
    suspended = api.get_queued_resource(name=f"{PARENT}/queuedResources/qs").state
    assert suspended.state_initiator == tpu_v2.QueuedResourceState.StateInitiator.SERVICE


def test_queued_resource_waits_out_a_stockout(api, tpu_emulator):
    tpu_emulator.faults(no_capacity=[ZONE])
    api.create_queued_resource(parent=PARENT, queued_resource_id="w", queued_resource=queued("w"))
    tpu_emulator.wait_for(
        lambda s: s["queuedResources"][0]["provisionAttempts"] >= 2
    )  # looked twice, found none
    assert (
        api.get_queued_resource(name=f"{PARENT}/queuedResources/w").state.state.name
        == "WAITING_FOR_RESOURCES"
    )
    assert list(api.list_nodes(parent=PARENT)) == []  # no node while capacity is out
    tpu_emulator.timings(create_seconds=0.6)  # PROVISIONING lasts long enough to be seen on a busy machine
    tpu_emulator.clear_faults()
    seen = states_until(lambda: api.get_queued_resource(name=f"{PARENT}/queuedResources/w").state.state.name, {"ACTIVE"})
    assert seen == ["WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
    assert api.get_node(name=f"{PARENT}/nodes/w").state == tpu_v2.Node.State.READY


def test_queued_resource_fails_on_quota(api, tpu_emulator):
    tpu_emulator.faults(quota="operation")
    api.create_queued_resource(parent=PARENT, queued_resource_id="f", queued_resource=queued("f"))
    states_until(
        lambda: api.get_queued_resource(name=f"{PARENT}/queuedResources/f").state.state.name, {"FAILED"}
    )
    failed = api.get_queued_resource(name=f"{PARENT}/queuedResources/f").state.failed_data.error
    assert failed.code == 8 and "exhausted" in failed.message


@pytest.mark.sandbox
def test_ssh_host_pool_and_authorized_keys(tmp_path):
    keys = tmp_path / "authorized_keys"
    keys.write_text("ssh-ed25519 AAAAkeep someone-else\n")
    url, emu = start_emulator(
        create_seconds=0.02,
        delete_seconds=0.02,
        ssh_hosts=["127.0.0.2", "127.0.0.3", "127.0.0.4"],
        ssh_port=2222,
        authorized_keys=str(keys),
    )
    try:
        api = make_client(url)
        metadata = {"ssh-keys": "alice:ssh-ed25519 AAAAalice alice@laptop\nbob:ssh-rsa AAAAbob bob"}
        big = api.create_node(parent=PARENT, node_id="big", node=node("v4-16", metadata=metadata)).result(
            timeout=10, polling=POLL
        )
        assert [e.ip_address for e in big.network_endpoints] == ["127.0.0.2", "127.0.0.3"]
        assert not big.network_endpoints[0].access_config.external_ip  # external IPs not requested
        assert big.labels["tpunb-ssh-port"] == "2222"
        lines = keys.read_text().splitlines()
        assert lines[0] == "ssh-ed25519 AAAAkeep someone-else"
        assert [line.split()[:2] for line in lines[1:]] == [
            ["ssh-ed25519", "AAAAalice"],
            ["ssh-rsa", "AAAAbob"],
        ]
        # two more hosts do not fit in the one address left: the real API's stockout
        with pytest.raises(exceptions.ResourceExhausted, match="no more capacity"):
            api.create_node(parent=PARENT, node_id="full", node=node("v4-16")).result(
                timeout=10, polling=POLL
            )
        api.delete_node(name=f"{PARENT}/nodes/big").result(timeout=10, polling=POLL)
        assert keys.read_text() == "ssh-ed25519 AAAAkeep someone-else\n"
        assert emu.state()["hosts"]["allocated"] == {}
        api.create_node(parent=PARENT, node_id="again", node=node("v4-16", metadata=metadata)).result(
            timeout=10, polling=POLL
        )
        assert len(keys.read_text().splitlines()) == 3
    finally:
        emu.stop()
    assert keys.read_text() == "ssh-ed25519 AAAAkeep someone-else\n"  # stop takes our keys back out


def test_reset_forgets_everything(api, tpu_emulator):
    api.create_node(parent=PARENT, node_id="n", node=node())
    tpu_emulator.faults(quota="http")
    state = tpu_emulator.reset()
    assert state["nodes"] == [] and state["faults"]["quota"] is None
    api.create_node(parent=PARENT, node_id="n", node=node())  # the quota fault is gone too
