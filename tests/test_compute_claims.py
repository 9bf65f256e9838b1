"""Two notebooks, one project: each notebook its own ~/.tpunb, both launching through Compute Engine.
A second launch of a name another notebook's slice holds (a single VM and a MIG of one name, or
one user's default name) is refused in one line and never deletes or breaks the first, whose
cells keep running; a record whose resources are gone does not block its name; two launches of
one name that overlap (the sandbox holds their inserts until both have looked) leave exactly one
slice and nothing else, for a MIG against a MIG and for a VM against a MIG."""
from __future__ import annotations

import threading

import pytest

from tests.compute_fixture import Google, cloud, sandbox  # noqa: F401 - cloud is a fixture
from tpunb.provision.gcp import apis
from tpunb import catalog
from tpunb.errors import ProvisionError
from tpunb.manager import SliceManager
from tpunb.provision import gcp
from tpunb.provision.gcp.shared import new_launch, read_marker
from tpunb.provision.gcp.compute import VmSpec, first_granted, teardown
from tpunb.provision.gcp.config import CloudOptions
from tpunb.registry import Registry, SliceRecord

pytestmark = pytest.mark.sandbox

ZONE = "us-east5-a"  # v6e-8 (one ct6e-standard-8t), v5p-8 (one ct5p-hightpu-4t) and v5p-16 (a MIG of 2) all here
TPU7X_ZONE = "us-central1-c"


@pytest.fixture(scope="module")
def box():
    yield from sandbox(3, 0.1, 0.05, 0.05)


def other_notebook(monkeypatch, tmp_path, accelerator: str, **options) -> ProvisionError:
    """A launch from another notebook (its own ~/.tpunb and kernel state), which must be refused."""
    with monkeypatch.context() as m:
        m.setenv("TPUNB_HOME", str(tmp_path / "other-notebook"))
        with pytest.raises(ProvisionError) as refused:
            SliceManager().launch(accelerator, backend="gcp", no_setup=True, **options)
    assert "\n" not in str(refused.value) and "https://" not in str(refused.value), str(refused.value)
    return refused.value


@pytest.mark.fresh_slice
def test_a_mig_of_the_name_anothers_vm_holds_is_refused_and_the_vm_keeps_running(cloud, cell, isolated_home,
                                                                                    monkeypatch, tmp_path):
    google = Google(cloud)
    Registry(isolated_home / "registry.db").save_slice(SliceRecord(  # deleted elsewhere long ago: not in the way
        name="team", accelerator="v6e-8", backend="gcp", state="running",
        spec={"api": "compute", "project": cloud.project, "zone": ZONE, "vms": 1, "launch": "0ld0ld00"}))
    run = cell(f"%tpu_launch v6e-8 --name team --zone {ZONE} --no-setup")
    assert run.error is None, run.shown
    assert "the record of team is replaced: its resources are gone" in run.stdout, run.stdout
    before = google.instances.get(project=cloud.project, zone=ZONE, instance="team")

    calls = cloud.emulator.record_compute()
    seen = len(calls)
    refused = other_notebook(monkeypatch, tmp_path, "v5p-16", name="team", zone=ZONE)  # a MIG team, same zone
    assert [c.path for c in calls[seen:] if c.method in ("POST", "DELETE") and "/operations/" not in c.path] == []
    assert str(refused).startswith(f"team is taken in {cloud.project}/{ZONE}: the instance team of another tpunb "
                                   "launch exists"), str(refused)
    assert "%tpu_use team attaches it, %tpu_down team deletes it" in str(refused)
    assert google.everything(ZONE) == {"instances": ["team"], "migs": [], "templates": [], "policies": []}
    after = google.instances.get(project=cloud.project, zone=ZONE, instance="team")
    assert (after.id, after.status, dict(after.labels)) == (before.id, "RUNNING", dict(before.labels))
    still = cell("%%on_tpu\n6 * 7")
    assert still.error is None and still.shown.strip() == "42", still.shown
    assert cell("%tpu_down team").error is None and google.everything(ZONE)["instances"] == []


@pytest.mark.fresh_slice
def test_default_names_hold_the_user_so_only_the_same_user_meets_their_own(cloud, cell, monkeypatch, tmp_path):
    google = Google(cloud)
    run = cell(f"%tpu_launch v6e-8 --zone {ZONE} --no-setup")
    assert run.error is None, run.shown
    name = gcp.default_name(catalog.lookup("v6e-8"))
    assert name == "tpunb-root-v6e-8" and google.everything(ZONE)["instances"] == [name]  # this machine's user
    refused = other_notebook(monkeypatch, tmp_path, "v6e-8", zone=ZONE)  # the same user, a new kernel
    assert f"%tpu_use {name} attaches it" in str(refused) and google.everything(ZONE)["instances"] == [name]
    assert cell("%%on_tpu\n1 + 1").shown.strip() == "2"
    bob = tmp_path / "gcloud-bob"
    (bob / "configurations").mkdir(parents=True)
    (bob / "configurations" / "config_default").write_text("[core]\naccount = Bob.Builder@example.com\n")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(bob))  # another person in the project
    assert gcp.default_name(catalog.lookup("v6e-8")) == "tpunb-bob-builder-v6e-8"
    assert gcp.default_name(catalog.lookup("v5p-12288")).startswith("tpunb-bob-builder-")
    assert cell(f"%tpu_down {name}").error is None


