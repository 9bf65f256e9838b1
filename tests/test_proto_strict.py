"""The emulator and tpunb checked against Google's own definitions, not only our reading of them.

Every request tpunb sends (through the real google-cloud-tpu client, and the idle watchdog's own
HTTP) and every answer the emulator gives is recorded as it crossed the wire and checked by
tests/proto_check.py against the tpu_v2 messages, for each method tpunb uses. The real API's
failures (tests/fixtures/cloud, each with its source) go through tpunb's own error path.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.cloud import tpu_v2
from google.longrunning import operations_pb2
from google.rpc import code_pb2, status_pb2

from tests.proto_check import check_error, check_operation, strict
from tpunb.provision.gcp import apis
from tpunb.sandbox.server import Exchange
from tpunb.errors import ProvisionError
from tpunb.provision.gcp.tpu import api as gcp

P, Z = "proj", "us-central2-b"


@pytest.fixture
def wire(tpu_emulator) -> Iterator[list[Exchange]]:
    """The calls a test makes; the tpu_emulator fixture checks each against tpu_v2 when it ends."""
    exchanges = tpu_emulator.record()
    yield exchanges
    assert exchanges, "no API call was recorded"


def spec(name: str, accelerator: str = "v4-8", **kw) -> gcp.NodeSpec:
    return gcp.NodeSpec(name=name, accelerator=accelerator, project=P, zone=kw.pop("zone", Z), **kw)


def seen(exchanges: list[Exchange]) -> set[tuple[str, str]]:
    """(method, last resource kind) of each call, to show what a test covered."""
    out = set()
    for e in exchanges:
        parts = e.path.split("/")
        kinds = ("nodes", "queuedResources", "acceleratorTypes", "runtimeVersions")
        out.add((e.method, parts[-1] if parts[-1] in kinds else parts[-2]))
    return out


def test_node_create_get_list_delete_match_tpu_v2(tpu_emulator, wire):
    gcp.create(spec("n1", "v4-16", labels={"team": "ml"}, ssh_user="alice",
                    ssh_public_key="ssh-ed25519 AAAAx alice@laptop", idle_delete="30m"))
    gcp.create(spec("n2", internal_ip=True, network="projects/proj/global/networks/tpu",
                    service_account="sa@proj.iam", startup_script="echo hi", runtime="v2-custom"))
    assert {i.name for i in gcp.list_nodes(P)} == {"n1", "n2"} and gcp.get(P, Z, "n1").ready
    assert gcp.delete(P, Z, "n1") and gcp.delete(P, Z, "n2") and not gcp.delete(P, Z, "n2")
    assert {("POST", "nodes"), ("GET", "nodes"), ("DELETE", "nodes"), ("GET", "queuedResources")} <= seen(wire)


@pytest.mark.parametrize("accelerator", ["v2-8", "v3-8", "v4-8", "v5litepod-8", "v5p-8", "v6e-8"])
def test_every_generation_has_a_valid_accelerator_config(tpu_emulator, wire, accelerator):
    from tpunb.catalog import lookup

    info = gcp.create(spec("g", accelerator, zone=lookup(accelerator).zones[0]))
    assert info.ready and info.accelerator == accelerator


def test_queued_resources_and_multislice_match_tpu_v2(tpu_emulator, wire):
    gcp.create(spec("q1", queued=True, spot=True))
    gcp.create(spec("ms", slices=2, queued=True))
    assert gcp.get(P, Z, "ms").slices == 2 and {i.name for i in gcp.list_nodes(P)} == {"q1", "ms"}
    flags = {n["name"].rsplit("/", 1)[-1]: n.get("multisliceNode", False) for n in tpu_emulator.nodes()}
    assert flags == {"q1": False, "ms-0": True, "ms-1": True}  # Node.multisliceNode: output only, set by the API
    tpu_emulator.preempt("q1")
    assert gcp.get(P, Z, "q1").lost
    assert gcp.delete(P, Z, "q1") and gcp.delete(P, Z, "ms")
    assert {("POST", "queuedResources"), ("DELETE", "queuedResources")} <= seen(wire)


def test_accelerator_types_and_runtime_versions_match_tpu_v2(tpu_emulator, wire):
    """What a zone offers, asked through the real client: the emulator answers from tpunb's catalog."""
    from google.api_core.exceptions import NotFound

    api, parent = gcp.client(), f"projects/{P}/locations/us-central1-a"
    types = {t.type: t for t in api.list_accelerator_types(parent=parent)}
    assert "v5litepod-8" in types and "v5p-8" in types and "v4-8" not in types  # v4 lives in us-central2-b
    assert types["v5p-8"].accelerator_configs[0].type_.name == "V5P"
    v6e = f"projects/{P}/locations/us-central1-b"
    assert api.get_accelerator_type(name=f"{v6e}/acceleratorTypes/v6e-8").accelerator_configs[0].topology == "2x4"
    versions = {v.version for v in api.list_runtime_versions(parent=parent)}
    assert {"v2-alpha-tpuv5-lite", "v2-alpha-tpuv5"} <= versions and "v2-alpha-tpuv6e" not in versions
    assert api.get_runtime_version(name=f"{v6e}/runtimeVersions/v2-alpha-tpuv6e").version == "v2-alpha-tpuv6e"
    with pytest.raises(NotFound):
        api.get_accelerator_type(name=f"{parent}/acceleratorTypes/v4-8")
    with pytest.raises(NotFound):
        api.get_runtime_version(name=f"{parent}/runtimeVersions/tpu-vm-tf-1.0")
    assert {("GET", "acceleratorTypes"), ("GET", "runtimeVersions")} <= seen(wire)


