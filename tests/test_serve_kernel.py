"""A service outlives the notebook's kernel: killed kernel, new kernel, %tpu_use, still answering.
Through real Jupyter kernels (jupyter_client), over local hosts and real sshd hosts."""
from __future__ import annotations

import json
import signal
import urllib.request
import uuid

import pytest
from jupyter_client.manager import start_new_kernel

from tests.conftest import wait_for
from tests.test_kernel import execute
from tests.test_serve import free_port, http_server
from tpunb.host.standalone.service import alive


def run_ok(client, code: str) -> str:
    reply, outputs = execute(client, code)
    text = "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in outputs)
    assert reply["status"] == "ok", (code, reply.get("evalue"), text)
    return text


@pytest.mark.parametrize("backend", ["local", "ssh"])
@pytest.mark.fresh_slice
@pytest.mark.sandbox
def test_a_service_survives_a_killed_kernel_and_the_next_kernel_finds_it(isolated_home, backend, request):
    name = f"keep-{uuid.uuid4().hex[:6]}"
    if backend == "local":
        make = f"%tpu_launch v4-8 --name {name}"
    else:
        server, key = request.getfixturevalue("sshd"), request.getfixturevalue("ssh_key")
        make = (f"%tpu_connect {server.addresses[0]}:{server.port} --key {key} --python {server.python} "
                f"--name {name}")
    port = free_port()
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        run_ok(client, f"%load_ext tpunb\n{make}")
        run_ok(client, "import tpunb.manager as s\n"
                       f"s.current().serve('web', {http_server(port)!r}, wait_http='{port}/')")
        manager.signal_kernel(signal.SIGKILL)  # no clean-up of any kind
        wait_for(lambda: not manager.is_alive(), what="the kernel to die")
    finally:
        client.stop_channels()
        manager.cleanup_resources()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as reply:
        assert reply.status == 200
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        run_ok(client, f"%load_ext tpunb\n%tpu_use {name}")
        listed = run_ok(client, "import json, dataclasses, tpunb.manager as s\n"
                                "print(json.dumps([dataclasses.asdict(x) for x in s.current().services()]))")
        (web,) = json.loads(listed.strip().splitlines()[-1])
        assert (web["name"], web["state"], web["host"]) == ("web", "running", 0)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as reply:
            assert reply.status == 200
        run_ok(client, "%tpu_down")
        assert not alive(web["pid"])
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
