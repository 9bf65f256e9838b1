"""Services and forwards in %tpu_status: each service's state per host in one wording, each forward's
URL, seen also after the kernel let go of the slice. Real services on local and real sshd hosts."""
from __future__ import annotations

import pytest

from tests.conftest import wait_for
from tests.test_serve import free_port, get, http_server, unique
from tpunb import manager
from tpunb.host.standalone.service import alive

pytestmark = pytest.mark.ends_services


@pytest.fixture(autouse=True)
def no_service_left(isolated_home):
    yield
    manager.down(all=True)


def _services(name: str) -> dict:
    table = manager.status().attrs.get("services")
    if table is None:
        return {}
    mine = table[table["slice"] == name]
    return {(r.service, r.host): r.state for r in mine.itertuples()}


def test_status_lists_each_service_per_host_and_each_forward(make_slice):
    sl = make_slice(2)
    port = free_port()
    sl.serve("web", http_server(port), hosts=[0], wait_port=port)
    sl.serve("plain", "exec sleep 300", hosts=[1])
    sl.serve("once", "exit 3", hosts=[1])
    sl.serve("crashy", "exit 5", hosts=[0], restart="on-failure", max_restarts=1)
    wait_for(lambda: {s.name: s.state for s in sl.services() if s.name in ("once", "crashy")}
             == {"once": "exited", "crashy": "failed"}, timeout=30, what="once to exit and crashy to give up")
    sl.serving.serve("slow", "exit 6", hosts=[1], restart="on-failure", max_restarts=3, backoff=300)  # waits 30 s
    wait_for(lambda: [s.state for s in sl.services() if s.name == "slow"] == ["restarting"], what="slow to restart")
    assert _services(sl.name) == {
        ("web", 0): "ready", ("plain", 1): "running", ("once", 1): "exited with code 3",
        ("crashy", 0): "gave up after 1 restarts (last exit code 5)", ("slow", 1): "restarting (restart 1)"}
    url = sl.forward(port, host=0, local_port=free_port())
    assert get(int(url.rstrip("/").rsplit(":", 1)[1])) == 200
    shown = manager.status()
    forwards = shown.attrs["forwards"]
    assert [(r.slice, r.host, r.port, r.url) for r in forwards.itertuples()] == [(sl.name, 0, port, url)]
    services = shown.attrs["services"]
    busy = dict(zip(services["service"], services["busy"]))
    assert busy == {"web": True, "plain": True, "once": False, "crashy": False, "slow": True}
    text = repr(shown)
    assert "services" in text and "restarting (restart 1)" in text and url in text
    assert "<h4>forwards</h4>" in shown._repr_html_()


@pytest.mark.fresh_slice
def test_a_slice_no_kernel_holds_still_shows_its_services_and_no_stale_forward(make_slice):
    sl = make_slice(1)
    port = free_port()
    sl.serve("web", http_server(port), wait_port=port)
    sl.forward(port, local_port=free_port())
    (pid,) = [s.pid for s in sl.services()]
    manager.detach_all()  # as after the kernel ended: its forwards went with it, the service did not
    assert alive(pid)
    assert _services(sl.name) == {("web", 0): "ready"}
    assert "forwards" not in manager.status().attrs


def test_status_asks_hosts_for_services_only_once_the_slice_has_some(make_slice, monkeypatch):
    """Listing services starts a process on every host: a slice without any does not pay that on
    every %tpu_status (4 SSH hosts: 100 ms a call); once one is started, %tpu_status asks them all."""
    from tpunb.services import control

    asked = []
    real_program = control.program
    monkeypatch.setattr(control, "program", lambda transport, request, *more: asked.append(request["host"]) or
                        real_program(transport, request, *more))
    sl = make_slice(2)
    manager.status()
    manager.status()
    assert asked == []
    sl.serve("plain", "exec sleep 300", hosts=[1])
    asked.clear()
    assert _services(sl.name) == {("plain", 1): "running"}
    assert sorted(asked) == [0, 1]  # live: every host of the slice was asked
