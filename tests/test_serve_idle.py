"""A running service is use: the idle watchdog on the slice (--idle-delete) keeps the node while a
service's supervisor lives on host 0 or says through its guest attribute that it runs on another host, and %tpu_status says the service keeps it busy, with its $/h.
End to end on the Cloud TPU API emulator, whose hosts are real sshd hosts (as test_idle_delete.py)."""
from __future__ import annotations

import pytest
import json
import os
import signal
import subprocess
import sys
import time

from tests.conftest import wait_for
from tests.test_idle_delete import (BOUND, cell_done, cloud, host0_dir, kernel_process, kill,  # noqa: F401
                                    launch_line, node_names, tpu_emulator_options)
from tpunb import manager
from tpunb.transport.bundle import SERVICE_CONTROL, service_parts, service_source
from tpunb.host.standalone import idle


@pytest.mark.fresh_slice
def test_a_running_service_keeps_an_idle_node_and_its_end_lets_the_watchdog_delete_it(cloud, sshd, cell, ip,
                                                                                     monkeypatch):
    from tpunb.provision.gcp import tpu

    asked, said = [], tpu._say_idle_problem

    def say_idle_problem(project, zone, name, *args):  # the launch's last wait (up to 5 s), after its hosts are up
        asked.append((host0_dir(cloud, sshd, name) / idle.ACTIVITY).stat().st_mtime)
        said(project, zone, name, *args)

    monkeypatch.setattr(tpu, "_say_idle_problem", say_idle_problem)
    assert cell(launch_line(sshd, "--name served --idle-delete 3s")).error is None
    activity = host0_dir(cloud, sshd, "served") / idle.ACTIVITY  # the idle time starts after the launch's wait
    wait_for(lambda: activity.stat().st_mtime > asked[0], 10, "the launch's end to be activity on host 0")
    assert cell("%tpu_serve web --hosts 0 -- exec sleep 300").error is None
    log = host0_dir(cloud, sshd, "served") / idle.LOG
    try:
        wait_for(lambda: log.exists() and "kept: a service runs" in log.read_text(), 3 + BOUND,
                 "the watchdog to keep the node for the service past the idle limit")
    except AssertionError as e:  # what the watchdog did instead
        raise AssertionError(f"{e}; idle.log: {log.read_text() if log.exists() else '(none)'}") from None
    assert "served" in node_names(cloud)  # idle for more than 3 s of cells, in use by its service
    cell("%tpu_status")
    services = ip.user_ns["_"].attrs["services"]
    [row] = services[services["slice"] == "served"].itertuples()
    assert (row.service, row.host, row.state, row.busy) == ("web", 0, "running", True)
    assert row.usd_per_hour > 0  # the node's price: the service keeps it billing
    assert "$" in repr(ip.user_ns["_"]).split("services", 1)[1]
    assert "idle_delete_in" not in ip.user_ns["_"].columns  # no countdown while the service holds the node
    from tpunb.server import model

    [card] = [s for s in model.list_slices()["slices"] if s["name"] == "served"]
    assert (card["busy_services"], card["idle_held"], card["idle_delete_in"]) == (["web"], True, None)
    assert cell("%tpu_serve --stop web").error is None
    stopped = time.monotonic()
    wait_for(lambda: "served" not in node_names(cloud), 3 + BOUND, "the idle watchdog to delete the node")
    assert time.monotonic() - stopped > 2.5  # the idle time counts from the service's end
    manager.down("served")


def _service_on_host_1_of_a_dead_kernel(cloud, sshd, name: str, flags) -> tuple[int, float]:
    """Launch a 2-host node with idle autodelete 3 s from a kernel process, start a service on
    host 1 only that runs until ``flags/stop`` exists, kill the kernel; wait until host 0's watchdog
    has kept the node for host 1's service. (the supervisor's pid, when the kernel was killed)"""
    stop, pid = flags / "stop", flags / "supervisor"
    command = f"echo $PPID > {pid}; while [ ! -e {stop} ]; do sleep 0.1; done"  # $PPID: the supervisor
    kernel = kernel_process(sshd, [launch_line(sshd, f"--name {name} --idle-delete 3s"),
                                   f"%tpu_serve web --hosts 1 -- {command}"])
    try:
        cell_done(kernel)
        wait_for(lambda: sum(line.startswith("cell done") for line in kernel.output) == 2 or kernel.poll() is not None,
                 60, "the service to start")
        assert "".join(kernel.output).count("cell done None") == 2, "".join(kernel.output)
        killed = kill(kernel)
    finally:
        if kernel.poll() is None:
            kill(kernel)
    log = host0_dir(cloud, sshd, name) / idle.LOG
    wait_for(lambda: log.exists() and "kept: a service runs on host 1" in log.read_text(), 3 + BOUND,
             "host 0's watchdog to keep the node for host 1's service")
    assert time.monotonic() - killed > 2.5 and name in node_names(cloud)  # past the idle limit, kernel dead
    return int(pid.read_text()), killed


def test_a_service_on_another_host_keeps_the_node_with_the_kernel_dead_and_its_end_lets_it_go(cloud, sshd, flags):
    _service_on_host_1_of_a_dead_kernel(cloud, sshd, "elsewhere", flags)
    from tpunb.server import model

    [card] = [s for s in model.list_slices()["slices"] if s["name"] == "elsewhere"]  # the dead kernel's slice
    assert (card["busy_services"], card["idle_held"], card["idle_delete_in"]) == (["web"], True, None)
    (flags / "stop").touch()
    stopped = time.monotonic()
    wait_for(lambda: "elsewhere" not in node_names(cloud), 3 + BOUND, "the idle watchdog to delete the node")
    assert time.monotonic() - stopped > 2.5  # the idle time counts from the service's end


def test_a_host_that_died_with_its_service_does_not_keep_the_node(cloud, sshd, flags):
    supervisor, _ = _service_on_host_1_of_a_dead_kernel(cloud, sshd, "lost", flags)
    os.kill(supervisor, signal.SIGKILL)  # as a preempted VM: no last word from its service
    gone = time.monotonic()
    wait_for(lambda: "lost" not in node_names(cloud), 3 + BOUND, "the idle watchdog to delete the node")
    assert time.monotonic() - gone > 1.5  # from the service's last sign of life (it beat every 0.75 s)
    (flags / "stop").touch()


def test_starting_a_service_is_use_for_the_idle_watchdog(tmp_path):
    """The idle clock starts again when a service starts (as when a request runs), not only while
    its supervisor lives: a launch's end and a slow service start must not add up to the limit.
    The host's control process runs as the kernel runs it: a Python of its own."""
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    (host_dir / idle.STATE).write_text("{}")
    activity = host_dir / idle.ACTIVITY
    activity.write_text("")
    os.utime(activity, (1000.0, 1000.0))  # the last use, long ago
    request = {"op": "start", "name": "web", "command": "exec sleep 60", "root": str(tmp_path / "services"),
               "slice": "s", "host": 0}
    message = json.dumps({"source": service_source(), "parts": list(service_parts()), "request": request}).encode()
    env = {**os.environ, "TPUNB_HOST_DIR": str(host_dir)}
    done = subprocess.run([sys.executable, "-c", SERVICE_CONTROL], input=b"%012d" % len(message) + message, env=env,
                          capture_output=True, timeout=60)
    state = json.loads(done.stdout[12:])["state"]
    try:
        assert state["state"] == "running"
        assert activity.stat().st_mtime > 1000.0  # touched by the start, while the service still runs
    finally:
        for pid in (state["pid"], state["supervisor"]):
            os.kill(pid, signal.SIGKILL)
