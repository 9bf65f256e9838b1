"""tpunb.provision.gcp against the emulator: the launch flow, its failures and its cleanup."""

from __future__ import annotations

import getpass

import paramiko
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from tests.conftest import wait_for
from tests.sshd import Sshd, _write_ed25519
from tpunb.catalog import lookup
from tpunb.sandbox import start_emulator
from tpunb.errors import ProvisionError, UnknownAcceleratorError
from tpunb.provision.gcp.tpu import api as gcp


P, Z = "proj", "us-central2-b"


def spec(name: str = "n1", accelerator: str = "v4-8", **kw) -> gcp.NodeSpec:
    return gcp.NodeSpec(
        name=name, accelerator=accelerator, project=kw.pop("project", P), zone=kw.pop("zone", Z), **kw
    )


def recorder() -> tuple[list[str], callable]:
    seen: list[str] = []
    return seen, lambda state, elapsed: seen.append(state)


def wait_until(predicate, timeout: float = 10.0):
    """Poll a condition (never a guessed sleep); returns its first truthy value."""
    return wait_for(predicate, timeout, "the emulator's state")


def leftovers(emulator) -> tuple[list, list]:
    state = emulator.state()
    return state["nodes"], state["queuedResources"]


def test_create_get_list_delete(tpu_emulator):
    tpu_emulator.timings(create_seconds=1.0)  # long enough to be seen CREATING on a busy machine
    seen, on_state = recorder()
    info = gcp.create(
        spec(
            "n1",
            "v4-16",
            labels={"team": "ml"},
            ssh_user="alice",
            ssh_public_key="ssh-ed25519 AAAAx alice@laptop",
        ),
        on_state=on_state,
    )
    assert seen == ["CREATING", "READY"]
    assert info.ready and info.health == "HEALTHY" and not info.spot and info.queued_resource is None
    assert (info.name, info.project, info.zone, info.accelerator) == ("n1", P, Z, "v4-16")
    assert [h.index for h in info.hosts] == [0, 1] and all(h.port == 22 for h in info.hosts)
    assert info.hosts[0].address() == info.hosts[0].external_ip and info.hosts[0].address(
        internal=True
    ).startswith("10.")
    assert info.runtime == lookup("v4-16").default_runtime
    assert info.labels["created-by"] == "tpunb" and info.labels["team"] == "ml" and info.tpunb_owned
    assert 0 <= info.uptime() < 60
    raw = tpu_emulator.nodes()[0]
    assert raw["metadata"]["ssh-keys"] == "alice:ssh-ed25519 AAAAx alice@laptop"
    assert raw["networkConfig"]["enableExternalIps"] is True
    assert gcp.get(P, Z, "n1") == info
    assert [i.name for i in gcp.list_nodes(P, Z)] == ["n1"]
    assert gcp.delete(P, Z, "n1") is True
    assert gcp.get(P, Z, "n1") is None and leftovers(tpu_emulator) == ([], [])


def test_internal_ip_and_options_reach_the_api(tpu_emulator):
    gcp.create(
        spec(
            "n2",
            internal_ip=True,
            network="projects/proj/global/networks/tpu",
            service_account="sa@proj.iam",
            startup_script="echo hi",
            runtime="v2-custom",
        )
    )
    raw = tpu_emulator.nodes()[0]
    assert not raw["networkConfig"].get("enableExternalIps") and raw["networkConfig"]["network"].endswith(
        "/tpu"
    )
    assert raw["serviceAccount"]["email"] == "sa@proj.iam" and raw["metadata"]["startup-script"] == "echo hi"
    assert raw["runtimeVersion"] == "v2-custom"
    host = gcp.get(P, Z, "n2").hosts[0]
    assert host.external_ip is None and host.address() == host.internal_ip


