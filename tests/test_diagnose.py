"""Diagnoses at connect, on real OpenSSH hosts: a host with another jax version is named, a
process holding the TPU's device files is named with the line that frees it, and a coordinator
port that drops packets fails the cell in seconds with the port and the firewall rule."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tpunb import diagnose, doctor, manager
from tpunb.host import diagnose as host_diagnose


def specs(sshd, hosts):
    return ",".join(f"{a}:{sshd.port}" for a in hosts)


@pytest.fixture
def other_jax_python(tmp_path):
    """A second Python environment, as a host set up by hand may have: a venv over this Python's
    packages whose own site-packages says jax is 0.4.1."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    dist = site / "jax-0.4.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: jax\nVersion: 0.4.1\n")
    return str(venv / "bin" / "python")


@pytest.mark.fresh_slice
def test_a_host_with_another_jax_is_named_in_one_warning(cell, sshd, ssh_key, other_jax_python):
    run = cell(f"%tpu_connect {specs(sshd, sshd.addresses[:3])} --key {ssh_key} "
               f"--python {sshd.python},{other_jax_python},{sshd.python}")
    assert run.error is None, run.shown
    ours = host_diagnose.versions()["jax"]
    warnings = [line for line in run.shown.splitlines() if "different versions" in line]
    assert len(warnings) == 1, run.shown
    assert f"jax {ours} on hosts 0,2 but 0.4.1 on host 1" in warnings[0]
    assert "python" not in warnings[0].split(":", 1)[1].split("(")[0]  # only what differs is named

    table = cell("%tpu_status --versions").result.result
    assert list(table["host"]) == [0, 1, 2]
    assert list(table["jax"]) == [ours, "0.4.1", ours]
    assert set(table["python"]) == {host_diagnose.versions()["python"]}
    assert set(table["libtpu"]) == {""}  # not installed here: a blank, not None
    assert diagnose.problems(manager.current()) == [warnings[0]]
    rows = {r.check: r for r in doctor()}  # %tpu_doctor finds the same, and nothing else wrong
    assert rows["package versions"].status == "warning" and warnings[0] in rows["package versions"].why
    assert rows["TPU free"].status == rows["coordinator port"].status == "ok"


@pytest.mark.fresh_slice
def test_hosts_that_agree_give_no_warning(cell, sshd, ssh_key):
    run = cell(f"%tpu_connect {specs(sshd, sshd.addresses[:2])} --key {ssh_key} --python {sshd.python}")
    assert run.error is None, run.shown
    assert "different versions" not in run.shown
    assert manager.current().warn_version_skew() is None


@pytest.mark.fresh_slice
def test_hosts_on_the_kernels_python_do_not_read_their_versions_but_show_the_kernels(cell):
    """A local slice's hosts run this kernel's Python: their hello says so instead of reading
    package metadata (10 ms a process), and %tpu_status --versions shows this kernel's versions."""
    assert cell("%tpu_launch v4-16 --name same").error is None
    sl = manager.current()
    assert [h.info["versions"] for h in sl.session.hosts] == ["kernel", "kernel"]
    ours = host_diagnose.versions()
    table = cell("%tpu_status --versions").result.result
    assert list(table["host"]) == [0, 1] and list(table["jax"]) == [ours["jax"]] * 2
    assert list(table["python"]) == [ours["python"]] * 2
    assert sl.warn_version_skew() is None


def test_skew_line_names_each_differing_package_once():
    line = diagnose.skew_line({0: {"python": "3.11.7", "jax": "0.10.2", "jaxlib": "0.10.2"},
                               1: {"python": "3.11.7", "jax": "0.10.2", "jaxlib": "0.9.0"},
                               2: {"python": "3.12.1", "jax": "0.10.2", "jaxlib": "0.10.2"},
                               3: None})  # a host that sent no versions is not compared
    assert line.count("\n") == 0
    assert "jaxlib 0.10.2 on hosts 0,2 but 0.9.0 on host 1" in line
    assert "python 3.11.7 on hosts 0,1 but 3.12.1 on host 2" in line
    assert "jax 0.10.2" not in line