@pytest.mark.fresh_slice
def test_on_the_cloud_tpu_api_too_the_second_notebook_is_refused_and_the_first_keeps_its_node(cloud, cell,
                                                                                               monkeypatch, tmp_path):
    run = cell(f"%tpu_launch v5p-8 --api tpu --name duo --zone {ZONE} --no-setup")
    assert run.error is None, run.shown
    refused = other_notebook(monkeypatch, tmp_path, "v5p-8", api="tpu", name="duo", zone=ZONE)
    assert str(refused) == (f"a TPU named duo already exists in {ZONE}: %tpu_use duo attaches it, %tpu_down duo "
                            "deletes it, or pick another name"), str(refused)
    assert [n["state"] for n in cloud.emulator.nodes()] == ["READY"]
    assert cell("%%on_tpu\n6 * 7").shown.strip() == "42"
    assert cell("%tpu_down duo").error is None and cloud.emulator.nodes() == []


def launching(box, isolated_home, who: str, name: str, accelerator: str, zone: str, results: dict) -> threading.Thread:
    """One notebook's launch of ``name`` up to its hosts (its own registry and launch token), on a thread."""
    vm = VmSpec(name, apis.compute_shape(accelerator), zone, f"{who}@example.com", "tpunb",
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0 someone", False, launch=new_launch())
    record = SliceRecord(name=name, accelerator=accelerator, backend="gcp", state="creating",
                         spec={"api": "compute", "project": box.project, "zone": zone, "launch": vm.launch})
    reg = Registry(isolated_home / f"{who}.db")

    def run() -> None:
        try:
            results[who] = (vm.launch, first_granted(box.project, vm, [zone], record, reg, lambda *_: None,
                                                     CloudOptions())[0])
        except ProvisionError as exc:
            results[who] = (vm.launch, exc)

    thread = threading.Thread(target=run, name=f"launch-{who}", daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("first, second, zone", [("tpu7x-16", "tpu7x-16", TPU7X_ZONE), ("v5p-8", "v5p-16", ZONE)],
                         ids=["mig-and-mig", "vm-and-mig"])
def test_two_overlapping_launches_of_one_name_leave_one_slice_and_nothing_else(cloud, isolated_home, first, second,
                                                                               zone):
    google = Google(cloud)
    cloud.emulator.compute_faults(hold_inserts=2)  # both look before either makes anything
    results: dict = {}
    for thread in [launching(cloud, isolated_home, "ann", "same", first, zone, results),
                   launching(cloud, isolated_home, "ben", "same", second, zone, results)]:
        thread.join(60)
    won = {who: launch for who, (launch, got) in results.items() if isinstance(got, list)}
    lost = [got for _, got in results.values() if isinstance(got, ProvisionError)]
    assert len(won) == 1 and len(lost) == 1, results
    assert lost[0].reason == "exists" and str(lost[0]).startswith("same is taken") and "\n" not in str(lost[0])
    (winner, token), = won.items()
    shape = apis.compute_shape(first if winner == "ann" else second)
    left = google.everything(zone)
    if shape.multi_host:
        assert (left["migs"], left["templates"], left["policies"]) == (["same"], ["same-tpunb-t"], ["same-tpunb-wp"])
        group = google.migs.get(project=cloud.project, zone=zone, instance_group_manager="same")
        assert read_marker(group.description).launch == token
    else:
        assert left == {"instances": ["same"], "migs": [], "templates": [], "policies": []}
    vms = [google.instances.get(project=cloud.project, zone=zone, instance=n) for n in left["instances"]]
    assert len(vms) == shape.vms and all(v.labels["tpunb-launch"] == token for v in vms)
    assert teardown(cloud.project, zone, "same", vms=shape.vms, launch=token) == ""
    assert all(not v for v in google.everything(zone).values())


def test_every_kind_of_resource_answers_409_to_a_second_create_of_its_name(cloud):
    """What the look before creating cannot rule out, Compute Engine does: a name taken twice is a
    409 for an instance, a MIG, a template (regional or global) and a workload policy alike."""
    from google.api_core.client_options import ClientOptions
    from google.api_core.exceptions import Conflict
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    from tests.compute_fixture import made
    from tpunb.provision.gcp.compute import bodies

    google, p, region = Google(cloud), cloud.project, catalog.region_of(ZONE)
    made(google, "twice", "v5p-16", ZONE)
    made(google, "twice", "v6e-8", ZONE)  # a VM and a MIG of one name do not collide
    vm = VmSpec("twice", apis.compute_shape("v5p-16"), ZONE, "someone@example.com", "tpunb",
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0 someone", False)
    one = VmSpec("twice", apis.compute_shape("v6e-8"), ZONE, "someone@example.com", "tpunb",
                 "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0 someone", False)
    global_templates = compute_v1.InstanceTemplatesClient(credentials=AnonymousCredentials(),
                                                          client_options=ClientOptions(api_endpoint=cloud.compute_url))
    global_templates.insert_unary(project=p, instance_template_resource=bodies.template(vm))
    creates = {
        "instance": lambda: google.instances.insert_unary(project=p, zone=ZONE, instance_resource=bodies.instance(one)),
        "MIG": lambda: google.migs.insert_unary(project=p, zone=ZONE, instance_group_manager_resource=bodies.mig(vm, p)),
        "template": lambda: google.templates.insert_unary(project=p, region=region,
                                                          instance_template_resource=bodies.template(vm)),
        "global template": lambda: global_templates.insert_unary(project=p,
                                                                 instance_template_resource=bodies.template(vm)),
        "policy": lambda: google.policies.insert_unary(project=p, region=region,
                                                       resource_policy_resource=bodies.workload_policy(vm)),
    }
    for kind, create in creates.items():
        with pytest.raises(Conflict):
            create()
    global_templates.delete_unary(project=p, instance_template="twice-tpunb-t")
    assert teardown(p, ZONE, "twice") == "" and all(not v for v in google.everything(ZONE).values())
