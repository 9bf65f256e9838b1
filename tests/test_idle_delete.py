"""Idle autodelete, on the slice: a watchdog on worker 0 deletes the node with the VM's own token.

End to end on the emulator, whose hosts are real sshd hosts with a metadata-server stand-in:
the kernel runs in a real subprocess (an IPython shell) that is SIGKILLed, and the node must
disappear on time; activity postpones it; a kernel killed mid-launch is covered by the node's
startup-script; ``off`` leaves the node alone; %tpu_status shows the timer.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tpunb import manager
from tpunb.errors import CellInterrupted, UsageError
from tpunb.host.standalone import idle
from tpunb.provision.gcp.tpu import api
from tpunb.provision.gcp.config import CloudOptions
from tpunb.units import format_duration, parse_duration
from tests.conftest import wait_for
from tests.emulator_fixture import FAST

ZONE = "us-central2-b"
REPO = Path(__file__).resolve().parent.parent
#: after the idle limit, how long the watchdog may take to delete (delete call, emulator timings)
BOUND = 10.0


@pytest.fixture
def tpu_emulator_options(sshd):
    return {**FAST, **sshd.emulator_options()}


@pytest.fixture
def cloud(tpu_emulator, monkeypatch):
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")
    monkeypatch.setenv("CLOUDSDK_COMPUTE_ZONE", ZONE)
    monkeypatch.setenv("TPUNB_WATCH_INTERVAL", "0.2")
    monkeypatch.delenv("TPUNB_IDLE_DELETE", raising=False)
    yield tpu_emulator
    manager.detach_all()


def node_names(emulator) -> list[str]:
    return [n["name"].rsplit("/", 1)[-1] for n in emulator.nodes()]


def host0_dir(emulator, sshd, name: str) -> Path:
    node = next(n for n in emulator.nodes() if n["name"].endswith(f"/nodes/{name}"))
    return Path(sshd.host_environment(node["hosts"][0])["TPUNB_HOST_DIR"])


def watchdogs(host_dir: Path) -> list[int]:
    """Pids of watchdog processes of this host (by the host dir in their environment)."""
    marker = f"TPUNB_HOST_DIR={host_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if idle.SCRIPT.encode() in cmdline and marker in environ:
            found.append(int(entry))
    return found


def kept(host_dir: Path) -> int:
    """How often the watchdog kept the node because a request ran past the idle limit (its log)."""
    try:
        return (host_dir / idle.LOG).read_text().count("kept: a request has run")
    except FileNotFoundError:
        return 0


#: host code: wait until the watchdog's log says it kept the node for a running request ``times`` times
UNTIL_KEPT = ("import os, threading\n"
              "while not os.path.exists({log!r}) or open({log!r}).read().count('kept: a request has run') < {times}:\n"
              "    threading.Event().wait(0.01)\n")


def kernel_process(sshd, lines: list[str]) -> subprocess.Popen:
    """A kernel in its own process: an IPython shell with tpunb loaded running these cells, then
    waiting for ever; it prints 'cell done' after each cell."""
    code = textwrap.dedent("""
        import sys
        from IPython.testing.globalipapp import get_ipython
        ip = get_ipython()
        ip.run_cell("%load_ext tpunb")
        for line in sys.argv[1:]:
            result = ip.run_cell(line)
            print("cell done", result.error_in_exec, flush=True)
        sys.stdin.read()
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", code, *lines], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    proc.output = []  # type: ignore[attr-defined]
    threading.Thread(target=lambda: proc.output.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    return proc


def cell_done(proc: subprocess.Popen, timeout: float = 60.0) -> str:
    """Wait until the kernel process finished its cell; its output."""
    wait_for(lambda: any(line.startswith("cell done") for line in proc.output) or proc.poll() is not None,
             timeout, "the kernel process to run its cell")
    text = "".join(proc.output)
    assert "cell done None" in text, text
    return text


def kill(proc: subprocess.Popen) -> float:
    proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    proc.wait()
    return killed


def launch_line(sshd, extra: str, accel: str = "v4-16") -> str:
    """These hosts' disks are wiped with each node (a fresh VM each time) and no cell here needs
    JAX: the agent runs on the image's own Python (--no-setup), as it can on any host."""
    return f"%tpu_launch {accel} --no-setup {extra}"


# -- settings -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [("30m", 1800), ("2h", 7200), ("90s", 90), ("1h30m", 5400), ("3s", 3),
                                           ("0", 0), ("off", 0), (None, 0), (45, 45)])
