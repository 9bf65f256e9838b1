"""tpunb's jupyter_server extension: the REST API behind the JupyterLab sidebar.

Enabled on install by ``jupyter-config/server-config/tpunb.json``; its handlers live under
``/tpunb/api/`` and read and end slices only through ``tpunb.server.model``.
"""
from __future__ import annotations

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    return [{"module": "tpunb.server"}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the built sidebar lives inside the package (for ``jupyter labextension develop``)."""
    return [{"src": "../labextension", "dest": "tpunb"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    from tpunb.server.handlers import setup_handlers

    setup_handlers(server_app.web_app)
    server_app.log.info("tpunb: sidebar API at /tpunb/api/")
