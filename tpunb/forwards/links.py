"""A link to a forwarded port that works in the notebook's browser, which may not be on the kernel's
machine (then 127.0.0.1 is useless):

- Colab: Colab's own proxy for kernel ports (``google.colab.kernel.proxyPort`` through ``eval_js``);
- JupyterLab or Notebook with jupyter-server-proxy: ``<base URL>proxy/<port>/`` of the Jupyter server
  that started this kernel (found by its pid, ``JPY_PARENT_PID``, among the running servers; on
  JupyterHub its prefix, ``JUPYTERHUB_SERVICE_PREFIX``).
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from tpunb import colab


def local_port(url: str) -> int:
    """The port of a forward's URL (``http://127.0.0.1:L/``)."""
    return int(url.rstrip("/").rsplit(":", 1)[1])


def browser_link(url: str) -> str | None:
    """The link to the forward at ``url`` for the notebook's browser, or None when there is none
    better than ``url`` itself (no Colab, no jupyter-server-proxy)."""
    port = local_port(url)
    if colab.in_colab():
        from google.colab import output

        return str(output.eval_js(f"google.colab.kernel.proxyPort({port})"))
    if importlib.util.find_spec("jupyter_server_proxy") is None:
        return None
    base = _server_base_url()
    return f"{base}proxy/{port}/" if base is not None else None


def _server_base_url() -> str | None:
    """The base URL of the Jupyter server that runs this kernel ('/' or '/user/me/'), or None."""
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
    if prefix:
        return prefix if prefix.endswith("/") else prefix + "/"
    parent = os.environ.get("JPY_PARENT_PID")
    if not parent:
        return None
    from jupyter_core.paths import jupyter_runtime_dir

    # the files jupyter_server's list_running_servers reads, read without importing the server (seconds)
    for path in Path(jupyter_runtime_dir()).glob("jpserver-*.json"):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a server that is writing or removing its file
        if str(info.get("pid")) == parent:
            return info.get("base_url") or "/"
    return None