def test_durations(text, seconds):
    assert parse_duration(text, off=True) == seconds


@pytest.mark.parametrize("bad", ["30", "abc", "-3m", "5x", float("nan"), -1])
def test_bad_durations_are_one_line(bad):
    with pytest.raises(UsageError) as info:
        parse_duration(bad, "--idle-delete", off=True)
    message = str(info.value)
    assert message.startswith("--idle-delete takes a duration with a unit") and "\n" not in message
    assert "use 90s, 30m, 2h or 1d" in message


@pytest.mark.parametrize("seconds, text", [(1800, "30m"), (5400, "1h30m"), (3, "3s"), (90, "1m30s"), (0, "0s")])
def test_durations_are_said_as_they_are_written(seconds, text):
    assert format_duration(seconds) == text and parse_duration(text) == seconds


def test_default_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("TPUNB_IDLE_DELETE", "2h")
    assert CloudOptions().idle_delete == 7200 and CloudOptions(idle_delete="off").idle_delete == 0
    monkeypatch.setenv("TPUNB_IDLE_DELETE", "soon")
    with pytest.raises(UsageError, match=r"\$TPUNB_IDLE_DELETE takes a duration"):
        CloudOptions()


@pytest.mark.fresh_slice
def test_magic_flag_and_local_slices(cell, tpu_emulator, monkeypatch):
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")
    bad = cell(f"%tpu_launch v4-8 --zone {ZONE} --idle-delete soon")
    assert isinstance(bad.error, UsageError) and "--idle-delete takes a duration" in str(bad.error)
    assert tpu_emulator.nodes() == []
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT")
    local = cell("%tpu_launch v4-8 --idle-delete 30m")  # a local slice costs nothing: accepted, ignored
    assert local.error is None and "--idle-delete applies to Cloud TPU slices" in local.stdout
    cell("%tpu_down")


def test_the_metadata_attribute_is_the_one_the_watchdog_reads():
    assert api.IDLE_ATTRIBUTE == idle.METADATA_ATTRIBUTE


def test_the_grace_after_boot_ends_when_a_kernel_attaches(tmp_path, monkeypatch):
    monkeypatch.setenv("TPUNB_HOST_DIR", str(tmp_path))
    (tmp_path / idle.STATE).write_text("{}")
    idle.touch()
    armed = idle.last_activity()[0]
    state = {"seconds": 10, "grace": 100, "armed_at": armed}
    assert idle.seconds_left(state, armed + 50, 0) == pytest.approx(50)  # no kernel yet: the grace holds
    os.utime(tmp_path / idle.ACTIVITY, (armed + 1, armed + 1))  # a kernel attached a second later
    assert idle.seconds_left(state, armed + 50, 0) == pytest.approx(-39)
    assert idle.seconds_left(state, armed + 50, busy_seen=armed + 45) == pytest.approx(5)  # a request ran



def _end_watchdogs(host_dir) -> None:
    """Kill the watchdogs running from ``host_dir`` (their script's path is in their command line)."""
    script = os.fsencode(host_dir / idle.SCRIPT)
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and script in (entry / "cmdline").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            pass


def test_the_boot_arming_just_after_a_kernel_armed_gives_no_grace(tmp_path, monkeypatch):
    """A VM's sshd answers before its startup scripts have run: an agent arms (a kernel is here,
    no grace), then the boot's script arms with its grace for a kernel still to come. The watchdog
    holds its lock once the agent's arm returns, so the boot's only touches; else its state would
    hold the node idle for the grace (a CI run saw a service never said to keep the node)."""
    monkeypatch.setenv("TPUNB_HOST_DIR", str(tmp_path))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # the permission check fails at once
    config = {"seconds": 600, "node": "projects/p/locations/z/nodes/n", "api": "http://127.0.0.1:9/v2"}
    source = Path(idle.__file__).read_text()
    try:
        assert idle.arm(config, source)
        assert idle.watchdog_running()
        assert not idle.arm({**config, "grace": 3600}, source)
        state = idle.read_state()
        assert "grace" not in state
        assert idle.seconds_left(state, time.time(), 0) <= 600
    finally:
        _end_watchdogs(tmp_path)


