"""The first cell on a fresh Cloud TPU VM: hosts of a bare image (Python 3.10, no JAX, each its own
home; tpunb.sandbox.hosts.image) are prepared by tpunb at %tpu_launch, in a uv environment with the
notebook's Python, jax, flax and the host side's packages; bad input and faults end in one line
naming the host and the cause, and leave no node behind.

The hosts here are this module's own, fresh: the first test makes their environments for real
(uv pip-installed into each home, the kernel's Python from the image's stand-in for uv's managed
ones, packages from PyPI through the shared cache). The later tests find them made.
"""
from __future__ import annotations

import ast
import json
import os
import platform
import socket
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

from tpunb import manager
from tpunb.diagnose.pythons import kernel_python
from tpunb.errors import CellInterrupted, HostSetupError, UsageError
from tpunb.provision import hostenv
from tpunb.registry import Registry
from tests.conftest import interrupt_kernel_when, wait_for
from tests.emulator_fixture import assert_nothing_leaked, configure, on_sshd
from tests.sshd import Sshd

ZONE = "us-central1-a"  # offers v5litepod-4 (1 host), -8 (2 hosts) and -16 (4 hosts)


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """Four fresh bare-image hosts for this module."""
    server = Sshd(hosts=4, directory=tmp_path_factory.mktemp("bare-sshd"))
    yield server
    server.close()


@pytest.fixture
def tpu_emulator_options(bare):
    return on_sshd(bare)


@pytest.fixture
def cloud(tpu_emulator, monkeypatch, isolated_home):
    configure(monkeypatch, ZONE)
    yield tpu_emulator
    assert_nothing_leaked(tpu_emulator, isolated_home)


def env_dir(server: Sshd, host: int) -> Path:
    return server.home(server.addresses[host]) / ".tpunb" / "env"


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_first_cell_on_a_bare_v5litepod_16(cloud, cell, bare):
    """The issue's 'done when': no option; jax and flax come from the environment tpunb made on each
    host, 16 devices, and a lambda pushed from the notebook runs there."""
    for host in range(4):
        assert not env_dir(bare, host).exists()
    marks_before = kernel_python_marks()
    started = time.time()
    run = cell("%tpu_launch v5litepod-16 --name first")
    assert run.error is None, run.shown
    first = cell("%%on_tpu\nimport os, sys, jax, flax\n"
                 "print(jax.device_count(), jax.local_device_count(), sys.version_info[:2])\n"
                 "os.path.dirname(jax.__file__), os.path.dirname(flax.__file__)")
    assert first.error is None, first.shown
    assert f"[0-3] 16 4 {tuple(sys.version_info[:2])}" in first.stdout, first.shown
    reprs = manager.current().last_result.reprs
    for host in range(4):
        site = str(env_dir(bare, host) / "lib")
        jax_dir, flax_dir = ast.literal_eval(reprs[host])
        assert jax_dir.startswith(site) and flax_dir.startswith(site), (host, jax_dir, flax_dir)
        assert (env_dir(bare, host) / "tpunb-env.json").stat().st_mtime >= started  # made by this launch
    pushed = cell("double = lambda x: 2 * x\n%tpu_push double")
    assert pushed.error is None, pushed.shown
    assert "Out[0-3]: 42" in cell("%%on_tpu\ndouble(21)").shown
    cell("%tpu_down first")
    # the stand-in for uv's managed Python links to this machine's own: uv's marks stayed in the stand-in
    assert kernel_python_marks() == marks_before


def kernel_python_marks() -> tuple:
    """What uv writes into a Python it manages (EXTERNALLY-MANAGED, a rewritten _sysconfigdata_),
    as this kernel's own installation has them: a test must never change them."""
    stdlib = Path(sysconfig.get_path("stdlib"))
    return tuple((p.name, p.stat().st_mtime_ns) for p in sorted(stdlib.glob("_sysconfigdata_*.py"))) + (
        (stdlib / "EXTERNALLY-MANAGED").exists(),)


@pytest.mark.fresh_slice
def test_a_relaunch_onto_kept_disks_only_checks_and_status_shows_versions(cloud, cell, ip, bare):
    """The environment is there (this sandbox keeps disks between nodes): starting costs a file
    read per host, no bar is shown, and %tpu_status --versions lists what each host runs."""
    if not all(env_dir(bare, host).exists() for host in range(4)):  # made here unless another test did
        assert cell("%tpu_launch v5litepod-16 --name before").error is None
        cell("%tpu_down before")
    run = cell("%tpu_launch v5litepod-16 --name again")
    assert run.error is None, run.shown
    assert "preparing" not in run.stdout + run.stderr
    sl = manager.current()
    assert all(h.info["env"]["fresh"] is False for h in sl.session.hosts)
    cell("%tpu_status --versions")
    frame = ip.user_ns["_"]
    assert list(frame["python"]) == [platform.python_version()] * 4
    assert set(frame["jax"]) == {hostenv.kernel_jax()[0]} and all(frame["flax"])
    assert [Path(p) for p in frame["env"]] == [env_dir(bare, h) for h in range(4)]
    record = Registry().get_slice("again")
    assert record.hosts[0].info.env["versions"]["cloudpickle"]  # recorded for other kernels
    cell("%tpu_down again")