def test_queued_create_walks_the_queue_states(tpu_emulator):
    tpu_emulator.timings(queue_seconds=1.0, create_seconds=1.0)  # each state seen even when busy
    seen, on_state = recorder()
    info = gcp.create(spec("q1", queued=True), on_state=on_state)
    assert seen == ["WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
    assert (
        info.ready and info.queued_state == "ACTIVE" and info.queued_resource.endswith("/queuedResources/q1")
    )
    assert gcp.get(P, Z, "q1").queued_state == "ACTIVE"
    assert gcp.delete(P, Z, "q1") is True
    assert leftovers(tpu_emulator) == ([], [])


def test_waiting_queued_resource_is_visible_before_its_node(tpu_emulator):
    tpu_emulator.faults(no_capacity=True)
    seen = []

    def stop_when_queued(state, elapsed):
        seen.append(state)
        info = gcp.get(P, Z, "wq")
        assert info.state is None and info.queued_state == "WAITING_FOR_RESOURCES" and not info.lost
        assert [i.name for i in gcp.list_nodes(P)] == ["wq"]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gcp.create(spec("wq", queued=True), on_state=stop_when_queued)
    assert seen == ["WAITING_FOR_RESOURCES"] and leftovers(tpu_emulator) == ([], [])


def test_spot_node_preempted_now(tpu_emulator):
    info = gcp.create(spec("s1", spot=True))
    assert info.spot and tpu_emulator.nodes()[0]["schedulingConfig"] == {"spot": True}
    tpu_emulator.preempt("s1")
    after = gcp.get(P, Z, "s1")
    assert after.state == "PREEMPTED" and after.lost and after.health is None


def test_spot_node_preempted_after_n_seconds(tpu_emulator):
    gcp.create(spec("s2", spot=True))
    tpu_emulator.preempt("s2", after=0.5)
    assert gcp.get(P, Z, "s2").state == "READY"
    assert wait_until(lambda: gcp.get(P, Z, "s2").lost)
    assert gcp.delete(P, Z, "s2") is True


def test_queued_spot_preemption_suspends_the_queued_resource(tpu_emulator):
    info = gcp.create(spec("qs", queued=True, spot=True))
    assert info.spot
    tpu_emulator.preempt("qs", after=0.05)
    gone = wait_until(lambda: (i := gcp.get(P, Z, "qs")).queued_state == "SUSPENDED" and i)
    assert gone.state == "PREEMPTED" and gone.lost
    gcp.delete(P, Z, "qs")
    assert leftovers(tpu_emulator) == ([], [])


@pytest.mark.parametrize(
    "faults, kw, reason, text",
    [
        (
            {"quota": "operation"},
            {},
            "quota",
            "quota exceeded for v4-8 in us-central2-b (RESOURCE_EXHAUSTED: Quota "
            "'TPUV4PodPerProjectPerRegionForTPUAPI' exhausted. Limit 0 in region us-central2): "
            "request more TPU quota",
        ),
        ({"quota": "http"}, {"spot": True}, "quota", "try a zone outside us-central2"),
        (
            {"no_capacity": True},
            {"accelerator": "v5litepod-8", "zone": "us-west4-a"},
            "no_capacity",
            "no capacity for v5litepod-8 in us-west4-a right now: try another zone "
            "(us-central1-a, us-south1-a, us-west1-c), --queued to wait for capacity or --spot",
        ),
        (
            {"permission_denied": True},
            {},
            "permission",
            "permission denied: your account lacks tpu.nodes.create in project proj; "
            "ask a project owner for roles/tpu.admin",
        ),
        ({"permission_denied": True}, {"queued": True}, "permission", "lacks tpu.queuedResources.create"),
        (
            {"api_disabled": True},
            {},
            "api_disabled",
            "gcloud services enable tpu.googleapis.com --project proj",
        ),
        (
            {},
            {"zone": "mars-central1-a"},
            "invalid_zone",
            "zone 'mars-central1-a' does not exist or has no Cloud TPUs for project proj; "
            "v4-8 is offered in us-central2-b",
        ),
        ({}, {"zone": "us-central1-a"}, "invalid_accelerator", "v4-8 cannot be created in us-central1-a"),
    ],
)
def test_failures_are_one_line_errors_that_say_what_to_do(tpu_emulator, faults, kw, reason, text):
    tpu_emulator.faults(**faults)
    with pytest.raises(ProvisionError) as info:
        gcp.create(spec("bad", **kw), timeout=10)
    message = str(info.value)
    assert text in message and "\n" not in message and "http://" not in message and "EID" not in message
    assert info.value.reason == reason
    assert leftovers(tpu_emulator) == ([], [])


def test_quota_on_a_queued_resource_deletes_it(tpu_emulator):
    tpu_emulator.faults(quota="operation")
    with pytest.raises(
        ProvisionError, match=r"quota exceeded .* \(deleted queued resource and node qq\)"
    ) as info:
        gcp.create(spec("qq", queued=True))
    assert info.value.reason == "quota" and leftovers(tpu_emulator) == ([], [])


def test_unknown_accelerator_fails_before_any_call(tpu_emulator):
    with pytest.raises(UnknownAcceleratorError, match="did you mean v4-8"):
        gcp.create(spec("x", "v4-9"))
    assert tpu_emulator.state()["nodes"] == []


def test_timeout_in_creating_deletes_the_node(tpu_emulator):
    tpu_emulator.faults(slow_create=60)
    seen, on_state = recorder()
    with pytest.raises(ProvisionError) as info:
        gcp.create(spec("stuck"), on_state=on_state, timeout=0.3)
    assert str(info.value) == (
        "node stuck was still CREATING after 0.3 s (--timeout); deleted node stuck; "
        "retry with a longer --timeout or another zone"
    )
    assert info.value.reason == "timeout" and seen == ["CREATING"]
    assert leftovers(tpu_emulator) == ([], [])


def test_queued_timeout_waiting_for_capacity_deletes_the_queued_resource(tpu_emulator):
    tpu_emulator.faults(no_capacity=[Z])
    with pytest.raises(
        ProvisionError, match="still WAITING_FOR_RESOURCES after 0.3 s .*deleted queued resource"
    ):
        gcp.create(spec("qt", queued=True), timeout=0.3)
    assert leftovers(tpu_emulator) == ([], [])


@pytest.mark.parametrize("queued, at", [(False, "CREATING"), (True, "PROVISIONING")])
def test_keyboard_interrupt_during_the_wait_deletes_what_was_created(tpu_emulator, queued, at):
    tpu_emulator.faults(slow_create=60)  # CREATING / PROVISIONING until we interrupt

    def interrupt(state, elapsed):
        if state == at:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gcp.create(spec("ki", queued=queued), on_state=interrupt)
    assert leftovers(tpu_emulator) == ([], [])


def test_preempted_while_creating_is_reported_and_cleaned_up(tpu_emulator):
    tpu_emulator.faults(slow_create=60)

    def preempt(state, elapsed):
        tpu_emulator.preempt("pc")

    with pytest.raises(
        ProvisionError, match="pc was preempted while being created: .*--spot.* \\(deleted node pc\\)"
    ) as info:
        gcp.create(spec("pc", spot=True), on_state=preempt)
    assert info.value.reason == "preempted" and leftovers(tpu_emulator) == ([], [])


def test_existing_node_is_reported_and_left_alone(tpu_emulator):
    gcp.create(spec("mine"))
    with pytest.raises(ProvisionError, match=r"a TPU named mine already exists .*%tpu_down mine") as info:
        gcp.create(spec("mine"))
    assert info.value.reason == "already_exists"
    assert gcp.get(P, Z, "mine").ready  # the existing node was not deleted by the failed launch


def test_delete_is_idempotent(tpu_emulator):
    tpu_emulator.timings(delete_seconds=0.3)  # still DELETING at the second call
    assert gcp.delete(P, Z, "never") is False
    gcp.create(spec("twice"))
    assert gcp.delete(P, Z, "twice", wait=False) is True
    assert gcp.delete(P, Z, "twice") is True  # already DELETING: waits for it to go
    assert gcp.delete(P, Z, "twice") is False


def test_list_filters_on_labels_across_zones(tpu_emulator):
    gcp.create(spec("ours", labels={"team": "a"}))
    gcp.create(spec("v5", "v5litepod-4", zone="us-west4-a", labels={"team": "b"}))
    raw = tpu_v2.TpuClient(
        transport="rest",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": tpu_emulator.url},
    )
    raw.create_node(
        parent=f"projects/{P}/locations/{Z}",
        node_id="foreign",
        node=tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base"),
    )
    assert sorted(i.name for i in gcp.list_nodes(P)) == ["ours", "v5"]
    assert [i.name for i in gcp.list_nodes(P, Z)] == ["ours"]
    assert sorted(i.name for i in gcp.list_nodes(P, Z, label_filter=None)) == ["foreign", "ours"]
    assert [i.name for i in gcp.list_nodes(P, label_filter={"team": "b"})] == ["v5"]
    assert gcp.list_nodes("other-project") == []


def test_resolve_project_zone_order(tmp_path, monkeypatch):
    config = tmp_path / "gcloud"
    (config / "configurations").mkdir(parents=True)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(config))
    assert gcp.resolve_project_zone() == (None, None)
    (config / "configurations" / "config_default").write_text(
        "[core]\nproject = dflt\n[compute]\nzone = us-east5-a\n"
    )
    assert gcp.resolve_project_zone() == ("dflt", "us-east5-a")
    (config / "configurations" / "config_work").write_text(
        "[core]\nproject = work-proj\n[compute]\nzone = us-west4-a\n"
    )
    (config / "active_config").write_text("work\n")
    assert gcp.resolve_project_zone() == ("work-proj", "us-west4-a")
    monkeypatch.setenv("CLOUDSDK_ACTIVE_CONFIG_NAME", "default")
    assert gcp.resolve_project_zone() == ("dflt", "us-east5-a")
    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", "core-env")
    assert gcp.resolve_project_zone() == ("core-env", "us-east5-a")
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "env-proj")
    monkeypatch.setenv("CLOUDSDK_COMPUTE_ZONE", "europe-west4-a")
    assert gcp.resolve_project_zone() == ("env-proj", "europe-west4-a")
    assert gcp.resolve_project_zone("flag-proj", None) == ("flag-proj", "europe-west4-a")
    assert gcp.resolve_project_zone("flag-proj", "asia-east1-c") == ("flag-proj", "asia-east1-c")