@pytest.mark.parametrize("queued", [False, True])
def test_the_idle_watchdogs_own_delete_matches_tpu_v2(tpu_emulator, wire, monkeypatch, queued):
    """The VM-side watchdog (host/standalone/idle.py) builds its DELETE by hand, with the VM's token: same check."""
    from tpunb.host.standalone import idle

    gcp.create(spec("idle", queued=queued))
    emu = tpu_emulator.emulator
    node = emu.nodes[f"projects/{P}/locations/{Z}/nodes/idle"]
    token = emu.call(emu._issue_token, node)  # what the node's metadata server would hand its VM
    monkeypatch.setattr(idle, "metadata", lambda path, timeout=5.0: json.dumps({"access_token": token}))
    state = gcp.idle_config(P, Z, "idle", 60, queued=queued)
    assert idle.delete_node(state) == "deleted" and idle.delete_node(state) in ("deleted", "gone")
    assert ("DELETE", "queuedResources" if queued else "nodes") in seen(wire)


@pytest.mark.parametrize("faults, kw, reason", [
    ({"quota": "operation"}, {}, "quota"),
    ({"quota": "http"}, {"spot": True}, "quota"),
    ({"quota": "operation"}, {"queued": True}, "quota"),
    ({"no_capacity": True}, {}, "no_capacity"),
    ({"permission_denied": True}, {"queued": True}, "permission"),
    ({"api_disabled": True}, {}, "api_disabled"),
    ({}, {"zone": "mars-central1-a"}, "invalid_zone"),
    ({}, {"zone": "us-central1-a"}, "invalid_accelerator"),
])
def test_failures_match_tpu_v2_and_google_rpc(tpu_emulator, wire, faults, kw, reason):
    tpu_emulator.faults(**faults)
    with pytest.raises(ProvisionError) as info:
        gcp.create(spec("bad", **kw), timeout=10)
    assert info.value.reason == reason


def test_the_strict_check_catches_what_it_should():
    """Each check fails on the mistakes it exists for (so a pass above means something)."""
    node = {"name": "projects/p/locations/z/nodes/n", "state": "READY"}
    strict(json.dumps(node), tpu_v2.Node, "good")
    for bad in ({**node, "acceleratorTypo": "v4-8"}, {**node, "state": "RUNNING"}, {**node, "state": 99},
                {**node, "labels": {}}, {**node, "networkEndpoints": [{"ipAddress": "10.0.0.2", "port": 0}]}):
        with pytest.raises((AssertionError, pytest.fail.Exception)):
            strict(json.dumps(bad), tpu_v2.Node, "bad")
    op = operations_pb2.Operation(name="projects/p/locations/z/operations/o", done=True)
    op.metadata.Pack(tpu_v2.OperationMetadata.pb()(verb="create", target="projects/p/locations/z/nodes/n"))
    op.response.Pack(tpu_v2.QueuedResource.pb()())
    with pytest.raises(AssertionError):
        check_operation(op, "create node answered with a queued resource")
    with pytest.raises(AssertionError):
        check_error({"error": {"code": 403, "message": "x", "status": "RESOURCE_EXHAUSTED"}}, 403, "wrong code")


# -- the real API's failures, from Google's documentation and public reports (tests/fixtures/cloud) ------

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "cloud").glob("*.json"))


def _http_exception(status: int, body: dict) -> Exception:
    """The exception google-cloud-tpu's REST transport raises for this answer (api_core builds it)."""
    import requests
    from google.api_core import exceptions

    response = requests.Response()
    response.status_code, response._content = status, json.dumps(body).encode()
    response.request = requests.Request("POST", "https://tpu.googleapis.com/v2/projects/p/locations/z/nodes").prepare()
    return exceptions.from_http_response(response)