@pytest.mark.fresh_slice
def test_requirements_and_pip_add_the_users_packages(cloud, cell, bare, tmp_path):
    """--requirements FILE (read here) and --pip go into the same environment, recorded with it."""
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("six\n")
    run = cell(f"%tpu_launch v5litepod-4 --name mine --requirements {requirements} --pip 'idna>=2'")
    assert run.error is None, run.shown
    assert cell("%%on_tpu\nimport six, idna, sys\nsix.__file__.startswith(sys.prefix)").shown.strip() == "True"  # one host
    recorded = json.loads((env_dir(bare, 0) / "tpunb-env.json").read_text())
    assert "idna>=2" in recorded["requirements"] and recorded["versions"]["six"]
    cell("%tpu_down mine")


def launch_fails(cell, cloud, line: str, isolated_home) -> str:
    """Launch that must fail with one line; nothing may be left billing. The error's text."""
    run = cell(line)
    assert isinstance(run.error, HostSetupError), run.shown
    text = str(run.error)
    assert "\n" not in text and "Traceback" not in run.shown
    assert run.stdout.strip().splitlines()[-1] == f"HostSetupError: {text}"
    wait_for(lambda: cloud.state()["nodes"] == [], 10, "the node to be deleted")
    assert Registry(isolated_home / "registry.db").list_slices() == []
    return text


@pytest.mark.fresh_slice
def test_a_package_that_does_not_exist(cloud, cell, isolated_home):
    text = launch_fails(cell, cloud, "%tpu_launch v5litepod-4 --pip tpunb-no-such-package-xyz", isolated_home)
    assert text.startswith("cannot prepare host 0 (127.0.0.2:")
    assert "package tpunb-no-such-package-xyz does not exist on the package index" in text
    assert "was deleted (--keep keeps it to look at)" in text


@pytest.mark.fresh_slice
def test_a_version_with_no_wheel_for_the_hosts_python(cloud, cell, isolated_home):
    text = launch_fails(cell, cloud, "%tpu_launch v5litepod-4 --pip pillow==9.0.0", isolated_home)
    assert f"pillow==9.0.0 has no wheel for this host's Python {kernel_python()}" in text and "host 0" in text


@pytest.mark.fresh_slice
def test_a_python_uv_cannot_provide(cloud, cell, isolated_home):
    text = launch_fails(cell, cloud, "%tpu_launch v5litepod-4 --python 3.99", isolated_home)
    assert "host 0" in text and "uv cannot provide Python cpython-3.99" in text


@pytest.mark.fresh_slice
def test_a_host_with_no_route_to_the_package_index(cloud, cell, bare, isolated_home):
    """Host 1 of two reaches no index (its uv config names one that refuses): only it is named."""
    config = bare.home(bare.addresses[1]) / ".config" / "uv" / "uv.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('index-url = "http://127.0.0.1:9/simple"\n')  # port 9 (discard) refuses here
    try:
        text = launch_fails(cell, cloud, "%tpu_launch v4-16 --zone us-central2-b --pip six", isolated_home)
    finally:
        config.unlink()
    assert text.startswith("cannot prepare host 1 (127.0.0.3:") and "host 0" not in text
    assert "no route to the package index (http://127.0.0.1:9)" in text


@pytest.mark.fresh_slice
def test_keep_keeps_the_node_of_a_failed_preparation(cloud, cell, isolated_home):
    run = cell("%tpu_launch v5litepod-4 --name kept --keep --pip tpunb-no-such-package-xyz")
    assert isinstance(run.error, HostSetupError) and "kept was kept (--keep)" in str(run.error), run.shown
    assert [n["name"].rsplit("/", 1)[-1] for n in cloud.state()["nodes"]] == ["kept"]
    assert cell("%tpu_down kept").error is None
    wait_for(lambda: cloud.state()["nodes"] == [], 10, "the node to be deleted")


