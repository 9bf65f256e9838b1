"""Cloud accounts as they are: OS Login, least-privilege roles. The real google-cloud-tpu and
google-cloud-os-login clients speak HTTP to the emulator, whose accounts model (accounts.py) says
who may do what and whose hosts are real sshd hosts that accept only the users a VM would have."""
from __future__ import annotations

import pytest
import json
import os
import time

from tpunb import manager
from tpunb.errors import ProvisionError
from tpunb.registry import Registry
from tests.test_cloud import cloud, launch, tpu_emulator_options  # noqa: F401 - fixtures

USER = "user@example.com"


@pytest.mark.fresh_slice
def test_os_login_project_launches_four_hosts_as_the_profiles_user(cloud, cell, sshd, launch):
    """enable-oslogin=TRUE in the project: the key goes through OS Login (no flag), every host
    logs in as the account's POSIX user, and the node carries no ssh-keys (the VMs would ignore them)."""
    cloud.faults(os_login=True)
    wire = cloud.record()
    run = launch("--name ol", accel="v4-32")
    assert run.error is None, run.shown
    shown = cell("%%on_tpu\nimport getpass, os\nprint(getpass.getuser(), os.environ['TPUNB_HOST_INDEX'])")
    assert shown.error is None, shown.shown
    assert all(f"[{i}] user_example_com {i}" in shown.stdout for i in range(4)), shown.stdout
    node = cloud.state()["nodes"][0]
    assert "ssh-keys" not in node["metadata"] and json.loads(node["metadata"]["tpunb-slice"])["os_login"] is True
    profile = cloud.accounts()["os_login_profiles"][USER]
    assert (profile["username"], profile["keys"]) == ("user_example_com", 1)
    [expiry] = profile["expiry_usec"]  # the key expires (a profile holds at most 32 KiB of keys)
    assert abs(expiry / 1e6 - time.time() - 30 * 24 * 3600) < 600, expiry
    assert all(list(sshd.logins(a)) == ["user_example_com"] for a in sshd.addresses)
    cell("%tpu_down ol")
    assert cloud.state()["nodes"] == []


def test_an_account_that_may_not_log_in_is_told_before_any_node(cloud, cell, isolated_home, launch):
    """OS Login on, the account without roles/compute.osLogin: one line naming the role and the
    command that grants it, and no create call was ever made."""
    cloud.faults(os_login=True)
    cloud.accounts(permissions={USER: ["roles/tpu.admin", "compute.projects.get"]})
    wire = cloud.record()
    run = launch("--name nope", accel="v4-8")
    text = str(run.error)
    assert run.error is not None and "\n" not in text, run.shown
    assert "OS Login is on in project proj" in text and "roles/compute.osLogin" in text
    assert ("gcloud projects add-iam-policy-binding proj --member=user:user@example.com "
            "--role=roles/compute.osLogin") in text
    assert not [e for e in wire if e.method == "POST"] and cloud.state()["nodes"] == []
    assert Registry(isolated_home / "registry.db").list_slices() == []


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_a_role_with_only_tpu_nodes_launches_lists_and_deletes(cloud, cell, ip, launch):
    """roles: tpu.nodes.* and nothing else (no operations, no queued resources, no project read):
    a plain node is launched, listed, used and deleted, and never asks for a queued resource by name."""
    cloud.accounts(permissions={USER: ["tpu.nodes.*"]})
    wire = cloud.record()
    assert launch("--name lean", accel="v4-8").error is None
    assert cell("%%on_tpu\nimport jax\njax.device_count()").shown.strip() == "4"  # one host: no label
    cell("%tpu_status")
    frame = ip.user_ns["_"]
    assert list(frame["cloud_state"]) == ["READY"]
    down = cell("%tpu_down lean")
    assert down.error is None and "deleted lean" in down.stdout
    assert cloud.state()["nodes"] == []
    by_name = [e for e in wire if "/queuedResources/" in e.path or e.path.endswith("/operations")]
    assert by_name == [], [(e.method, e.path) for e in by_name]
    denied = {(e.method, e.path.rsplit("/", 1)[-1]) for e in wire if e.status == 403}
    assert denied <= {("GET", "queuedResources"), ("GET", "acceleratorTypes")}, denied  # reads tpunb does without


@pytest.mark.fresh_slice
def test_a_node_outlives_a_wiped_notebook_machine(cloud, sshd, launch, tmp_path):
    """What a Colab reset leaves: a node running, and a new kernel in a new process with an empty
    $TPUNB_HOME (no registry, no key) and no gcloud zone. It sees the node in %tpu_status,
    re-attaches it with %tpu_use (a new key through the node's metadata), runs a cell on every host
    and deletes it with %tpu_down, leaving nothing in any zone."""
    from jupyter_client.manager import start_new_kernel

    from tests.test_kernel import execute

    assert launch("--name kept").error is None
    assert launch("--name spare", accel="v4-8").error is None
    manager.detach_all()  # this kernel goes away; the nodes run on
    env = {k: v for k, v in os.environ.items() if k not in ("CLOUDSDK_COMPUTE_ZONE", "CLOUDSDK_COMPUTE_REGION")}
    env.update(TPUNB_HOME=str(tmp_path / "wiped"), CLOUDSDK_CONFIG=str(tmp_path / "no-gcloud"))
    kernel_manager, client = start_new_kernel(kernel_name="python3", env=env)

    def run(code: str) -> str:
        reply, outputs = execute(client, code)
        text = "\n".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in outputs)
        assert reply["status"] == "ok", f"{code}: {reply.get('ename')}: {reply.get('evalue')}\n{text}"
        return text

    try:
        run("%load_ext tpunb")
        status = run("%tpu_status")
        assert "kept" in status and "spare" in status and "ORPHAN" in status, status
        used = run("%tpu_use kept")
        assert "found it in proj/us-central2-b" in used and "current slice: kept (v4-16, 2 hosts, gcp)" in used
        cells = run("%%on_tpu\nimport getpass, os\nprint(getpass.getuser(), os.environ['TPUNB_HOST_INDEX'])")
        assert "[0] tpunb 0" in cells and "[1] tpunb 1" in cells, cells
        assert "deleted kept" in run("%tpu_down kept")
        assert "deleted spare" in run("%tpu_down spare")  # never attached here: found in its zone and deleted
    finally:
        client.stop_channels()
        kernel_manager.shutdown_kernel(now=True)
    state = cloud.state()
    assert state["nodes"] == [] and state["queuedResources"] == []


def test_an_account_that_may_not_act_as_the_vms_service_account_is_told_before_any_node(cloud, isolated_home, launch):
    """OS Login on: logging in to a VM that runs as a service account needs actAs on it. Without
    roles/iam.serviceAccountUser: one line naming the role, the account and the grant command."""
    cloud.faults(os_login=True)
    cloud.accounts(permissions={USER: ["roles/tpu.admin", "compute.projects.get", "roles/compute.osLogin"]})
    wire = cloud.record()
    run = launch("--name actas", accel="v4-8")
    text = str(run.error)
    assert isinstance(run.error, ProvisionError) and "\n" not in text and "Traceback" not in run.shown, run.shown
    assert "the VMs run as proj-compute@developer.gserviceaccount.com, which user@example.com may not act as" in text
    assert ("gcloud iam service-accounts add-iam-policy-binding proj-compute@developer.gserviceaccount.com "
            "--member=user:user@example.com --role=roles/iam.serviceAccountUser") in text, text
    assert not [e for e in wire if e.method == "POST" and "/nodes" in e.path] and cloud.state()["nodes"] == []
    assert Registry(isolated_home / "registry.db").list_slices() == []
