"""One file at an ``https://`` URL as a manifest: its size and ETag, so a download checks both and
a changed file is noticed. They come from a GET of its first byte (``Range: bytes=0-0``), never a
HEAD: a presigned URL (S3's, Cloud Storage's, the Hub's CDN's) is signed for GET, and a HEAD is
refused, as are HEADs on servers that do not answer them."""
from __future__ import annotations

import posixpath
import re
import urllib.error
import urllib.request
from urllib.parse import unquote, urlsplit

from tpunb.errors import UsageError
from tpunb.fetch.source import Manifest, Source, pick
from tpunb.host.fetch import Entry

TIMEOUT = 30.0


def list_files(source: Source) -> Manifest:
    """The manifest of one URL; one-line UsageError when it cannot be read or gives no size."""
    url, shown = source.location, source.shown
    name = unquote(posixpath.basename(urlsplit(url).path))
    if not name:
        raise UsageError(f"{shown} names no file (it ends in '/'): give the URL of a file")
    request = urllib.request.Request(url, headers={"Accept-Encoding": "identity", "Range": "bytes=0-0"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:  # its body is never read
            size, etag = _size(response), response.headers.get("ETag") or ""
    except urllib.error.HTTPError as exc:
        if exc.code == 416:  # an empty file: no first byte to give
            size, etag = 0, exc.headers.get("ETag") or ""
        else:
            raise UsageError(f"{shown} answered HTTP {exc.code} ({exc.reason}): check the URL") from None
    except (urllib.error.URLError, OSError) as exc:
        raise UsageError(f"cannot reach {shown} ({getattr(exc, 'reason', exc)}): check the URL and the network") from None
    if size is None:
        raise UsageError(f"{shown} gives no size (no Content-Range or Content-Length): it cannot be checked, so it "
                         "cannot be fetched")
    return Manifest(source, None, pick(source, [Entry(name, size, url, "etag", etag)]))


def _size(response) -> int | None:
    """The file's size: a 206's ``Content-Range: bytes 0-0/SIZE``, else a 200's Content-Length."""
    if response.status == 206:
        found = re.fullmatch(r"bytes\s+\d+-\d+/(\d+)", (response.headers.get("Content-Range") or "").strip())
        return int(found.group(1)) if found else None
    length = response.headers.get("Content-Length")
    return int(length) if length and length.isdigit() else None
