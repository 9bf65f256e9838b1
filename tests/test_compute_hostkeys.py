"""Each Compute Engine VM has an SSH host key of its own, which it publishes as guest attributes
under hostkeys/ (as gcloud compute ssh reads them), and tpunb pins each host's key from there
instead of trusting the first key it sees: a relaunch onto the addresses of a deleted slice works
(the sandbox hands the same address to the next VM, with a new key), and a VM whose sshd presents
another key than it published is refused in one line before any cell runs, its slice deleted."""
from __future__ import annotations

import pytest

from tests.compute_fixture import Google, cloud, sandbox  # noqa: F401 - cloud is a fixture
from tpunb.errors import HostKeyError
from tpunb.registry import Registry

pytestmark = pytest.mark.sandbox

ZONE = "us-east5-b"


@pytest.fixture(scope="module")
def box():
    yield from sandbox(1, 0.1, 0.05, 0.05)


def published(google: Google, box, name: str) -> str:
    answer = google.instances.get_guest_attributes(request={"project": box.project, "zone": ZONE, "instance": name,
                                                            "query_path": "hostkeys/"})
    return {i.key: i.value for i in answer.query_value.items if i.namespace == "hostkeys"}["ssh-ed25519"]


@pytest.mark.fresh_slice
def test_each_vm_has_its_own_key_a_relaunch_on_its_address_works_and_a_forged_one_is_refused(cloud, cell,
                                                                                             isolated_home):
    google, reg = Google(cloud), Registry(isolated_home / "registry.db")
    keys, address = [], cloud.sshd.addresses[0]  # one host: every VM here gets this address
    for name in ("first", "again"):
        run = cell(f"%tpu_launch v6e-8 --name {name} --zone {ZONE} --no-setup")
        assert run.error is None, run.shown
        key = published(google, cloud, name)
        assert cloud.sshd.host_key(address).split()[1] == key  # what its sshd presents
        assert reg.get_host_key(address, cloud.sshd.port) == ("ssh-ed25519", key)  # pinned from there
        assert cell("%%on_tpu\n'up'").shown.strip() == "'up'"
        assert cell(f"%tpu_down {name}").error is None
        keys.append(key)
    assert keys[0] != keys[1]  # a new VM, a new key, on the same address

    cloud.emulator.compute_faults(forged_host_keys=True)  # its guest attributes name another key than sshd's
    try:
        run = cell(f"%tpu_launch v6e-8 --name forged --zone {ZONE} --no-setup")
    finally:
        cloud.emulator.compute_faults(forged_host_keys=False)
    assert isinstance(run.error, HostKeyError) and "\n" not in str(run.error), run.shown
    assert str(run.error).startswith("forged: a host's SSH key is not the one its VM published in its guest "
                                     f"attributes (hostkeys/): {address}:{cloud.sshd.port} presents "), str(run.error)
    assert str(run.error).endswith("; refused before any cell ran") and "accept-new-host-key" not in str(run.error)
    assert "Traceback" not in run.shown and google.everything(ZONE)["instances"] == []
    assert reg.list_slices() == []