@pytest.fixture
def tpu_held(tmp_path):
    """A TPU device file (a plain file here) held open by a real process, and the environment
    that points the hosts at it."""
    device = tmp_path / "accel0"
    device.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", "import sys; f = open(sys.argv[1]); print('holding', flush=True); "
                               "sys.stdin.read()", str(device)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "holding\n"  # it has the file open
    # JAX_PLATFORMS unset (the test hosts' image says cpu): JAX may pick the TPU, so the hosts look
    yield holder, {host_diagnose.DEVICES_ENV: str(tmp_path / "accel*"),
                   host_diagnose.LOCKFILE_ENV: str(tmp_path / "libtpu_lockfile"), "JAX_PLATFORMS": ""}
    holder.kill()
    holder.wait()


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_a_process_holding_the_tpu_is_named_and_the_given_line_frees_it(cell, sshd, ssh_key, tpu_held):
    holder, env = tpu_held
    settings = " ".join(f"{k}={v}" for k, v in env.items())
    run = cell(f"%tpu_connect {specs(sshd, sshd.addresses[:2])} --key {ssh_key} --python {sshd.python} --env {settings}")
    assert run.error is None, run.shown
    failed = cell("%%on_tpu\nimport jax")
    assert failed.error is not None
    assert f"the TPU on host 0 is held by pid {holder.pid}" in failed.shown, failed.shown
    assert "-c import sys; f = open(sys.argv[1])" in failed.shown  # its command line
    checks = diagnose.check_hosts(manager.current())  # what %tpu_doctor asks, on demand
    assert [c.host for c in checks] == [0, 1]
    assert all(f"held by pid {holder.pid}" in c.tpu_busy and c.coordinator is None for c in checks)
    row = next(r for r in doctor() if r.check == "TPU free")
    assert row.status == "failed" and f"held by pid {holder.pid}" in row.why and "(and 1 more hosts)" in row.why
    fix = re.search(r"%tpu_run --hosts 0 kill [0-9 ]+", failed.shown).group(0)
    assert fix.split()[-1] == str(holder.pid)
    assert cell(fix).error is None
    assert holder.wait(timeout=30) != 0  # the line ended it
    started = cell("%%on_tpu\nimport jax\njax.process_count()")  # nothing of JAX was left half-started
    assert started.error is None, started.shown
    assert "Out[0-1]: 2" in started.shown


@pytest.mark.fresh_slice
def test_jax_saying_the_tpu_is_in_use_gets_the_holder_named(cell, sshd, ssh_key, tpu_held):
    """What libtpu raises when our check could not see the holder (another user's process)."""
    holder, env = tpu_held
    settings = " ".join(f"{k}={v}" for k, v in env.items())
    assert cell(f"%tpu_connect {specs(sshd, sshd.addresses[:1])} --key {ssh_key} --python {sshd.python} "
                f"--env {settings}").error is None
    failed = cell("%%on_tpu\nraise RuntimeError(\"Unable to initialize backend 'tpu': ABORTED: The TPU is already in "
                  "use by process with pid 1. Not attempting to load libtpu.so in this process.\")")
    assert "Not attempting to load libtpu.so" in failed.shown  # the error itself is kept
    assert f"[tpunb] the TPU on host 0 is held by pid {holder.pid}" in failed.shown, failed.shown
    other = cell("%%on_tpu\nraise RuntimeError('something else')")
    assert "[tpunb]" not in other.shown


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_a_stale_libtpu_lockfile_is_named_with_the_line_that_removes_it(cell, sshd, ssh_key, tmp_path):
    lock = tmp_path / "libtpu_lockfile"
    lock.write_text("")  # left by a run that was killed: no process has it open
    env = f"{host_diagnose.DEVICES_ENV}={tmp_path}/accel* {host_diagnose.LOCKFILE_ENV}={lock} JAX_PLATFORMS="
    assert cell(f"%tpu_connect {specs(sshd, sshd.addresses[:1])} --key {ssh_key} --python {sshd.python} "
                f"--env {env}").error is None
    failed = cell("%%on_tpu\nimport jax")
    assert f"a stale {lock} on host 0" in failed.shown, failed.shown
    assert cell(f"%tpu_run --hosts 0 rm -f {lock}").error is None
    assert not lock.exists()
    assert cell("%%on_tpu\nimport jax\njax.device_count()").error is None


