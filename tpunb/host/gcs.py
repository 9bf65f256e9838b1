"""A small Cloud Storage client over the JSON API: list with sizes, read, write, delete.

Shipped to hosts: standard library only (see the package docstring); the kernel uses it too, to
list snapshots. ``$STORAGE_EMULATOR_HOST`` points it at a local server speaking the same API (the
variable google-cloud-storage and gcsfs read); then no token is sent. Otherwise a host uses its
VM's token from the metadata server, and the kernel passes one from google-auth.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable

API = "https://storage.googleapis.com"


class GcsError(Exception):
    """A Cloud Storage call failed; the message names the object and the status."""


def endpoint() -> str:
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if not emulator:
        return API
    return emulator.rstrip("/") if "://" in emulator else f"http://{emulator.rstrip('/')}"


def split(uri: str) -> tuple[str, str]:
    """gs://BUCKET/PATH -> (BUCKET, PATH without slashes at either end)."""
    bucket, _, path = uri[len("gs://"):].partition("/")
    return bucket, path.strip("/")


def metadata_token() -> str:
    """This VM's access token, from its metadata server (as google-auth finds it)."""
    from .standalone.idle import metadata

    return json.loads(metadata("instance/service-accounts/default/token"))["access_token"]


class Bucket:
    """One bucket; ``token`` returns an access token (None: the VM's own, or none for an emulator)."""

    def __init__(self, name: str, token: Callable[[], str] | None = None, timeout: float = 60.0) -> None:
        self.name = name
        self.base = endpoint()
        self._token = token if token is not None else (None if self.base != API else metadata_token)
        self.timeout = timeout

    def _call(self, method: str, url: str, data: bytes | None = None, missing_ok: bool = False) -> bytes | None:
        request = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/octet-stream")
        if self._token is not None:
            request.add_header("Authorization", f"Bearer {self._token()}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and missing_ok:
                return None
            detail = exc.read()[:300].decode(errors="replace").strip()
            raise GcsError(f"gs://{self.name}: {method} answered {exc.code} {detail}") from None
        except urllib.error.URLError as exc:
            raise GcsError(f"gs://{self.name}: Cloud Storage at {self.base} cannot be reached ({exc.reason})") from None

    def _object_url(self, name: str) -> str:
        return f"{self.base}/storage/v1/b/{self.name}/o/{urllib.parse.quote(name, safe='')}"

    def list(self, prefix: str = "") -> list[tuple[str, int]]:
        """(name, size) of every object whose name starts with ``prefix``."""
        return [(item["name"], int(item.get("size", 0))) for item in self.items(prefix, "name,size")]

    def items(self, prefix: str = "", fields: str = "name,size,md5Hash,crc32c,generation") -> list[dict]:
        """The JSON API's record (these ``fields``) of every object whose name starts with ``prefix``."""
        found, page = [], None
        while True:
            query = {"prefix": prefix, "fields": f"items({fields}),nextPageToken"}
            if page:
                query["pageToken"] = page
            raw = self._call("GET", f"{self.base}/storage/v1/b/{self.name}/o?{urllib.parse.urlencode(query)}")
            answer = json.loads(raw or b"{}")
            found.extend(answer.get("items", []))
            page = answer.get("nextPageToken")
            if not page:
                return found

    def media_url(self, name: str, generation: str | None = None) -> str:
        """Where an object's bytes are read (one generation of it, when given)."""
        return self._object_url(name) + "?alt=media" + (f"&generation={generation}" if generation else "")

    def read(self, name: str) -> bytes | None:
        return self._call("GET", self.media_url(name), missing_ok=True)

    def write(self, name: str, data: bytes) -> None:
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        self._call("POST", f"{self.base}/upload/storage/v1/b/{self.name}/o?{query}", data=bytes(data))

    def delete(self, name: str) -> None:
        self._call("DELETE", self._object_url(name), missing_ok=True)