@pytest.mark.fresh_slice
def test_an_attaching_kernel_is_busy_until_it_says_its_launch_is_done(tmp_path, monkeypatch):
    """Host 0's agent arms as its kernel attaches: busy (its pid, as a running request), so the
    launch's steps after the hosts are up (its checks wait up to 5 s) cannot outlast a short idle
    limit. A boot arming after it leaves it busy; the kernel's ``idle`` message ends it."""
    monkeypatch.setenv("TPUNB_HOST_DIR", str(tmp_path))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    config = {"seconds": 600, "node": "projects/p/locations/z/nodes/n", "api": "http://127.0.0.1:9/v2"}
    source = Path(idle.__file__).read_text()
    try:
        assert idle.arm(config, source, attaching=True)
        assert idle.last_activity()[1] == os.getpid()
        assert not idle.arm({**config, "grace": 3600}, source)  # the boot's late arm
        assert idle.last_activity()[1] == os.getpid()
        assert idle.touch(False)  # mark_used: the launch is done
        assert idle.last_activity()[1] is None
        assert not idle.arm(config, source, attaching=True)  # a %tpu_use later: busy again until it is done
        assert idle.last_activity()[1] == os.getpid()
    finally:
        _end_watchdogs(tmp_path)


@pytest.mark.fresh_slice
def test_a_launch_holds_its_node_past_the_idle_limit_until_its_checks_end(cloud, sshd, cell, monkeypatch):
    """A launch waits for the watchdog's permission answer once its hosts are up: that wait (or a
    loaded machine) may pass the idle limit, and the node must still be there when the launch
    returns (CI lost a 3 s idle node there). The idle time starts once the launch is done."""
    from tpunb.provision.gcp import tpu

    seen, said = [], tpu._say_idle_problem

    def say_idle_problem(project, zone, name, *args):  # held until the watchdog has looked past the limit
        log = host0_dir(cloud, sshd, name) / idle.LOG
        try:
            wait_for(lambda: log.exists() and "kept: a request has run" in log.read_text(), 2 + BOUND,
                     "the watchdog to keep the node for its attaching kernel")
        except AssertionError as e:
            seen.append(f"{e}; idle.log: {log.read_text() if log.exists() else '(none)'}")
        said(project, zone, name, *args)

    monkeypatch.setattr(tpu, "_say_idle_problem", say_idle_problem)
    assert cell(launch_line(sshd, "--name held --idle-delete 2s")).error is None
    assert seen == [] and "held" in node_names(cloud)
    done = time.monotonic()
    wait_for(lambda: "held" not in node_names(cloud), 2 + BOUND, "the idle watchdog to delete the node")
    assert time.monotonic() - done > 1.5  # the idle time counted from the launch's end
    manager.down("held")


@pytest.mark.fresh_slice
def test_ctrl_c_in_the_launchs_last_wait_deletes_its_node(cloud, sshd, cell, monkeypatch):
    """The hosts are up and host 0 holds the node for its attaching kernel: Ctrl-C in the launch's
    wait for the watchdog's answer deletes the node, as it does while the hosts start, and the
    one line is true. (Before, the node stayed, unattached, held busy for as long as the kernel ran.)"""
    from tpunb.provision.gcp import tpu

    monkeypatch.setattr(tpu, "_say_idle_problem", lambda *args: signal.raise_signal(signal.SIGINT))
    run = cell(launch_line(sshd, "--name cut --idle-delete 1h"))
    assert isinstance(run.error, CellInterrupted), run.shown
    assert "launch of cut interrupted: nothing is left running" in str(run.error)
    assert "cut" not in node_names(cloud) and manager.registry().get_slice("cut") is None


FORKS_ON = """
import os, time
while True:  # always a new process: each one forks the next and ends, as a watchdog's spawn step does
    time.sleep(0.02)
    if os.fork():
        os._exit(0)
"""