def test_another_users_lockfile_is_not_called_stale():
    """Their processes are hidden from a user who is not root: the lock may be live. The check runs
    as user nobody (the system's Python: pyenv's is under /root), on a lock file root made. The
    module runs from a copy beside the lock: nobody may not be able to read the checkout (a clone
    inside a 0700 folder, as ``mktemp -d`` makes them)."""
    where = Path(tempfile.mkdtemp())  # pytest's own temp dirs are root's alone
    where.chmod(0o755)
    (where / "libtpu_lockfile").write_text("")
    shutil.copy(host_diagnose.__file__, where / "diagnose.py")
    code = f"import sys; sys.path.insert(0, {str(where)!r}); import diagnose; print(diagnose.tpu_busy(0))"
    seen = subprocess.run(["/usr/bin/python3", "-I", "-c", code], capture_output=True, text=True, check=True,
                          user=65534, env={host_diagnose.DEVICES_ENV: f"{where}/accel*",
                                           host_diagnose.LOCKFILE_ENV: f"{where}/libtpu_lockfile"}).stdout
    shutil.rmtree(where)
    assert "belongs to another user" in seen and "sudo lsof -w /dev/accel*" in seen, seen
    assert "stale" not in seen


def test_nothing_is_said_when_the_tpu_is_free(tmp_path, monkeypatch):
    monkeypatch.setenv(host_diagnose.DEVICES_ENV, str(tmp_path / "accel*"))
    monkeypatch.setenv(host_diagnose.LOCKFILE_ENV, str(tmp_path / "libtpu_lockfile"))
    (tmp_path / "accel0").write_text("")  # present, held by nobody
    assert host_diagnose.tpu_busy(0) is None



def test_chips_another_process_was_given_are_not_ours_to_check(tmp_path, monkeypatch):
    """Processes sharing a VM's chips (TPU_VISIBLE_CHIPS) each hold their own accel files."""
    for chip in (0, 1):
        (tmp_path / f"accel{chip}").write_text("")
    monkeypatch.setenv(host_diagnose.DEVICES_ENV, str(tmp_path / "accel*"))
    assert host_diagnose.device_paths() == [str(tmp_path / "accel0"), str(tmp_path / "accel1")]
    monkeypatch.setenv("TPU_VISIBLE_CHIPS", "1")
    assert host_diagnose.device_paths() == [str(tmp_path / "accel1")]


@pytest.fixture
def dropping_port(sshd):
    """A port on host 0's address that drops connection attempts, as a firewall does: a listener
    whose backlog is full and that never accepts (Linux then ignores further SYNs)."""
    listener = socket.socket()
    listener.bind((sshd.addresses[0], 0))
    listener.listen(0)
    filler = socket.create_connection(listener.getsockname(), timeout=5)
    yield listener.getsockname()[1]
    filler.close()
    listener.close()


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_a_coordinator_port_that_drops_packets_fails_the_cell_in_seconds(cell, sshd, ssh_key, dropping_port):
    run = cell(f"%tpu_connect {specs(sshd, sshd.addresses[:2])} --key {ssh_key} --python {sshd.python} "
               f"--coordinator-port {dropping_port} --env JAX_PLATFORMS=cpu")
    assert run.error is None, run.shown
    started = time.monotonic()
    failed = cell("%%on_tpu\nimport jax")
    assert time.monotonic() - started < 60  # JAX itself waits 120 s, then aborts the process
    assert failed.error is not None
    assert (f"host 1 cannot reach the JAX coordinator at {sshd.addresses[0]}:{dropping_port}"
            in failed.shown), failed.shown
    assert f"port {dropping_port} is blocked" in failed.shown
    # host 0 would bind that port itself: the listener standing in for the firewall is this process
    assert f"port {dropping_port}, JAX's coordinator port, is taken on host 0 by pid {os.getpid()}" in failed.shown
    assert "gcloud compute firewall-rules create tpunb-slice-tcp" in failed.shown and f"listens on {dropping_port}" \
        in failed.shown
    assert "--allow tcp --source-ranges" in failed.shown  # all TCP between the VMs: libtpu's 8471 too
    found = diagnose.problems(manager.current(), probe_seconds=1)
    assert found == [f"host {h} cannot reach the JAX coordinator at {sshd.addresses[0]}:{dropping_port} "
                     "(no answer in 1 s)" for h in (0, 1)]


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_a_fixed_coordinator_port_survives_a_restart(cell, sshd, ssh_key):
    with socket.socket() as s:
        s.bind((sshd.addresses[0], 0))
        port = s.getsockname()[1]
    assert cell(f"%tpu_connect {specs(sshd, sshd.addresses[:2])} --key {ssh_key} --python {sshd.python} "
                f"--coordinator-port {port} --env JAX_PLATFORMS=cpu").error is None
    pids = []
    for _ in range(2):  # exit() ends every host; the next cell restarts them, on the same port
        run = cell("%%on_tpu\nimport jax, os\n(jax.process_count(), os.getpid())")
        assert run.error is None, run.shown
        assert "Out[1]: (2, " in run.shown
        pids.append(manager.current().session.hosts[0].info["pid"])
        assert cell("%%on_tpu\nexit()").error is None
    assert pids[0] != pids[1]  # really restarted


