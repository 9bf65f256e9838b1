"""What a host's environment is made of, decided on the host (tpunb/host/prepare.py): whether it has
a TPU (as JAX decides it, from PCI vendor ids), and where libtpu comes from for older jax."""
from __future__ import annotations

from pathlib import Path

import pytest

from tpunb.host import prepare


def _pci(root: Path, devices: list[tuple[str, str]]) -> str:
    """A /sys/bus/pci/devices-shaped folder: one device per (vendor id, device id)."""
    for i, (vendor, device_id) in enumerate(devices):
        device = root / f"0000:00:{i:02x}.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text(vendor + "\n")
        (device / "device").write_text(device_id + "\n")
    return str(root)


def test_a_tpu_is_a_pci_device_of_googles_vendor_and_a_tpus_device_id(tmp_path):
    gvnic, intel = ("0x1ae0", "0x0042"), ("0x8086", "0x7020")
    assert prepare.has_tpu(_pci(tmp_path / "v6e", [intel, gvnic, ("0x1ae0", "0x006f")])) is True
    assert prepare.has_tpu(_pci(tmp_path / "tpu7x", [("0x1ae0", "0x0076")])) is True
    assert prepare.has_tpu(_pci(tmp_path / "gce-vm", [intel, gvnic])) is False  # Google's NIC is not a TPU
    assert prepare.has_tpu(str(tmp_path / "no-sysfs")) is False


def test_whether_chips_were_found_is_part_of_the_environments_digest():
    spec = {"python": "3.11", "jax": "0.7.2", "packages": ["flax"]}
    assert prepare.digest(spec, tpu=True) != prepare.digest(spec, tpu=False)
    assert prepare.digest(spec, tpu=True) == prepare.digest(dict(spec), tpu=True)


@pytest.mark.parametrize("jax, tpu, links", [
    ("0.5.0", True, True), ("0.4.35", True, True),  # libtpu-nightly: only on JAX's own page
    ("0.5.1", True, False), ("0.7.2", True, False),  # libtpu on PyPI
    ("0.4.35", False, False),  # no chips: plain jax, no libtpu at all
])
def test_older_jax_on_a_tpu_gets_jaxs_libtpu_page(jax, tpu, links):
    wanted = prepare.jax_requirement({"jax": jax, "jax_pinned": True}, (3, 11, 0), tpu=tpu)
    assert wanted[0] == ("jax[tpu]" if tpu else "jax") + f"=={jax}"
    assert prepare.index_options(wanted) == (["--find-links", prepare.LIBTPU_FIND_LINKS] if links else [])


def test_a_second_preparer_waits_for_the_first_then_finds_the_environment_made(tmp_path):
    """Two kernels attaching at once: the one that finds the lock taken says so while it waits, and
    once the other has made the environment it uses it instead of making it again."""
    import fcntl
    import json
    import os
    import sys
    import threading

    env_dir = tmp_path / "env"
    spec = {"dir": str(env_dir), "python": "3.11", "jax": "0.7.2", "packages": []}
    holder = os.open(str(env_dir) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)  # the first kernel, preparing
    said, waiting, outcome = [], threading.Event(), {}

    def say(message: dict) -> None:
        said.append(message)
        if "waiting" in message.get("note", ""):
            waiting.set()

    second = threading.Thread(target=lambda: outcome.setdefault("info", prepare.ensure(spec, say)), daemon=True)
    second.start()
    assert waiting.wait(10), said
    (env_dir / "bin").mkdir(parents=True)  # what the first kernel made, marker last
    (env_dir / "bin" / "python").symlink_to(sys.executable)
    (env_dir / prepare.MARKER).write_text(json.dumps({"digest": prepare.digest(spec), "versions": {"jax": "0.7.2"}}))
    assert second.is_alive()  # still waiting: it has not looked before the lock is free
    os.close(holder)
    second.join(10)
    assert outcome["info"]["fresh"] is False and outcome["info"]["versions"] == {"jax": "0.7.2"}
    assert {m["note"] for m in said} == {"another process is preparing this environment: waiting"}  # beats only


def test_preparing_a_host_marks_the_armed_idle_watchdogs_activity(tmp_path, monkeypatch):
    """A first environment build outlasts the boot watchdog's grace: each step's beat marks activity
    (where a watchdog is armed; elsewhere it leaves no file)."""
    import os

    from tpunb.host.standalone import idle

    assert prepare.IDLE_FILES == (idle.STATE, idle.ACTIVITY)
    monkeypatch.setenv("TPUNB_HOST_DIR", str(tmp_path))
    prepare._Steps(lambda message: None).run("uv", lambda: None)  # not armed: nothing appears
    assert sorted(os.listdir(tmp_path)) == []
    (tmp_path / idle.STATE).write_text("{}")
    (tmp_path / idle.ACTIVITY).write_text("")
    os.utime(tmp_path / idle.ACTIVITY, (1_000_000, 1_000_000))
    steps = prepare._Steps(lambda message: None)
    steps.run("uv", lambda: steps.note("uv 0.9", force=False))
    assert idle.last_activity()[0] > 1_000_000 + 3600 * 24 * 365