def test_power_off_leaves_no_process_of_the_vm_even_one_forked_while_it_looked(tmp_path):
    """A node's deletion powers its VMs off: every process carrying the host's dir is killed, again
    until none is left. One pass missed a watchdog spawned meanwhile, which then held the next
    node's host dir on the same address (a CI run: a served node's watchdog was a Colab test's)."""
    from tpunb.sandbox.hosts.pool import HostPool, processes_of

    host_dir = tmp_path / "host"
    host_dir.mkdir()
    pool = HostPool(["10.9.0.1"], host_environment={"10.9.0.1": {"TPUNB_HOST_DIR": str(host_dir)}})
    try:
        for _ in range(10):
            subprocess.Popen([sys.executable, "-c", FORKS_ON], env={**os.environ, "TPUNB_HOST_DIR": str(host_dir)},
                             start_new_session=True).wait()  # its first fork carries on
            assert wait_for(lambda: processes_of(str(host_dir)) or None, 10, "the forking process")
            pool.power_off("10.9.0.1")
            assert processes_of(str(host_dir)) == []
    finally:  # the pool's own loop: a single pass can miss a fork made meanwhile, which then forks forever
        pool.power_off("10.9.0.1")


# -- the emulator's metadata server and tokens -----------------------------------------------

def test_metadata_server_and_vm_tokens(cloud, sshd):
    api.create(api.NodeSpec(name="meta", accelerator="v4-16", project="proj", zone=ZONE))
    hosts = cloud.nodes()[0]["hosts"]

    def get(address: str, path: str, flavor: bool = True) -> str:
        request = urllib.request.Request(f"http://{address}:{sshd.metadata_port}/computeMetadata/v1/{path}",
                                         headers={"Metadata-Flavor": "Google"} if flavor else {})
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.read().decode()

    with pytest.raises(urllib.error.HTTPError) as refused:
        get(hosts[0], "instance/attributes/agent-worker-number", flavor=False)
    assert refused.value.code == 403
    assert [get(h, "instance/attributes/agent-worker-number") for h in hosts] == ["0", "1"]
    assert get(hosts[0], "project/project-id") == "proj"
    put = urllib.request.Request(f"http://{hosts[1]}:{sshd.metadata_port}/computeMetadata/v1/instance/"
                                 f"guest-attributes/{idle.SERVING_ATTRIBUTE}", data=b"1", method="PUT",
                                 headers={"Metadata-Flavor": "Google"})
    with pytest.raises(urllib.error.HTTPError) as disabled:
        urllib.request.urlopen(put, timeout=5)
    assert disabled.value.code == 403  # a node made without enable-guest-attributes=TRUE, as on GCE
    token = json.loads(get(hosts[1], "instance/service-accounts/default/token"))["access_token"]

    def delete(bearer: str, project: str = "proj") -> int:
        request = urllib.request.Request(f"{cloud.url}/v2/projects/{project}/locations/{ZONE}/nodes/meta",
                                         method="DELETE", headers={"Authorization": f"Bearer {bearer}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as e:
            return e.code

    assert delete("ya29.made-up") == 401
    assert delete(token, project="other") == 403
    assert delete(token) == 200
    wait_for(lambda: cloud.nodes() == [], 10, "the node to be deleted with the VM's token")


# -- end to end ------------------------------------------------------------------------------

def test_killed_kernel_node_is_deleted_on_time(cloud, sshd):
    busy = "%%on_tpu\nimport time\nprint('busy', flush=True)\ntime.sleep(120)"
    kernel = kernel_process(sshd, [launch_line(sshd, "--name idle-kill --idle-delete 3s"), busy])
    try:
        assert "READY" in cell_done(kernel)
        wait_for(lambda: any("busy" in line for line in kernel.output), 30, "the long cell to start")
        host_dir = host0_dir(cloud, sshd, "idle-kill")
        wait_for(lambda: kept(host_dir) == 1, 10, "the watchdog to see the cell run past the idle limit")
        assert "idle-kill" in node_names(cloud)  # a running cell is activity, however long it runs
        node = next(n for n in cloud.nodes() if n["name"].endswith("/idle-kill"))
        assert json.loads(node["metadata"]["tpunb-idle"])["seconds"] == 3
        assert node["metadata"]["startup-script"].startswith("#!/usr/bin/env python3")
        wait_for(lambda: watchdogs(host_dir), 10, "the watchdog on host 0")
        assert not watchdogs(Path(sshd.host_environment(node["hosts"][1])["TPUNB_HOST_DIR"]))  # worker 0 only
        killed = kill(kernel)
    finally:
        if kernel.poll() is None:
            kill(kernel)
    status = manager.status()  # this kernel, and the sidebar's server, read the dead kernel's last mark
    timer = status[status["slice"] == "idle-kill"]["idle_delete_in"]
    from tpunb.server import model

    served = next(s for s in model.list_slices()["slices"] if s["name"] == "idle-kill")["idle_delete_in"]
    assert len(timer) == 2 and 0 <= timer.iloc[0] <= 3 and 0 <= served <= 3
    wait_for(lambda: "idle-kill" not in node_names(cloud), 3 + BOUND, "the idle watchdog to delete the node")
    elapsed = time.monotonic() - killed
    assert elapsed > 2.5  # the idle time counts from the kernel's death, not from the cell's start
    print(f"\nidle 3 s: node deleted {elapsed:.1f} s after the kernel was SIGKILLed mid-cell")


@pytest.mark.fresh_slice
def test_kernel_killed_mid_launch_still_gets_its_node_deleted(cloud, sshd):
    """The Python API this time; ``connect_wait`` (how long the launch may take to reach new VMs)
    is also how long a booted node waits for its first kernel before the idle clock may end it."""
    cloud.faults(slow_create=1.0)  # the node is CREATING when its kernel dies
    launch = (f"import tpunb; tpunb.launch('v4-16', name='halfway', idle_delete='2s', connect_wait=4, "
              "no_setup=True)")
    kernel = kernel_process(sshd, [launch])
    try:
        wait_for(lambda: "halfway" in node_names(cloud), 30, "the node to be created")
        assert cloud.nodes()[0]["state"] == "CREATING"
        killed = kill(kernel)
    finally:
        if kernel.poll() is None:
            kill(kernel)
    assert json.loads(cloud.nodes()[0]["metadata"]["tpunb-idle"])["grace"] == 4
    wait_for(lambda: any(n["state"] == "READY" for n in cloud.nodes()) or not cloud.nodes(), 10, "READY")
    ready = time.monotonic()
    wait_for(lambda: "halfway" not in node_names(cloud), 4 + BOUND, "the node's own watchdog to delete it")
    assert time.monotonic() - ready > 3.5  # its launching kernel had the connect time to attach
    print(f"\nidle 2 s (connect_wait 4 s), killed mid-launch: node deleted {time.monotonic() - killed:.1f} s "
          f"after the kill, {time.monotonic() - ready:.1f} s after READY")


@pytest.mark.fresh_slice
def test_activity_postpones_deletion_and_status_shows_the_timer(cloud, sshd, cell, ip):
    launched = cell(launch_line(sshd, "--name busy --idle-delete 4s"))
    assert launched.error is None and "or 4s without a cell (--idle-delete)" in launched.stdout
    cell("%tpu_status")
    timer = ip.user_ns["_"]["idle_delete_in"]
    assert len(timer) == 2 and 0 < timer.iloc[0] <= 4
    log = str(host0_dir(cloud, sshd, "busy") / idle.LOG)
    started = time.monotonic()
    # each cell runs until the watchdog has seen it run past the idle limit: busy, not idle
    run = cell(f"%%on_tpu\n{UNTIL_KEPT.format(log=log, times=1)}'slept'")
    assert run.error is None and "slept" in run.shown
    assert time.monotonic() - started > 4 and "busy" in node_names(cloud)
    run = cell(f"%%on_tpu --hosts 1\n{UNTIL_KEPT.format(log=log, times=2)}")  # a cell on another host counts too
    assert run.error is None and "busy" in node_names(cloud)
    ended = time.monotonic()
    cell("%tpu_status")
    left = ip.user_ns["_"]["idle_delete_in"].iloc[0]
    assert 4 - (time.monotonic() - ended) - 0.5 <= left <= 4, left  # counting down from the cell's end
    wait_for(lambda: "busy" not in node_names(cloud), 4 + BOUND, "the idle watchdog to delete the node")
    assert time.monotonic() - ended > 3.5  # not before its time
    after = cell("%%on_tpu\n1")
    gone = str(after.error)  # gone, or still being deleted when the cell came
    assert ("no longer exists" in gone or "is DELETING" in gone) and "idle autodelete" in gone, gone
    assert cell("%tpu_down busy").error is None  # the node is gone already: down forgets the slice


@pytest.mark.fresh_slice
def test_reattaching_arms_a_watchdog_that_was_lost(cloud, sshd, cell):
    assert cell(launch_line(sshd, "--name again --idle-delete 1h")).error is None
    host_dir = host0_dir(cloud, sshd, "again")
    first = wait_for(lambda: watchdogs(host_dir), 10, "the boot's watchdog")
    for pid in first:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not watchdogs(host_dir), 10, "the watchdog to die")
    manager.detach_all()
    assert cell("%tpu_use again").error is None  # host 0's agent starts: it arms a new watchdog
    assert wait_for(lambda: watchdogs(host_dir), 10, "a new watchdog") != first
    assert cell("%tpu_down again").error is None
    assert cloud.nodes() == [] and not watchdogs(host_dir)  # the VMs' processes ended with the node


@pytest.mark.fresh_slice
def test_off_leaves_the_node_alone(cloud, sshd, cell, ip, monkeypatch):
    monkeypatch.setenv("TPUNB_IDLE_DELETE", "2s")  # the user's default...
    assert cell(launch_line(sshd, "--name kept --idle-delete off")).error is None  # ...turned off for this one
    node = cloud.nodes()[0]
    assert "tpunb-idle" not in node["metadata"] and "startup-script" not in node["metadata"]
    assert not (host0_dir(cloud, sshd, "kept") / idle.STATE).exists() and not watchdogs(host0_dir(cloud, sshd, "kept"))
    cell("%tpu_status")
    assert "idle_delete_in" not in ip.user_ns["_"].columns
    assert cell(launch_line(sshd, "--name defaulted", accel="v4-8")).error is None
    defaulted = next(n for n in cloud.nodes() if n["name"].endswith("/defaulted"))
    assert json.loads(defaulted["metadata"]["tpunb-idle"])["seconds"] == 2
    cell("%tpu_down --all")


def test_a_queued_resource_is_deleted_with_its_node(cloud):
    api.create(api.NodeSpec(name="queued", accelerator="v4-8", project="proj", zone=ZONE, queued=True,
                            idle_delete=1, connect_wait=0))  # no kernel ever attaches: the boot arms it
    assert cloud.queued_resources() and cloud.nodes()
    wait_for(lambda: not cloud.queued_resources() and not cloud.nodes(), 1 + BOUND, "both to be deleted")


def test_metadata_port_alone_gives_each_host_its_own_metadata_server_and_disk(sshd, monkeypatch):
    """What ``python -m tpunb.sandbox --metadata-port P`` sets up without an sshd's per-host settings."""
    from tpunb.sandbox import start_emulator
    from tpunb.sandbox.hosts.sshd import _free_port

    url, emulator = start_emulator(**FAST, ssh_hosts=sshd.addresses, ssh_port=sshd.port,
                                   metadata_port=_free_port(sshd.addresses))
    monkeypatch.setenv("TPUNB_TPU_API_ENDPOINT", url)
    try:
        disks = {env["TPUNB_HOST_DIR"] for env in emulator.emulator.hosts.host_environment.values()}
        assert len(disks) == len(sshd.addresses)
        api.create(api.NodeSpec(name="cli", accelerator="v4-8", project="proj", zone=ZONE, idle_delete=1,
                                connect_wait=0))
        wait_for(lambda: not emulator.nodes(), 1 + BOUND, "the node's watchdog to delete it")
    finally:
        emulator.stop()


def test_a_failed_delete_is_logged_without_the_token_and_retried(cloud, sshd):
    api.create(api.NodeSpec(name="refused", accelerator="v4-8", project="proj", zone=ZONE, idle_delete=1,
                            connect_wait=0))
    host_dir = host0_dir(cloud, sshd, "refused")
    cloud.faults(api_disabled=True)  # every API call answers 403 now, the watchdog's DELETE too
    log = host_dir / idle.LOG
    wait_for(lambda: log.exists() and "delete failed" in log.read_text(), 1 + BOUND, "a failed attempt")
    assert "HTTP 403" in log.read_text() and "retrying in 15 s" in log.read_text()
    assert cloud.emulator.tokens  # the watchdog did get a token, and wrote it nowhere
    for path in (p for p in host_dir.iterdir() if p.is_file()):  # the watchdog's files (the disk also has a home)
        assert not any(token in path.read_text() for token in cloud.emulator.tokens), path
    assert watchdogs(host_dir) and cloud.nodes()
    cloud.clear_faults()


SERVICE_ACCOUNT = "proj-compute@developer.gserviceaccount.com"  # the emulator's default VM account in proj


@pytest.mark.fresh_slice
def test_a_watchdog_that_may_not_delete_says_so_at_launch_and_in_status(cloud, sshd, cell, ip):
    """The VMs' service account may only read TPUs: the watchdog learns it at arming (Cloud Resource
    Manager's testIamPermissions, with the VM's own token) and writes it as a guest attribute; the
    launch warns once with the command that grants the role, and %tpu_status shows that, not a countdown."""
    cloud.accounts(permissions={SERVICE_ACCOUNT: ["roles/tpu.viewer"]})
    launched = cell(launch_line(sshd, "--name nodel --idle-delete 1h"))
    assert launched.error is None, launched.shown
    warning = [line for line in launched.shown.splitlines() if "--idle-delete cannot delete nodel" in line]
    assert len(warning) == 1, launched.shown
    assert f"403 {SERVICE_ACCOUNT} lacks tpu.nodes.delete in project proj" in warning[0]
    assert (f"gcloud projects add-iam-policy-binding proj --member=serviceAccount:{SERVICE_ACCOUNT} "
            "--role=roles/tpu.admin") in warning[0]
    shown = cell("%tpu_status")
    frame = ip.user_ns["_"]
    assert set(frame["idle_delete_failing"]) == {f"idle delete failing: 403 {SERVICE_ACCOUNT} lacks tpu.nodes.delete "
                                                  "in project proj"}
    assert frame["idle_delete_in"].isna().all()  # no countdown to a delete that cannot happen
    from tpunb.status import readable

    assert set(readable(frame)["idle_delete_in"]) == set(frame["idle_delete_failing"])  # shown in its place
    assert cell("%tpu_down nodel").error is None


def test_a_refused_delete_is_written_where_a_kernel_reads_it(cloud, sshd):
    """The check passed at arming; the role is taken away before the limit: the watchdog's refused
    delete becomes its last error, on worker 0's guest attribute."""
    from tpunb.provision.gcp.tpu import lookups

    api.create(api.NodeSpec(name="revoked", accelerator="v4-8", project="proj", zone=ZONE, idle_delete=2,
                            connect_wait=0))
    wait_for(lambda: lookups.idle_problem("proj", ZONE, "revoked") == "", 10, "the check at arming")
    cloud.accounts(permissions={SERVICE_ACCOUNT: ["roles/tpu.viewer"]})
    problem = wait_for(lambda: lookups.idle_problem("proj", ZONE, "revoked"), 2 + BOUND, "the refused delete")
    assert problem.startswith("403 Permission 'tpu.nodes.delete' denied") and "(its delete failed)" in problem
    assert "revoked" in node_names(cloud)
    cloud.accounts(permissions={SERVICE_ACCOUNT: None})
    api.delete("proj", ZONE, "revoked")


class _SlowWallClock:
    """``time`` for the watchdog: its wall clock runs a hair slower than its sleeps (as under an
    NTP slew), and the tenth sleep ends the loop."""

    def __init__(self, start: float) -> None:
        self.now, self.sleeps = start, 0

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        if self.sleeps > 10:
            raise InterruptedError("enough looks")
        self.now += seconds * (1 - 1e-6)


_SlowWallClock.strftime, _SlowWallClock.gmtime = staticmethod(time.strftime), staticmethod(time.gmtime)


@pytest.mark.parametrize("use", ["service", "request"])
def test_use_past_the_idle_limit_is_said_even_when_each_look_lands_just_short_of_it(tmp_path, monkeypatch, use):
    """Every look refreshes the time of the last use and sleeps until the idle limit would come:
    "kept" must be measured from when the use began, or a clock a hair slow never says it."""
    monkeypatch.setenv("TPUNB_HOST_DIR", str(tmp_path))
    clock = _SlowWallClock(1000.0)
    monkeypatch.setattr(idle, "time", clock)
    (tmp_path / idle.STATE).write_text(json.dumps({"seconds": 3, "armed_at": 999.0, "node": "n"}))
    if use == "service":
        monkeypatch.setattr(idle, "supervisors", lambda: [os.getpid()])
    else:
        monkeypatch.setattr(idle, "last_activity", lambda: (999.0, os.getpid()))  # this process runs a request
    with pytest.raises(InterruptedError):
        idle.watch()
    said = (tmp_path / idle.LOG).read_text()
    expected = "kept: a service runs" if use == "service" else "kept: a request has run 3 s or more"
    assert said.count(expected) == 1, said  # said once, and the node was never deleted
    assert "deleted" not in said