def test_a_taken_coordinator_port_names_its_holder_and_is_free_once_it_ends():
    holder = subprocess.Popen([sys.executable, "-c", "import socket, sys; s = socket.socket(); s.bind(('', 0)); "
                               "s.listen(); print(s.getsockname()[1], flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    port = int(holder.stdout.readline())
    try:
        said = host_diagnose.port_taken(port, deadline_s=0.3)
        assert said.startswith(f"port {port}, JAX's coordinator port, is taken on host 0 by pid {holder.pid}"), said
        assert f"%tpu_run --hosts 0 kill {holder.pid}" in said
    finally:
        holder.kill()
        holder.wait()
    assert host_diagnose.port_taken(port, deadline_s=5) is None


def test_probe_counts_a_refusal_as_reachable_and_silence_as_blocked(dropping_port, sshd):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens: refused at once
    assert host_diagnose.probe(f"127.0.0.1:{closed}", deadline_s=2) is None
    started = time.monotonic()
    assert host_diagnose.probe(f"{sshd.addresses[0]}:{dropping_port}", deadline_s=1.5) == "no answer in 1.5 s"
    assert time.monotonic() - started < 5


@pytest.mark.jax
def test_cloud_slices_use_the_port_gcp_opens_and_the_emulator_a_random_one(monkeypatch):
    from tpunb.provision.gcp import tpu as gcp
    from tpunb.registry import SliceRecord

    record = SliceRecord(name="n", accelerator="v4-16", backend="gcp", state="running", spec={"network": "my-vpc"})
    monkeypatch.delenv("TPUNB_TPU_API_ENDPOINT", raising=False)
    # process ids and the coordinator from the VM's metadata, as jax.distributed.initialize() reads them there
    assert gcp.jax_coordinator(record) == {"coordinator_port": 8476, "network": "my-vpc", "metadata": True}
    assert "--network my-vpc --allow tcp --source-ranges" in diagnose.firewall_fix(8476, "my-vpc")  # all TCP: 8471 too
    monkeypatch.setenv("TPUNB_TPU_API_ENDPOINT", "http://127.0.0.1:1")
    assert gcp.jax_coordinator(record)["coordinator_port"] is None


@pytest.mark.fresh_slice
def test_bad_diagnosis_arguments_are_one_line(cell, sshd, ssh_key):
    wrong = cell("%tpu_status --bogus")
    assert "Usage: %tpu_status [--versions]" in wrong.shown and "Traceback" not in wrong.shown
    two_pythons = cell(f"%tpu_connect {specs(sshd, sshd.addresses[:3])} --key {ssh_key} "
                       f"--python {sshd.python},{sshd.python}")
    assert "2 interpreters for 3 hosts" in two_pythons.shown and "Traceback" not in two_pythons.shown
    no_port = cell(f"%tpu_connect {specs(sshd, sshd.addresses[:2])} --key {ssh_key} --coordinator-port 70000")
    assert "--coordinator-port 70000: give a TCP port" in no_port.shown and "Traceback" not in no_port.shown