@pytest.mark.fresh_slice
def test_ctrl_c_during_preparation_stops_every_host_and_deletes_the_node(cloud, cell, bare, isolated_home):
    """An index that accepts and never answers holds both hosts' uv; Ctrl-C ends the launch in one
    line, every host's uv within 3 s, and the node."""
    listener = socket.create_server(("127.0.0.1", 0))
    held = []
    threading.Thread(target=lambda: [held.append(listener.accept()) for _ in iter(int, 1)], daemon=True).start()
    configs = [bare.home(a) / ".config" / "uv" / "uv.toml" for a in bare.addresses[:2]]
    for config in configs:
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(f'index-url = "http://127.0.0.1:{listener.getsockname()[1]}/simple"\n')
    try:
        sent = interrupt_kernel_when(lambda: len(uv_installs(bare)) == 2, timeout=120)
        run = cell("%tpu_launch v4-16 --zone us-central2-b --name cut --pip einops")
        stopped = time.perf_counter()
    finally:
        for config in configs:
            config.unlink()
        listener.close()
    assert isinstance(run.error, CellInterrupted), run.shown
    assert "nothing is left running" in str(run.error)
    wait_for(lambda: not uv_installs(bare), 3 - (time.perf_counter() - sent["at"]), "every host's uv to end")
    assert stopped - sent["at"] < 3
    wait_for(lambda: cloud.state()["nodes"] == [], 10, "the node to be deleted")
    assert Registry(isolated_home / "registry.db").list_slices() == []


def uv_installs(server: Sshd) -> list[int]:
    """Pids of `uv pip install` running on these hosts (by the hosts' homes in their environment)."""
    homes = {f"HOME={server.home(a)}".encode() for a in server.addresses}
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if len(argv) < 3 or not argv[0].endswith(b"uv") or argv[1:3] != [b"pip", b"install"]:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if homes & set(f.read().split(b"\0")):
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.fresh_slice
@pytest.mark.sandbox
@pytest.mark.jax
def test_connect_setup_uses_the_same_environment_and_is_off_by_default(cell, bare, ssh_key_for):
    """%tpu_connect --setup checks (here: finds) the environment a cloud slice gets; without it the
    hosts' own Python runs the agent, and jax is not there."""
    hosts = ",".join(f"{a}:{bare.port}" for a in bare.addresses[:2])
    plain = cell(f"%tpu_connect {hosts} --key {ssh_key_for(bare)} --name plain")
    assert plain.error is None, plain.shown
    assert "Python 3.10" in plain.stderr  # the image's Python: said once, with what breaks
    missing = cell("%%on_tpu\nimport jax")
    assert "ModuleNotFoundError" in missing.shown
    cell("%tpu_down plain")
    made = cell(f"%tpu_connect {hosts} --key {ssh_key_for(bare)} --name made --setup")
    assert made.error is None, made.shown
    assert "Out[0-1]: True" in cell(f"%%on_tpu\nimport sys\nsys.prefix.startswith({str(bare.dir)!r})").shown
    cell("%tpu_down made")


@pytest.fixture
def ssh_key_for(tmp_path):
    from tests.sshd import _write_ed25519

    def key(server: Sshd) -> Path:
        path = tmp_path / "id_ed25519"
        if not path.exists():
            server.authorize(_write_ed25519(path))
        return path

    return key


@pytest.mark.fresh_slice
@pytest.mark.sandbox
def test_python_mismatch_is_said_at_connect_and_refuses_pushing_code(cell, bare, ssh_key_for):
    """pyenv's 3.10 (the image's Python) against this kernel's: one warning at connect naming what
    breaks, and a push of a notebook function fails in one line before anything is sent."""
    hosts = ",".join(f"{a}:{bare.port}" for a in bare.addresses[:2])
    run = cell(f"%tpu_connect {hosts} --key {ssh_key_for(bare)} --python {bare.image.bare_python} --name old")
    assert run.error is None, run.shown
    warning = [line for line in run.stderr.splitlines() if "Python 3.10" in line]
    assert len(warning) == 1 and "hosts 0-1 run Python 3.10" in warning[0]
    assert f"this notebook Python {kernel_python()}" in warning[0] and "cannot load there" in warning[0]
    refused = cell("def area(r):\n    return 3.14 * r * r\n%tpu_push area")
    assert isinstance(refused.error, UsageError), refused.shown
    assert "cannot push area to hosts 0-1" in str(refused.error) and "\n" not in str(refused.error)
    assert "NameError" in cell("%%on_tpu\narea").shown  # nothing was sent
    assert cell("radius = 2.5\n%tpu_push radius").error is None  # plain values still go
    assert "Out[0-1]: 2.5" in cell("%%on_tpu\nradius").shown
    cell("%tpu_down old")


@pytest.mark.parametrize("accel", ["v2-8", "v3-32"])
@pytest.mark.fresh_slice
def test_slices_on_a_generation_without_multislice_is_refused_before_any_api_call(cloud, cell, accel):
    exchanges = cloud.record()
    before = len(exchanges)
    run = cell(f"%tpu_launch {accel} --slices 2")
    assert isinstance(run.error, UsageError), run.shown
    assert f"--slices 2: {accel.split('-')[0]} has no multislice" in str(run.error) and "\n" not in str(run.error)
    assert len(exchanges) == before  # not one call reached the Cloud TPU API
    local = cell(f"%tpu_launch {accel} --slices 2 --backend local")
    assert isinstance(local.error, UsageError) and "has no multislice" in str(local.error)