def test_require_project_zone_says_how_to_set_them(tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "none"))
    with pytest.raises(ProvisionError, match="no Google Cloud project: pass --project"):
        gcp.require_project_zone()
    with pytest.raises(ProvisionError, match="gcloud config set compute/zone"):
        gcp.require_project_zone("p")
    assert gcp.require_project_zone("p", "z") == ("p", "z")


def test_missing_credentials_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("TPUNB_TPU_API_ENDPOINT", raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # no metadata-server probe: this is not a GCE VM
    with pytest.raises(ProvisionError) as info:
        gcp.get(P, Z, "x")
    assert str(info.value) == (
        "no Google Cloud credentials: run `gcloud auth application-default login` "
        "(in Colab: `from google.colab import auth; auth.authenticate_user()`)"
    )


def ssh_login(address: str, port: int, key: paramiko.PKey, user: str | None = None) -> paramiko.SSHClient:
    """A logged-in SSH client, with this key only (no agent, no ~/.ssh)."""
    ssh = paramiko.SSHClient()
    ssh.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    try:
        ssh.connect(
            address,
            port,
            username=user or getpass.getuser(),
            pkey=key,
            allow_agent=False,
            look_for_keys=False,
            timeout=10,
        )
    except BaseException:
        ssh.close()
        raise
    return ssh


@pytest.mark.sandbox
def test_emulated_hosts_are_real_ssh_hosts(tmp_path, monkeypatch, tpu_emulator_options):
    """ssh-keys metadata makes its user and key on every host, as the guest agent does: log in as
    that user while READY, not after delete (alice is no user of this machine)."""
    sshd = Sshd(hosts=2, directory=tmp_path / "sshd")
    options = dict(tpu_emulator_options, ssh_hosts=sshd.addresses, ssh_port=sshd.port)
    url, emulator = start_emulator(**options, authorized_keys=str(sshd.authorized_keys))
    monkeypatch.setenv("TPUNB_TPU_API_ENDPOINT", url)
    key_path = tmp_path / "id_ed25519"
    public = _write_ed25519(key_path)
    try:
        info = gcp.create(spec("sshnode", "v4-16", ssh_user="alice", ssh_public_key=public))
        assert [(h.address(), h.port) for h in info.hosts] == [(a, sshd.port) for a in sshd.addresses]
        key = paramiko.Ed25519Key.from_private_key_file(str(key_path))
        for host in info.hosts:
            with ssh_login(host.address(), host.port, key, "alice") as ssh:
                _, out, _ = ssh.exec_command("echo $SSH_CONNECTION $LOGNAME")
                text = out.read().decode()
                assert host.address() in text and text.split()[-1] == "alice"
            assert public.split()[1] in sshd.logins(host.address())["alice"]
        with pytest.raises(paramiko.AuthenticationException):  # the key is alice's, not the machine user's
            ssh_login(sshd.addresses[0], sshd.port, key)
        gcp.delete(P, Z, "sshnode")
        assert all(sshd.logins(a) == {} for a in sshd.addresses)
        with pytest.raises(paramiko.AuthenticationException):
            ssh_login(sshd.addresses[0], sshd.port, key, "alice")
    finally:
        emulator.stop()
        sshd.close()


def test_interrupt_during_the_create_call_deletes_only_this_launch(tpu_emulator, monkeypatch):
    """Ctrl-C while the create request is in flight: the node may exist; delete it only if it is ours."""
    api = gcp.client()
    real_create = api.create_node

    def created_then_interrupted(**kw):
        real_create(**kw)  # the API created it, the response never arrived
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "create_node", created_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        gcp.create(spec("inflight"))
    assert leftovers(tpu_emulator) == ([], [])

    monkeypatch.setattr(api, "create_node", real_create)
    gcp.create(spec("other-launch"))

    def interrupted_before_sending(**kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "create_node", interrupted_before_sending)
    with pytest.raises(KeyboardInterrupt):
        gcp.create(spec("other-launch"))
    assert gcp.get(P, Z, "other-launch").ready  # same name, another launch's node: left alone


@pytest.mark.parametrize("queued", [False, True])
def test_a_failed_cleanup_is_said_in_one_line_and_listed_as_an_orphan_until_gone(tpu_emulator, queued):
    """Ctrl-C while the node is created, and its delete is denied: one line names the node and the
    exact gcloud command; %tpu_status and the sidebar list it (no project configured: the recorded
    place is surveyed) until it is gone, re-checked on every listing."""
    from tpunb import report, manager
    from tpunb.registry import Registry
    from tpunb.server import model

    tpu_emulator.faults(slow_create=60)

    def interrupt(state, elapsed):
        if state in ("CREATING", "PROVISIONING"):
            tpu_emulator.faults(delete_denied=True)
            raise KeyboardInterrupt

    with report.captured() as messages, pytest.raises(KeyboardInterrupt):
        gcp.create(spec("stuck", queued=queued), on_state=interrupt)
    command = (f"gcloud compute tpus queued-resources delete stuck --zone {Z} --project {P} --force" if queued
               else f"gcloud compute tpus tpu-vm delete stuck --zone {Z} --project {P}")
    [line] = [m.text for m in messages]
    assert "\n" not in line and line.startswith("[tpunb] stuck may still exist") and line.endswith(command)
    assert "PERMISSION_DENIED" in line or "denied" in line
    assert Registry().orphans()[0][:3] == (P, Z, "stuck")

    [row] = [r for r in manager.host_rows() if r.slice == "stuck"]
    assert row.state.startswith("ORPHAN: its launch was interrupted and deleting it failed") and command in row.state
    [orphan] = model.list_slices()["orphans"]
    assert orphan["name"] == "stuck" and orphan["orphan"] and command in orphan["message"]

    tpu_emulator.faults(delete_denied=False)
    if queued:  # deleted by hand (as the command would): the next listing forgets it
        assert gcp.delete(P, Z, "stuck", wait=True)
        assert [r for r in manager.host_rows() if r.slice == "stuck"] == [] and Registry().orphans() == []
    else:  # or %tpu_down, which deletes it through the recorded place
        assert manager.down("stuck") == ["stuck"] and Registry().orphans() == []
        assert model.list_slices()["orphans"] == []
    assert leftovers(tpu_emulator) == ([], [])


@pytest.mark.fresh_slice
def test_the_preemption_watch_says_once_that_it_cannot_watch_and_why(tpu_emulator, monkeypatch, capsys):
    """The API is switched off under a watched node: one line says so (with the API's reason),
    however many rounds fail; when the API is back, a preemption is still said."""
    from tpunb.provision.gcp.tpu.cloud_node import CloudNode

    monkeypatch.setenv("TPUNB_WATCH_INTERVAL", "0.02")
    info = gcp.create(spec("watched", spot=True))
    node = CloudNode("watched", "v4-8", P, Z, True, info)
    try:
        tpu_emulator.faults(api_disabled=True)
        wait_until(lambda: node.watch_failures >= 5)
        said = capsys.readouterr().err.splitlines()
        blind = [line for line in said if "cannot watch its node" in line]
        assert len(blind) == 1 and "slice watched" in blind[0] and "API" in blind[0], said
        tpu_emulator.faults(api_disabled=False)
        tpu_emulator.preempt("watched")
        err = ""
        while "was preempted" not in err and "PREEMPTED" not in err:
            err += wait_until(lambda: capsys.readouterr().err)
        assert "cannot watch" not in err and "%tpu_launch --recover watched" in err
    finally:
        node.close()
        tpu_emulator.faults(api_disabled=False)
        gcp.delete(P, Z, "watched", wait=True)
