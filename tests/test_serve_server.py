"""Services and forwards in the sidebar's REST API (a real ServerApp through pytest-jupyter, with
tpunb.server and jupyter-server-proxy loaded): each service per host, each forward with its
/proxy/PORT/ path, which really serves the page, and which services keep the slice busy."""
from __future__ import annotations

import pytest

from tests.test_serve import free_port, http_server
from tests.test_server import call  # noqa: F401 - the same REST caller
from pytest_jupyter.jupyter_core import jp_asyncio_loop  # noqa: F401 - the real ones, here only (conftest.py)
from pytest_jupyter.jupyter_server import jp_server_cleanup  # noqa: F401
from tpunb import manager


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"tpunb.server": True, "jupyter_server_proxy": True}}}


@pytest.fixture(autouse=True)
def no_service_left(isolated_home):
    yield
    manager.down(all=True)


@pytest.mark.fresh_slice
async def test_a_slice_row_lists_its_services_and_forwards_with_their_proxy_path(call, jp_fetch):
    sl = manager.launch("v4-16", name="served")
    port = free_port()
    sl.serve("web", http_server(port), hosts=[1], wait_port=port)
    sl.serve("once", "exit 3", hosts=[0])
    url = sl.forward(port, host=1, local_port=free_port())
    local_port = int(url.rstrip("/").rsplit(":", 1)[1])
    [row] = (await call("GET", "slices"))[1]["slices"]
    services = {(s["service"], s["host"]): s for s in row["services"]}
    assert {k: (s["state"], s["busy"]) for k, s in services.items()} == {
        ("web", 1): ("ready", True), ("once", 0): ("exited with code 3", False)}
    assert services["web", 1]["usd_per_hour"] == 0.0 and row["busy_services"] == ["web"]
    assert [(f["host"], f["port"], f["url"], f["proxy"]) for f in row["forwards"]] == [
        (1, port, url, f"proxy/{local_port}/")]
    page = await jp_fetch("proxy", str(local_port), "")  # the link the sidebar gives, through the server
    assert page.code == 200 and b"Directory listing" in page.body
    sl.close()  # the kernel lets go: its forward ends, the service runs on
    [row] = (await call("GET", "slices"))[1]["slices"]
    assert row["forwards"] == [] and row["busy_services"] == ["web"]
