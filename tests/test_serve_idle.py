"""A running service is use: the idle watchdog on the slice (--idle-delete) keeps the node while a
service's supervisor lives on host 0, and %tpu_status says the service keeps it busy, with its $/h.
End to end on the Cloud TPU API emulator, whose hosts are real sshd hosts (as test_idle_delete.py)."""
from __future__ import annotations

import time

from tests.conftest import wait_for
from tests.test_idle_delete import (BOUND, cloud, host0_dir, launch_line, node_names,  # noqa: F401 - fixtures
                                    tpu_emulator_options)
from tpunb import slices
from tpunb.host import idle


def test_a_running_service_keeps_an_idle_node_and_its_end_lets_the_watchdog_delete_it(cloud, sshd, cell, ip):
    assert cell(launch_line(sshd, "--name served --idle-delete 3s")).error is None
    assert cell("%tpu_serve web --hosts 0 -- exec sleep 300").error is None
    log = host0_dir(cloud, sshd, "served") / idle.LOG
    wait_for(lambda: log.exists() and "kept: a service runs" in log.read_text(), 3 + BOUND,
             "the watchdog to keep the node for the service past the idle limit")
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
    slices.down("served")
