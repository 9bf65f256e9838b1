"""Thin REST handlers for the sidebar: parse the request, call ``model``, write JSON.

Every error becomes ``{"message": ...}`` in one place (``write_error``), with a status a client
can branch on: 404 for an unknown slice, 400 for a request tpunb refuses, 409 when another
kernel owns the slice, 500 (with a pointer to the server log) for anything unexpected.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from tpunb.errors import NoSliceError, TpunbError
from tpunb.server import model


class _Handler(APIHandler):
    """Turns tpunb's errors into JSON a person can act on."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, tornado.web.HTTPError):
            message = exc.log_message or exc.reason or f"HTTP {status_code}"
        elif isinstance(exc, TpunbError):
            message = str(exc)
        else:
            message = f"tpunb server error ({type(exc).__name__}: {exc}); see the Jupyter server log"
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message}))

    async def call(self, fn, *args: Any) -> Any:
        """Run a model function off the event loop (it may wait on sqlite, processes or the cloud API)."""
        try:
            return await asyncio.to_thread(fn, *args)
        except TpunbError as exc:
            raise tornado.web.HTTPError(_status_for(exc), str(exc)) from None


def _status_for(exc: TpunbError) -> int:
    if isinstance(exc, NoSliceError):
        return 404
    if isinstance(exc, model.OwnedElsewhere):
        return 409
    return 400


class SlicesHandler(_Handler):
    @tornado.web.authenticated
    async def get(self) -> None:
        self.finish(json.dumps(await self.call(model.list_slices)))


class SliceHandler(_Handler):
    @tornado.web.authenticated
    async def delete(self, name: str) -> None:
        self.finish(json.dumps(await self.call(model.delete_slice, name)))


class StacksHandler(_Handler):
    @tornado.web.authenticated
    async def get(self, name: str) -> None:
        hosts = self.get_argument("hosts", None)
        native = self.get_argument("native", "") in ("1", "true")
        self.finish(json.dumps(await self.call(model.stacks, name, hosts, native)))


class CatalogHandler(_Handler):
    @tornado.web.authenticated
    async def get(self) -> None:
        self.finish(json.dumps(await self.call(model.catalog)))


def setup_handlers(web_app: Any) -> None:
    base = url_path_join(web_app.settings["base_url"], "tpunb", "api")
    web_app.add_handlers(".*$", [
        (url_path_join(base, "slices"), SlicesHandler),
        (url_path_join(base, "slices", r"([a-z][-a-z0-9]*)"), SliceHandler),
        (url_path_join(base, "slices", r"([a-z][-a-z0-9]*)", "stacks"), StacksHandler),
        (url_path_join(base, "catalog"), CatalogHandler),
    ])
