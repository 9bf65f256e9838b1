"""Links to forwarded ports for a browser that is not on the kernel's machine: the path under the
Jupyter server's base URL through jupyter-server-proxy (a real jupyter server with a base URL, the
link fetched through it), and Colab's port proxy (tests/colab_stand_in.py stands in for Colab, whose
proxy is Google's: it records the call and answers with a URL of Colab's shape)."""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import urllib.request

import pytest

from tests.conftest import wait_for
from tests.test_colab import colab  # noqa: F401 - the stand-in google.colab
from tests.test_serve import free_port, get, http_server, no_service_left  # noqa: F401
from tests.test_sidebar_browser import _answers
from tpunb import manager
from tpunb.forwards.links import browser_link


@pytest.fixture
def jupyter_server(tmp_path, monkeypatch):
    """A real jupyter server under base URL /u/me/, made this kernel's parent as when it starts kernels."""
    port, token = free_port(), secrets.token_hex(8)
    runtime = tmp_path / "runtime"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime)}
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_server", "--no-browser", f"--port={port}",
                             "--ip=127.0.0.1", "--ServerApp.base_url=/u/me/", f"--IdentityProvider.token={token}",
                             "--allow-root", f"--ServerApp.root_dir={tmp_path}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: proc.poll() is not None or _answers(f"http://127.0.0.1:{port}/u/me/api/status?token={token}"),
                 120, "jupyter server to answer")
        wait_for(lambda: list(runtime.glob("jpserver-*.json")), 30, "the server's runtime file")
        monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
        monkeypatch.setenv("JPY_PARENT_PID", str(proc.pid))  # what jupyter_client gives the kernels it starts
        monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX", raising=False)
        yield f"http://127.0.0.1:{port}", token
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.fresh_slice
def test_the_link_under_the_jupyter_servers_base_url_reaches_the_service(jupyter_server, cell):
    server, token = jupyter_server
    port, local_port = free_port(), free_port()
    assert cell("%tpu_launch v4-8 --name linked").error is None
    assert cell(f"%tpu_serve web --wait-port {port} -- {http_server(port)}").error is None
    run = cell(f"%tpu_forward {port} --local-port {local_port}")
    assert run.error is None and run.result.result == f"http://127.0.0.1:{local_port}/"
    link = f"/u/me/proxy/{local_port}/"
    assert f"in your browser: {link}" in run.stdout
    with urllib.request.urlopen(f"{server}{link}?token={token}", timeout=30) as reply:
        assert reply.status == 200 and b"Directory listing" in reply.read()
    manager.down("linked")


@pytest.mark.fresh_slice
def test_in_colab_the_link_is_colabs_proxy_for_the_forwards_port(colab, cell):  # noqa: F811
    port, local_port = free_port(), free_port()
    assert cell("%tpu_launch v4-8 --name incolab").error is None
    assert cell(f"%tpu_serve web --wait-port {port} -- {http_server(port)}").error is None
    run = cell(f"%tpu_forward {port} --local-port {local_port}")
    assert run.error is None and get(local_port) == 200
    assert ("output.eval_js", f"google.colab.kernel.proxyPort({local_port})") in colab
    assert f"in your browser: https://{local_port}-stand-in-colab.googleusercontent.com/" in run.stdout


def test_no_link_without_colab_or_a_server_proxy_to_reach(monkeypatch):
    monkeypatch.delenv("JPY_PARENT_PID", raising=False)
    monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX", raising=False)
    assert browser_link("http://127.0.0.1:4321/") is None  # not started by a Jupyter server: localhost it is
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/ann")
    assert browser_link("http://127.0.0.1:4321/") == "/user/ann/proxy/4321/"
