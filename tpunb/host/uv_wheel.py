"""uv for an image whose ``python3`` has no pip, with the standard library alone.

Compute Engine's TPU images (``ubuntu-accel-*``) are Ubuntu cloud images, and nothing says they
ship ``python3-pip`` (Ubuntu's cloud images do not): ``python3 -m pip install uv`` then fails on
every host. So the host asks PyPI's JSON API (``/pypi/uv/VERSION/json``) for the files of the
pinned uv release, picks the wheel for its own platform tag, downloads it, checks it against the
sha256 the JSON API gives, and only then unpacks the ``uv`` binary the wheel carries
(``uv-VERSION.data/scripts/uv``) into the user's ``~/.local/bin``. A verified wheel is kept in
uv's cache folder, so a second VM on a shared cache (the sandbox's) or a kept disk skips the
download, never the check.

The index is PyPI, or the host's own ``UV_INDEX_URL`` / ``PIP_INDEX_URL`` when they name a
``.../simple`` index (its ``/pypi/`` JSON API beside it). urllib honours ``https_proxy`` and
``SSL_CERT_FILE``. A host with no route there fails with ``Unreachable``, whose text prepare.py
turns into its one "no route to the package index" line.

Shipped to hosts: standard library only, and it must run on the image's Python 3.10.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile

#: the uv release every host bootstraps (a pin: a new uv is a change of ours, tested, never a surprise)
UV_VERSION = "0.13.9"
PYPI = "https://pypi.org"
TIMEOUT = 60.0


class Unreachable(Exception):
    """The index did not answer: ``url`` and the reason, as one line."""


class BadWheel(Exception):
    """The index answered, but with no wheel for this host, or one that fails its sha256."""


def index_base(environ=os.environ) -> str:
    """Where the JSON API is: PyPI, or beside the host's own simple index (``X/simple`` -> ``X``)."""
    for key in ("UV_INDEX_URL", "PIP_INDEX_URL"):
        given = (environ.get(key) or "").strip().rstrip("/")
        if given.endswith("/simple"):
            return given[:-len("/simple")]
    return PYPI


def platform_tags(machine: str | None = None, libc: tuple[str, str] | None = None) -> list[str]:
    """The wheel platform tags this machine runs, best first: manylinux_2_X down to 2_17 (and its
    manylinux2014 alias) on glibc, musllinux_1_1 on musl."""
    machine = machine or platform.machine()
    name, version = libc or platform.libc_ver()
    if name != "glibc":
        return [f"musllinux_1_2_{machine}", f"musllinux_1_1_{machine}"]
    found = re.match(r"(\d+)\.(\d+)", version or "")
    major, minor = (int(found[1]), int(found[2])) if found else (2, 17)
    tags = [f"manylinux_{major}_{m}_{machine}" for m in range(minor, 16, -1)]
    return tags + [f"manylinux2014_{machine}"]


def choose(files: list[dict], tags: list[str]) -> dict:
    """The wheel among ``files`` (the JSON API's ``urls``) whose platform tags this host runs, the
    most specific first."""
    ranked = []
    for f in files:
        name = f.get("filename") or ""
        if f.get("packagetype") not in (None, "bdist_wheel") or not name.endswith(".whl"):
            continue
        wheel_tags = name[:-len(".whl")].split("-")[-1].split(".")
        best = min((tags.index(t) for t in wheel_tags if t in tags), default=None)
        if best is not None:
            ranked.append((best, name, f))
    if not ranked:
        raise BadWheel(f"uv {UV_VERSION} has no wheel for this host ({', '.join(tags[:2])}, ...)")
    return sorted(ranked, key=lambda r: r[:2])[0][2]


def _get(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "tpunb-host", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            return answer.read()
    except urllib.error.HTTPError as exc:
        raise (_Missing if exc.code == 404 else BadWheel)(f"{url} answered {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unreachable(f"{url}: {getattr(reason, 'strerror', None) or reason}") from None


class _Missing(BadWheel):
    """The index has no such page (404)."""


def _files(base: str, say) -> tuple[str, list[dict]]:
    """(the JSON API page read, the pinned release's files): the release's own page, else the
    project's page and its ``releases`` (a mirror may serve only the latter)."""
    pages = [(f"{base}/pypi/uv/{UV_VERSION}/json", lambda meta: meta.get("urls")),
             (f"{base}/pypi/uv/json", lambda meta: (meta.get("releases") or {}).get(UV_VERSION))]
    for url, files_of in pages:
        say(f"asking {url}")
        try:
            meta = json.loads(_get(url))
        except _Missing:
            continue
        except ValueError:
            raise BadWheel(f"{url} did not answer JSON") from None
        files = files_of(meta)
        if files:
            return url, files
    raise BadWheel(f"{base} has no uv {UV_VERSION}")


def _cache_dir(environ=os.environ) -> str:
    base = environ.get("UV_CACHE_DIR") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "uv")
    return os.path.join(base, "tpunb-uv-wheels")


def install(bin_dir: str, say=lambda text: None, environ=os.environ) -> str:
    """``uv`` unpacked into ``bin_dir`` from PyPI's verified wheel; its path. Unreachable when the
    index cannot be reached, BadWheel when what it gave cannot be trusted or used."""
    meta_url, files = _files(index_base(environ), say)
    wheel = choose(files, platform_tags())
    expected = ((wheel.get("digests") or {}).get("sha256") or "").lower()
    if not re.fullmatch(r"[0-9a-f]{64}", expected):
        raise BadWheel(f"{meta_url} gives no sha256 for {wheel['filename']}")
    cached = os.path.join(_cache_dir(environ), wheel["filename"])
    data = _read(cached)
    if data is None or hashlib.sha256(data).hexdigest() != expected:
        url = urllib.parse.urljoin(meta_url, wheel["url"])  # PyPI's are absolute; a mirror's may be relative
        say(f"downloading {wheel['filename']}")
        data = _get(url)
        got = hashlib.sha256(data).hexdigest()
        if got != expected:
            raise BadWheel(f"{wheel['filename']} from {urllib.parse.urlsplit(url).netloc} has sha256 {got[:16]}..., "
                           f"not the {expected[:16]}... PyPI's JSON API gives: not unpacked")
        _write(cached, data, 0o644)
    member = f"uv-{UV_VERSION}.data/scripts/uv"
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            binary = archive.read(member)
    except (KeyError, zipfile.BadZipFile):
        raise BadWheel(f"{wheel['filename']} holds no {member}") from None
    path = os.path.join(bin_dir, "uv")
    _write(path, binary, 0o755)
    return path


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _write(path: str, data: bytes, mode: int) -> None:
    """``data`` at ``path`` whole or not at all (hosts sharing a cache write the same file at once)."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=folder, prefix=".tpunb-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
