"""Hosts you bring, over real OpenSSH: %tpu_connect, faults, %tpu_run, %tpu_sync, re-attach."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tpunb import manager
from tpunb.errors import AuthenticationError, CellInterrupted, HostDiedError, HostKeyError, RemoteError, TransportError
from tests.conftest import interrupt_kernel_when, wait_for_files
from tests.sshd import _write_ed25519


def specs(sshd, hosts):
    return ",".join(f"{a}:{sshd.port}" for a in hosts)


@pytest.fixture
def connect(cell, sshd, ssh_key):
    """%tpu_connect to these sshd addresses with the test key; returns the CellRun."""

    def run(addresses, extra=""):
        return cell(f"%tpu_connect {specs(sshd, addresses)} --key {ssh_key} --python {sshd.python} {extra}")

    return run


@pytest.mark.fresh_slice
def test_connect_orders_hosts_as_given_and_sets_env_secretly(connect, cell, sshd, isolated_home):
    reversed_hosts = sshd.addresses[:3][::-1]
    run = connect(reversed_hosts, "--name mine --env HF_TOKEN=hf_s3cret_token")
    assert run.error is None, run.shown
    where = cell("%%on_tpu\nimport os\n(os.environ['SSH_CONNECTION'].split()[2], os.environ['TPUNB_HOST_INDEX'], "
                 "os.environ['HF_TOKEN'] == 'hf_s3cret_token')")
    for index, address in enumerate(reversed_hosts):
        assert f"Out[{index}]: ('{address}', '{index}', True)" in where.shown
    pids = [h.info["pid"] for h in manager.current().session.hosts]
    for pid in pids:  # sent over the agent's stdin: not on any command line
        assert b"hf_s3cret_token" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    status = cell("%tpu_status")
    for path in isolated_home.rglob("*"):
        if path.is_file():
            assert b"hf_s3cret_token" not in path.read_bytes(), path
    assert "hf_s3cret_token" not in run.shown + where.shown + status.shown


@pytest.mark.fresh_slice
def test_killing_sshd_and_agents_fails_the_cell_fast_then_reconnects(connect, cell, sshd, flags):
    assert connect(sshd.addresses[:2]).error is None
    cell("%%on_tpu\nkept = 1")
    stopped = {}

    def kill_when_running():
        wait_for_files(flags, ["0", "1"])
        stopped["at"] = time.perf_counter()
        sshd.stop(sessions=True)  # sshd, every connection it accepted and the agents under them

    threading.Thread(target=kill_when_running, daemon=True).start()
    try:
        run = cell(f"%%on_tpu\nimport os, time\nopen('{flags}/' + os.environ['TPUNB_HOST_INDEX'], 'w').close()\n"
                   "time.sleep(60)")
        failed_after = time.perf_counter() - stopped["at"]
        assert isinstance(run.error, HostDiedError), run.shown
        assert "hosts 0-1 died during the cell" in str(run.error)
        assert failed_after < 5.0
        down = cell("%%on_tpu\n1")
        assert isinstance(down.error, TransportError) and "refused the connection" in str(down.error)
    finally:
        sshd.start()
    back = cell("%%on_tpu\n'kept' in globals()")
    assert back.error is None, back.shown
    assert "hosts 0-1 had died and were restarted: their state was lost" in back.stderr, back.stderr
    assert "Out[0-1]: False" in back.shown


@pytest.mark.fresh_slice
@pytest.mark.usefixtures("host_key_restored")
def test_changed_host_key_is_refused_until_accepted(connect, cell, sshd):
    assert connect(sshd.addresses[:1], "--name first").error is None
    cell("%tpu_down first")
    sshd.swap_host_key()
    refused = connect(sshd.addresses[:1], "--name second")
    assert isinstance(refused.error, HostKeyError)
    assert "host key of" in str(refused.error) and "--accept-new-host-key" in str(refused.error)
    assert refused.stdout.strip().splitlines()[-1] == f"HostKeyError: {refused.error}"  # the error: one line
    assert "\n" not in str(refused.error)
    accepted = connect(sshd.addresses[:1], "--name third --accept-new-host-key")
    assert accepted.error is None, accepted.shown
    assert cell("%%on_tpu\n1 + 1").shown.strip() == "2"  # a one-host slice: no labels


@pytest.mark.fresh_slice
def test_wrong_user_key_gives_a_clear_authentication_error(cell, sshd, tmp_path):
    stranger = tmp_path / "stranger"
    _write_ed25519(stranger)
    run = cell(f"%tpu_connect {specs(sshd, sshd.addresses[:1])} --key {stranger} --python {sshd.python}")
    assert isinstance(run.error, AuthenticationError)
    assert "rejected SSH key" in str(run.error) and "authorized_keys" in str(run.error)


@pytest.mark.fresh_slice
def test_unreachable_host_fails_within_the_connect_timeout(cell, sshd, ssh_key):
    started = time.perf_counter()
    run = cell(f"%tpu_connect 127.0.0.9:{sshd.port} --key {ssh_key}")
    assert isinstance(run.error, TransportError) and "127.0.0.9" in str(run.error)
    assert time.perf_counter() - started < 10.0
    assert "Traceback" not in run.shown


@pytest.mark.fresh_slice
def test_tpu_run_streams_labels_and_fails_if_any_host_fails(patient_grouping, connect, cell, sshd):
    connect(sshd.addresses[:2])
    ok = cell("%tpu_run echo hello from $TPUNB_HOST_INDEX")
    assert ok.error is None and "[0] hello from 0" in ok.stdout and "[1] hello from 1" in ok.stdout
    failed = cell("%%tpu_run\necho same\nexit $TPUNB_HOST_INDEX")
    assert isinstance(failed.error, RemoteError)
    assert "[0-1] same" in failed.stdout and "exit codes: [0] 0, [1] 1" in failed.stdout
    assert "failed on host 1 (host 1: exit 1)" in str(failed.error)
    assert manager.current().last_result[1].exit_code == 1


def test_tpu_run_is_interruptible_and_works_on_local_slices(make_slice, cell, flags):
    make_slice(2)
    interrupt_kernel_when(lambda: len(list(flags.iterdir())) == 2)
    run = cell(f"%%tpu_run\ntouch {flags}/$TPUNB_HOST_INDEX\nsleep 60")
    assert isinstance(run.error, CellInterrupted), run.shown
    assert "interrupted on hosts 0-1; their state is kept" in str(run.error)  # same message as cells
    assert run.seconds < 10


@pytest.mark.fresh_slice
def test_sync_copies_changes_only_and_honours_gitignore(connect, cell, sshd, tmp_path):
    connect(sshd.addresses[:2])
    project = tmp_path / "proj"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "model.py").write_text("SIZE = 1\n")
    (project / "train.py").write_text("print('train')\n")
    (project / ".gitignore").write_text("checkpoints/\n*.log\n")
    (project / "checkpoints").mkdir()
    (project / "checkpoints" / "big.bin").write_bytes(b"x" * 1000)
    (project / "run.log").write_text("noise")
    (project / "notes.tmp").write_text("skip me")
    remote = tmp_path / "remote"  # one shared directory: the test hosts are one machine
    first = cell(f"%tpu_sync {project} {remote} --exclude '*.tmp'")
    assert first.error is None, first.shown
    assert (remote / "pkg" / "model.py").read_text() == "SIZE = 1\n"
    assert not (remote / "checkpoints").exists() and not (remote / "run.log").exists()
    assert not (remote / "notes.tmp").exists()
    assert "sync" in first.stderr  # the text progress outside widget front ends
    (project / "pkg" / "model.py").write_text("SIZE = 2\n")
    cell(f"%tpu_sync {project} {remote} --exclude '*.tmp'")
    report = manager.current().sync(str(project), str(remote), ("*.tmp",))
    assert report.files_sent == 0  # nothing changed since the last sync
    assert (remote / "pkg" / "model.py").read_text() == "SIZE = 2\n"
    assert "Out[0-1]: 'SIZE = 2\\n'" in cell(f"%%on_tpu\nopen('{remote}/pkg/model.py').read()").shown


@pytest.mark.fresh_slice
def test_sync_on_a_local_slice_has_nothing_to_copy(cell):
    cell("%tpu_launch v4-8")
    run = cell("%tpu_sync")
    assert run.error is None and "share this machine's files" in run.stdout


@pytest.mark.fresh_slice
def test_use_reconnects_an_ssh_slice_after_a_kernel_restart(connect, cell, sshd):
    connect(sshd.addresses[:2], "--name remote --env SECRET=1")
    manager.detach_all()
    run = cell("%tpu_use remote")
    assert run.error is None, run.shown
    assert "state was lost" in run.stderr and "SECRET are not set" in run.stderr
    assert "Out[0-1]: 2" in cell("%%on_tpu\nimport os\nint(os.environ['TPUNB_NUM_HOSTS'])").shown
    assert "deleted remote" in cell("%tpu_down remote").stdout


@pytest.mark.fresh_slice
def test_hosts_you_bring_can_be_a_multislice(patient_grouping, connect, cell, sshd):
    run = connect(sshd.addresses[:4], "--name pair --slices 2")
    assert run.error is None, run.shown
    env = cell("%%on_tpu\nimport os\nprint(os.environ['MEGASCALE_SLICE_ID'], os.environ['MEGASCALE_NUM_SLICES'], "
               "os.environ['MEGASCALE_COORDINATOR_ADDRESS'])")
    assert env.stdout == f"[s0] 0 2 {sshd.addresses[0]}:8080\n[s1] 1 2 {sshd.addresses[0]}:8080\n", env.shown
    table = manager.status()
    assert set(table["accelerator"]) == {"4 hosts in 2 slices"} and list(table["slice_index"]) == [0, 0, 1, 1]
    assert "Out[s1/1]: 3" in cell("%%on_tpu --hosts s1/1\nint(os.environ['TPUNB_HOST_INDEX'])").shown
    assert "deleted pair" in cell("%tpu_down pair").stdout


@pytest.mark.fresh_slice
def test_bad_connect_arguments(cell, sshd):
    assert "Usage: %tpu_connect" in cell("%tpu_connect").shown
    mismatch = cell(f"%tpu_connect {specs(sshd, sshd.addresses[:3])} --accelerator v4-16")
    assert "v4-16 has 2 hosts, but 3 were given" in mismatch.shown
    uneven = cell(f"%tpu_connect {specs(sshd, sshd.addresses[:3])} --slices 2")
    assert "--slices 2: 3 hosts do not make 2 equal slices" in uneven.shown and "Traceback" not in uneven.shown
    pairs = cell(f"%tpu_connect {specs(sshd, sshd.addresses[:3])} --accelerator v4-16 --slices 2")
    assert "2 x v4-16 have 4 hosts, but 3 were given" in pairs.shown