def _read(fixture: dict) -> ProvisionError:
    """What tpunb makes of the fixture, by the path its own code takes for that kind of answer."""
    from tpunb.provision.gcp import failures as errors

    ctx = errors.Context("demo-tpu", "my-project", fixture["context"]["zone"], fixture["context"]["accelerator"],
                         fixture["context"].get("spot", False), fixture["context"].get("queued", False))
    body, kind = fixture["body"], fixture["kind"]
    if kind == "http_error":
        error = dict(body["error"])
        status = error.pop("status")
        error.pop("errors", None)  # the legacy list older bodies carry: not part of google.rpc.Status
        strict({**error, "code": code_pb2.Code.Value(status)}, status_pb2.Status, "fixture error")
        return gcp._translate(_http_exception(fixture["http_status"], body), ctx)
    if kind == "operation":
        op = strict(body, operations_pb2.Operation, "fixture")
        check_operation(op, "fixture")
        return errors.error(errors.from_status(op.error.code, op.error.message), ctx)
    if kind == "queued_resource":
        qr = tpu_v2.QueuedResource.wrap(strict(body, tpu_v2.QueuedResource, "fixture"))
        assert gcp.info_from_queued(qr).queued_state == "FAILED" and gcp.info_from_queued(qr).lost
        failed = qr.state.failed_data.error
        return errors.error(errors.from_status(failed.code, failed.message), ctx)
    node = tpu_v2.Node.wrap(strict(body, tpu_v2.Node, "fixture"))
    info = gcp.info_from_node(node)
    assert info.lost and info.state in gcp.LOST_NODE_STATES
    return ProvisionError(errors.preempted_message(info.name, info.state, info.spot), info.state.lower())


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_real_api_failures_become_one_line_errors(path):
    fixture = json.loads(path.read_text())
    assert fixture["source"] and fixture["taken"], f"{path.name}: say where it came from"
    error = _read(fixture)
    text = str(error)
    assert error.reason == fixture["expect"]["reason"], text
    for part in fixture["expect"]["contains"]:
        assert part in text
    for part in fixture["expect"].get("lacks", []):
        assert part not in text
    assert "\n" not in text and "EID" not in text and "https://tpu.googleapis.com" not in text and len(text) < 400


def test_every_failure_kind_has_a_real_fixture():
    kinds = {json.loads(p.read_text())["expect"]["reason"] for p in FIXTURES}
    assert {"quota", "no_capacity", "permission", "preempted"} <= kinds


def _shape(value: object) -> object:
    """Keys and value types, recursively: two answers of one kind should have the same shape."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value[:1]]
    return type(value).__name__


def _fixture(name: str) -> dict:
    return json.loads((Path(__file__).parent / "fixtures" / "cloud" / name).read_text())


@pytest.mark.parametrize("faults, fixture, accelerator, zone", [
    ({"permission_denied": True}, "permission_iam_http_403.json", "v4-8", "us-central2-b"),
    ({"no_capacity": True}, "stockout_operation.json", "v2-8", "us-central1-c"),
])
def test_emulated_failures_have_the_real_shape(tpu_emulator, wire, faults, fixture, accelerator, zone):
    """The emulator's answer for a fault looks like the real one: same fields, same message start."""
    tpu_emulator.faults(**faults)
    with pytest.raises(ProvisionError):
        gcp.create(spec("demo-tpu", accelerator, zone=zone), timeout=10)
    real = _fixture(fixture)["body"]
    if "error" in real and "code" in real["error"] and "status" in real["error"]:
        ours = next(json.loads(e.response) for e in wire if e.status != 200)
        prefix = real["error"]["message"].split("'")[0]
    else:
        ours = next(json.loads(e.response) for e in wire if b'"error"' in e.response and e.status == 200)
        prefix = real["error"]["message"].split('"')[0]
        del real["metadata"]["apiVersion"], ours["metadata"]["apiVersion"]  # ours names v2, the fixture may not
    assert _shape(ours) == _shape(real)
    found = ours["error"]["message"]
    assert found.startswith(prefix), found


def test_a_state_newer_than_this_client_is_named_not_a_crash():
    """The REST transport asks for enum numbers, so a state the API adds later arrives as a bare int."""
    with pytest.warns(UserWarning, match="Unrecognized"):  # proto-plus says so, and hands back the int
        node = tpu_v2.Node.from_json(json.dumps({"name": f"projects/{P}/locations/{Z}/nodes/n", "state": 99,
                                                 "health": 42}))
        qr = tpu_v2.QueuedResource.from_json(json.dumps({"name": f"projects/{P}/locations/{Z}/queuedResources/n",
                                                         "state": {"state": 77}}))
        info, queued = gcp.info_from_node(node), gcp.info_from_queued(qr)
    assert (info.state, info.health, info.ready, info.lost) == ("STATE_99", "STATE_42", False, False)
    assert queued.queued_state == "STATE_77" and not queued.lost


def test_tpu7x_is_refused_before_any_call_and_by_the_emulator(tpu_emulator, monkeypatch):
    """The Cloud TPU API does not create TPU7x (docs/cloud-facts.md): say so at once, spend no call."""
    from google.api_core.exceptions import BadRequest

    from tpunb.catalog import lookup
    from tpunb.errors import UsageError

    assert apis.no_tpu_api(lookup("tpu7x-8"))  # the Cloud TPU API does not make it, in any zone
    exchanges, zone = tpu_emulator.record(), "us-central1-c"
    with pytest.raises(UsageError, match="tpu7x-8 cannot be created through the Cloud TPU API.*GKE"):
        gcp.create(spec("i7", "tpu7x-8", zone=zone))
    assert exchanges == []
    with pytest.raises(BadRequest, match="tpu7x-8"):
        gcp.client().create_node(parent=f"projects/{P}/locations/{zone}", node_id="i7",
                                 node=tpu_v2.Node(accelerator_type="tpu7x-8", runtime_version="v2-alpha-tpu7-ubuntu2404"))
