"""One file at an ``https://`` URL as a manifest: its size and ETag from a HEAD (redirects
followed), so a download checks both and a changed file is noticed."""
from __future__ import annotations

import posixpath
import urllib.error
import urllib.request
from urllib.parse import unquote, urlsplit

from tpunb.errors import UsageError
from tpunb.fetch.source import Manifest, Source, pick
from tpunb.host.fetch import Entry

TIMEOUT = 30.0


class _HeadAfterRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects followed as HEADs: urllib turns them into GETs, so the source would start
    sending the whole file once more for the listing alone."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and req.get_method() == "HEAD":
            new.method = "HEAD"
        return new


def list_files(source: Source) -> Manifest:
    """The manifest of one URL; one-line UsageError when it cannot be read or gives no size."""
    url = source.location
    shown = url.split("?", 1)[0]
    name = unquote(posixpath.basename(urlsplit(url).path))
    if not name:
        raise UsageError(f"{shown} names no file (it ends in '/'): give the URL of a file")
    request = urllib.request.Request(url, method="HEAD", headers={"Accept-Encoding": "identity"})
    try:
        with urllib.request.build_opener(_HeadAfterRedirects).open(request, timeout=TIMEOUT) as response:
            size, etag = response.headers.get("Content-Length"), response.headers.get("ETag") or ""
    except urllib.error.HTTPError as exc:
        raise UsageError(f"{shown} answered HTTP {exc.code} ({exc.reason}): check the URL") from None
    except (urllib.error.URLError, OSError) as exc:
        raise UsageError(f"cannot reach {shown} ({getattr(exc, 'reason', exc)}): check the URL and the network") from None
    if size is None or not size.isdigit():
        raise UsageError(f"{shown} gives no Content-Length: its size cannot be checked, so it cannot be fetched")
    return Manifest(source, None, pick(source, [Entry(name, int(size), url, "etag", etag)]))
