"""A local Hugging Face Hub: the few HTTP routes the real ``huggingface_hub`` client calls to list
and download a model or dataset repository, so ``%tpu_fetch hf://...`` and the client itself run here.

Routes (what huggingface_hub 2.x sends; point it here with ``HF_ENDPOINT``; ``{type}`` is
``models`` or ``datasets``, and a dataset's files are under ``/datasets/{repo}``):
  GET  /api/{type}/{repo}[/revision/{rev}]     repo_info (``sha`` is the commit, ``gated``, siblings)
  GET  /api/{type}/{repo}/tree/{rev}[/{dir}]   the tree (?recursive=), ``Link: <...>; rel="next"``
                                               past ``page_size`` entries, as the Hub pages it
  GET  /api/{type}/{repo}/auth-check           200, or 401/403 ``GatedRepo`` (HfApi.auth_check)
  HEAD|GET /[datasets/]{repo}/resolve/{rev}/{path}
                                               a small file: 200, ``ETag`` its git-blob SHA-1;
                                               an LFS file: 302 to the CDN's ``/_lfs/...``, with
                                               ``X-Linked-Etag`` (sha256) and ``X-Linked-Size``
  GET  /_lfs/{repo}/{sha256}?sig=              the LFS blob, as the Hub's CDN serves a presigned URL:
                                               a HEAD is refused (403), as S3 refuses one on a URL
                                               signed for GET (the method is part of the signature)
A renamed repository (``rename``) answers every route under its old name with a 307 to the same
route under its new one, a relative Location (the redirect huggingface_hub follows itself,
keeping its token: ``_httpx_follow_relative_redirects``; urllib's unredirected header drops it).
Every file answer carries ``X-Repo-Commit``, ``Content-Length`` and ``Accept-Ranges``; a
``Range: bytes=A-[B]`` is answered 206. Errors carry ``X-Error-Code`` as the Hub sends them:
``RepoNotFound`` (401: the Hub does not say whether a repository it hides exists),
``RevisionNotFound``, ``EntryNotFound`` (404) and ``GatedRepo`` (401 without a token, 403 with a
token that was not granted). A bearer token the Hub does not know is 401 "Invalid credentials".

Where it differs from the Hub: repositories live in memory (``add_repo``), a file is LFS when its
name matches ``LFS_SUFFIXES`` or it is ``LFS_MIN`` bytes or more, any known token opens every
gated or private repository unless ``granted`` names some, no Xet (the client falls back to plain HTTP, as with
``HF_HUB_DISABLE_XET``), and the CDN is a second port of this server (``cdn_routes`` maps the Host a
client reached the Hub at to another CDN address, as a proxy per link needs). Tests read ``gets``
(bytes-serving GETs per (repo, path); a dataset's repo as ``datasets/ORG/NAME``) and ``log``; ``rate``
limits bandwidth, ``cut(path, after)`` ends one transfer mid-file and ``busy(path, times)`` throttles
(429, with a Retry-After in seconds or as an HTTP date). Stdlib only.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from fnmatch import fnmatch
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

#: files stored in LFS by name, as a Hub repository's default .gitattributes says
LFS_SUFFIXES = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.gguf", "*.onnx",
                "*.npz", "*.tar.gz", "*.zip")
#: ... and any file this large (the Hub refuses larger plain git files)
LFS_MIN = 10 << 20
#: entries per page of a tree listing (the Hub's cap without expand)
PAGE_SIZE = 1000
#: bytes written at a time (the bandwidth limit sleeps between them)
CHUNK = 64 << 10


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a file: what the Hub's tree calls ``oid`` and a small file's ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    """The pointer git stores for an LFS file (its blob id is the tree's ``oid`` for the file)."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\n" \
           f"size {len(data)}\n".encode()


@dataclass
class HubFile:
    path: str
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def tree_entry(self) -> dict:
        if not self.lfs:
            return {"type": "file", "oid": git_blob_sha1(self.data), "size": len(self.data), "path": self.path}
        pointer = lfs_pointer(self.data)
        return {"type": "file", "oid": git_blob_sha1(pointer), "size": len(self.data), "path": self.path,
                "lfs": {"oid": self.sha256, "size": len(self.data), "pointerSize": len(pointer)}}


def repo_key(repo_id: str, repo_type: str = "model") -> str:
    """How the stand-in keys a repository: ORG/NAME for a model, ``datasets/ORG/NAME`` for a dataset."""
    return repo_id if repo_type == "model" else f"{repo_type}s/{repo_id}"


@dataclass
class HubRepo:
    repo_id: str
    gated: bool = False
    private: bool = False
    #: tokens granted access to a gated repository (None: every token the Hub knows)
    granted: frozenset[str] | None = None
    #: commit sha -> {path: file}
    commits: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    #: branch or tag -> commit sha
    refs: dict[str, str] = field(default_factory=dict)

    def commit_of(self, revision: str) -> str | None:
        if revision in self.refs:
            return self.refs[revision]
        return revision if revision in self.commits else None


class Hub:
    """The repositories, tokens, counters and faults one server answers from."""

    def __init__(self, tokens: tuple[str, ...] = (), page_size: int = PAGE_SIZE, rate: float | None = None) -> None:
        self.tokens = set(tokens)
        self.page_size = page_size
        #: bytes per second each transfer is held to (None: as fast as it goes)
        self.rate = rate
        self.repos: dict[str, HubRepo] = {}
        #: a renamed repository's old key -> its new key (``repo_key``)
        self.renamed: dict[str, str] = {}
        #: the Host a client reached the Hub at -> the CDN address its LFS redirects name
        self.cdn_routes: dict[str, str] = {}
        #: (repo, path) -> GETs that served the file's bytes (a redirect serves none)
        self.gets: Counter = Counter()
        #: (method, request path, Range header or None) of every request, in order
        self.log: list[tuple[str, str, str | None]] = []
        #: transfers of a file's bytes under way now, and the most there were at once
        self.in_flight = self.peak = 0
        #: where LFS answers redirect to: another origin, as the Hub's CDN is (so clients drop the token)
        self.cdn_url: str | None = None
        self._cuts: dict[str, tuple[int, int]] = {}
        self._busy: dict[str, tuple[int, int, bool]] = {}
        self._secret = secrets.token_bytes(16)
        self._lock = threading.Lock()

    def add_repo(self, repo_id: str, files: dict[str, bytes], revision: str = "main", gated: bool = False,
                 private: bool = False, granted: tuple[str, ...] | None = None, repo_type: str = "model") -> str:
        """Commit ``files`` as ``revision`` of ``repo_id`` (made if new; a dataset with
        ``repo_type="dataset"``); the commit's sha. A gated repository opens to the ``granted``
        tokens (None: to every token the Hub knows)."""
        repo = self.repos.setdefault(repo_key(repo_id, repo_type), HubRepo(repo_id))
        repo.gated, repo.private = gated, private
        repo.granted = None if granted is None else frozenset(granted)
        made = {path: HubFile(path, bytes(data), _is_lfs(path, data)) for path, data in files.items()}
        listing = json.dumps([repo_id, revision, sorted((p, f.sha256) for p, f in made.items())]).encode()
        sha = hashlib.sha1(listing).hexdigest()
        repo.commits[sha] = made
        repo.refs[revision] = sha
        return sha

    def rename(self, old: str, new: str, repo_type: str = "model") -> None:
        """The repository ``old`` is ``new`` from now on; requests naming ``old`` are redirected."""
        before, after = repo_key(old, repo_type), repo_key(new, repo_type)
        with self._lock:
            repo = self.repos.pop(before)
            repo.repo_id = new
            self.repos[after] = repo
            self.renamed[before] = after

    def busy(self, path: str, times: int, retry_after: int | str = 0, ranged: bool = False) -> None:
        """The next ``times`` GETs of ``path`` answer 429 with this Retry-After (seconds, or an HTTP
        date), as a throttling Hub does (``ranged``: only GETs that resume with a Range, so a first
        GET can be cut first)."""
        with self._lock:
            self._busy[path] = (times, retry_after, ranged)

    def take_busy(self, path: str, ranged: bool = False) -> int | str | None:
        """The Retry-After to answer this GET of ``path`` with, or None to serve it."""
        with self._lock:
            times, after, only_ranged = self._busy.get(path, (0, 0, False))
            if not times or (only_ranged and not ranged):
                return None
            self._busy[path] = (times - 1, after, only_ranged)
            return after

    def cut(self, path: str, after: int, times: int = 1) -> None:
        """The next ``times`` GETs of ``path`` (any repository) end their connection at byte
        ``after`` of the file (a GET that resumes there gets none), as a broken link does
        (``times=0``: no more cuts)."""
        with self._lock:
            if times > 0:
                self._cuts[path] = (after, times)
            else:
                self._cuts.pop(path, None)

    def take_cut(self, path: str) -> int | None:
        """Where this GET of ``path`` ends, as an offset in the file (None: it is served whole)."""
        with self._lock:
            after, times = self._cuts.pop(path, (None, 0))
            if times > 1:
                self._cuts[path] = (after, times - 1)
            return after

    def record(self, method: str, path: str, span: str | None) -> None:
        with self._lock:
            self.log.append((method, path, span))

    def count(self, repo: str, path: str) -> None:
        with self._lock:
            self.gets[(repo, path)] += 1

    def sign(self, blob: str) -> str:
        """The signature of a CDN URL (``REPO/SHA256``), as the Hub signs the URLs it redirects to."""
        return hmac.new(self._secret, blob.encode(), hashlib.sha256).hexdigest()[:32]

    def blob(self, key: str, sha256: str) -> HubFile | None:
        """The LFS file of the repository ``key`` (``repo_key``) whose content is ``sha256``."""
        repo = self.repos.get(key)
        for files in repo.commits.values() if repo else ():
            for found in files.values():
                if found.lfs and found.sha256 == sha256:
                    return found
        return None


def _is_lfs(path: str, data: bytes) -> bool:
    return len(data) >= LFS_MIN or any(fnmatch(path.rsplit("/", 1)[-1], p) for p in LFS_SUFFIXES)


class HubError(Exception):
    """An answer with the Hub's error headers."""

    def __init__(self, status: int, code: str | None, message: str, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.headers = status, code, headers or {}


#: the API's and the files' URL prefix of each repository type
API_TYPES = {"models": "model", "datasets": "dataset"}


class _Moved(Exception):
    """A request that named a renamed repository: redirect it to ``location``."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.location = location


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _answer(self, head: bool) -> None:
        hub = self.server.hub
        url = urlsplit(self.path)
        hub.record(self.command, url.path, self.headers.get("Range"))
        try:
            token = self._token()
            parts = unquote_parts(url.path)
            if parts[:1] == ["api"] and parts[1:2] and parts[1] in API_TYPES:
                self._json(self._api(API_TYPES[parts[1]], parts[2:], parse_qs(url.query), token))
            elif url.path.startswith("/_lfs/"):
                self._lfs(url.path[len("/_lfs/"):], parse_qs(url.query), head)
            elif parts[:1] == ["datasets"]:
                self._resolve("dataset", parts[1:], token, head)
            else:
                self._resolve("model", parts, token, head)
        except _Moved as moved:
            query = f"?{url.query}" if url.query else ""
            self._send(307, b"", {"Location": moved.location + query}, head=True)
        except HubError as exc:
            self._error(exc)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- authentication ----------------------------------------------------------------
    def _token(self) -> str | None:
        header = self.headers.get("Authorization") or ""
        if not header:
            return None
        token = header[len("Bearer "):].strip() if header.startswith("Bearer ") else ""
        if token not in self.server.hub.tokens:
            raise HubError(401, None, "Invalid credentials in Authorization header")
        return token

    def _repo(self, kind: str, parts: list[str], keywords: tuple[str, ...], token: str | None,
              moved: str) -> tuple[HubRepo, list[str]]:
        """The repository of type ``kind`` that ``parts`` start with (ORG/NAME or NAME), and the
        parts after it; a renamed one's old name is _Moved to ``moved`` (a format with {repo} and
        {rest}, the route under the new name)."""
        hub = self.server.hub
        single = len(parts) == 1 or parts[1] in keywords  # a name without an organisation ("gpt2")
        known = set(hub.repos) | set(hub.renamed)
        cut = 2 if repo_key("/".join(parts[:2]), kind) in known or not single else 1
        key = repo_key("/".join(parts[:cut]), kind)
        if key in hub.renamed:
            new = hub.repos[hub.renamed[key]].repo_id
            rest = "/".join(quote(p, safe="") for p in parts[cut:])
            raise _Moved(moved.format(repo=new, rest=rest).rstrip("/"))
        repo = hub.repos.get(key)
        if repo is None or (repo.private and token is None):
            raise HubError(401, "RepoNotFound", "Repository not found")
        return repo, parts[cut:]

    def _granted(self, kind: str, repo: HubRepo, token: str | None) -> None:
        if repo.gated and token is None:
            raise HubError(401, "GatedRepo", f"Access to {kind} {repo.repo_id} is restricted. You must have access "
                                             "to it and be authenticated to access it. Please log in.")
        if repo.gated and repo.granted is not None and token not in repo.granted:
            raise HubError(403, "GatedRepo", f"Access to {kind} {repo.repo_id} is restricted and you are not in "
                                             f"the authorized list. Visit the {kind} page to ask for access.")

    def _commit(self, repo: HubRepo, revision: str) -> tuple[str, dict[str, HubFile]]:
        sha = repo.commit_of(revision)
        if sha is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return sha, repo.commits[sha]

    # -- /api/{type}/... ---------------------------------------------------------------------
    def _api(self, kind: str, parts: list[str], query: dict, token: str | None) -> tuple[Any, dict]:
        repo, rest = self._repo(kind, parts, ("tree", "revision", "auth-check"), token,
                                f"/api/{kind}s/{{repo}}/{{rest}}")
        if rest[:1] == ["auth-check"]:
            self._granted(kind, repo, token)
            return {}, {}
        if rest[:1] == ["tree"] and len(rest) >= 2:
            return self._tree(kind, repo, rest[1], "/".join(rest[2:]), query)
        if not rest or (rest[:1] == ["revision"] and len(rest) == 2):
            sha, files = self._commit(repo, rest[1] if rest else "main")
            info = {"_id": sha[:24], "id": repo.repo_id, "sha": sha, "private": repo.private,
                    "gated": "auto" if repo.gated else False, "disabled": False,
                    "lastModified": "2026-01-01T00:00:00.000Z", "tags": [], "downloads": 0, "likes": 0,
                    "siblings": [{"rfilename": p} for p in sorted(files)]}
            return ({**info, "modelId": repo.repo_id} if kind == "model" else info), {}
        raise HubError(404, None, "Sorry, we can't find the page you are looking for.")

    def _tree(self, kind: str, repo: HubRepo, revision: str, folder: str, query: dict) -> tuple[list, dict]:
        _, files = self._commit(repo, revision)
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        prefix = folder.strip("/") + "/" if folder.strip("/") else ""
        if prefix and not any(p.startswith(prefix) for p in files):
            raise HubError(404, "EntryNotFound", f"{folder} does not exist on \"{revision}\"")
        entries: dict[str, dict] = {}
        for path in sorted(files):
            if not path.startswith(prefix):
                continue
            below = path[len(prefix):].split("/")
            for depth in range(1, len(below)):
                folder_path = prefix + "/".join(below[:depth])
                if recursive or depth == 1:
                    entries.setdefault(folder_path, {"type": "directory", "oid": git_blob_sha1(folder_path.encode()),
                                                     "size": 0, "path": folder_path})
            if recursive or len(below) == 1:
                entries[path] = files[path].tree_entry()
        listing = [entries[p] for p in sorted(entries)]
        start = int(query.get("cursor", ["0"])[0] or 0)
        page, size = listing[start:start + self.server.hub.page_size], self.server.hub.page_size
        headers = {}
        if start + size < len(listing):
            params = f"recursive={str(recursive).lower()}&expand=false&cursor={start + size}"
            path = f"/api/{kind}s/{repo.repo_id}/tree/{quote(revision, safe='')}" + (f"/{quote(folder)}" if folder else "")
            headers["Link"] = f"<{self._base()}{path}?{params}>; rel=\"next\""
        return page, headers

    # -- files ------------------------------------------------------------------------------
    def _resolve(self, kind: str, parts: list[str], token: str | None, head: bool) -> None:
        prefix = "" if kind == "model" else f"/{kind}s"
        repo, rest = self._repo(kind, parts, ("resolve",), token, prefix + "/{repo}/{rest}")
        if len(rest) < 3 or rest[0] != "resolve":
            raise HubError(404, None, "Sorry, we can't find the page you are looking for.")
        self._granted(kind, repo, token)
        sha, files = self._commit(repo, rest[1])
        path = "/".join(rest[2:])
        found = files.get(path)
        if found is None:
            raise HubError(404, "EntryNotFound", f"{path} does not exist on \"{rest[1]}\"")
        headers = {"X-Repo-Commit": sha}
        key = repo_key(repo.repo_id, kind)
        if found.lfs:
            blob = f"{key}/{found.sha256}"
            hub = self.server.hub
            cdn = hub.cdn_routes.get(self.headers.get("Host") or "") or hub.cdn_url or self._base()
            headers.update({"Location": f"{cdn}/_lfs/{blob}?sig={self.server.hub.sign(blob)}",
                            "X-Linked-Etag": f'"{found.sha256}"', "X-Linked-Size": str(len(found.data)),
                            "ETag": f'"{git_blob_sha1(lfs_pointer(found.data))}"'})
            self._send(302, b"", headers, head=True)
            return
        headers["ETag"] = f'"{git_blob_sha1(found.data)}"'
        self._file(key, found, headers, head)

    def _lfs(self, blob: str, query: dict, head: bool) -> None:
        hub = self.server.hub
        if head:  # a URL presigned for GET: the method is part of what is signed
            raise HubError(403, "SignatureDoesNotMatch", "The request signature we calculated does not match the "
                                                         "signature you provided (signed for GET)")
        if not hmac.compare_digest(query.get("sig", [""])[0], hub.sign(blob)):
            raise HubError(403, None, "Request not signed")
        key, _, sha256 = blob.rpartition("/")
        found = hub.blob(key, sha256)
        if found is None:
            raise HubError(404, None, "No such blob")
        self._file(key, found, {"ETag": f'"{sha256}"'}, head)

    def _file(self, key: str, found: HubFile, headers: dict, head: bool) -> None:
        data, status = found.data, 200
        span = self.headers.get("Range")
        if span:
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", span.strip())
            lo = int(match.group(1)) if match else len(data)
            hi = min(int(match.group(2)) + 1, len(data)) if match and match.group(2) else len(data)
            if lo >= len(data) and len(data):
                self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"}, head=True)
                return
            headers["Content-Range"] = f"bytes {lo}-{max(lo, hi - 1)}/{len(data)}"
            data, status = data[lo:hi], 206
        headers.update({"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"})
        start = int(headers["Content-Range"].split()[1].split("-")[0]) if status == 206 else 0
        if head:
            self._send(status, b"", {**headers, "Content-Length": str(len(data))}, head=True)
            return
        after = self.server.hub.take_busy(found.path, ranged=bool(span))
        if after is not None:
            raise HubError(429, None, "You have been rate-limited; retry later", {"Retry-After": str(after)})
        hub = self.server.hub
        hub.count(key, found.path)
        cut = hub.take_cut(found.path)
        with hub._lock:
            hub.in_flight += 1
            hub.peak = max(hub.peak, hub.in_flight)
        try:
            self._send(status, data, headers, cut=None if cut is None else max(0, cut - start))
        finally:
            with hub._lock:
                hub.in_flight -= 1

    # -- writing ------------------------------------------------------------------------------
    def _base(self) -> str:
        return f"http://{self.headers.get('Host') or '%s:%d' % self.server.server_address[:2]}"

    def _json(self, answer: tuple[Any, dict]) -> None:
        value, headers = answer
        self._send(200, json.dumps(value).encode(), {**headers, "Content-Type": "application/json"})

    def _error(self, exc: HubError) -> None:
        headers = {"X-Error-Message": str(exc), "Content-Type": "application/json", **exc.headers}
        if exc.code:
            headers["X-Error-Code"] = exc.code
        self._send(exc.status, json.dumps({"error": str(exc)}).encode(), headers, head=self.command == "HEAD")

    def _send(self, status: int, data: bytes, headers: dict, head: bool = False, cut: int | None = None) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if head:
            return
        rate, sent, started = self.server.hub.rate, 0, time.monotonic()
        limit = len(data) if cut is None else min(cut, len(data))
        view = memoryview(data)
        while sent < limit:
            piece = view[sent:min(limit, sent + CHUNK)]
            self.wfile.write(piece)
            sent += len(piece)
            if rate:
                ahead = sent / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)  # the bandwidth limit itself
        if cut is not None:
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)


def unquote_parts(path: str) -> list[str]:
    """A path's segments, each unquoted on its own (a revision may hold an encoded '/')."""
    return [unquote(part) for part in path.split("/") if part != ""]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], hub: Hub) -> None:
        super().__init__(address, _Handler)
        self.hub = hub

    def handle_error(self, request, client_address) -> None:
        """A client that hung up mid-answer (or a cut we made) is no error of ours."""
        import sys

        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class HubServer:
    """The Hub on a free loopback port, and its CDN on another, each served from a thread; ``url``
    is its ``HF_ENDPOINT``."""

    def __init__(self, hub: Hub | None = None, host: str = "127.0.0.1") -> None:
        self.hub = hub or Hub()
        self._servers = [_Server((host, 0), self.hub), _Server((host, 0), self.hub)]
        self.url, self.hub.cdn_url = ("http://%s:%d" % s.server_address[:2] for s in self._servers)
        self._threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                                          name="tpunb-hub-stand-in") for s in self._servers]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        for server, thread in zip(self._servers, self._threads):
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)

    def __enter__(self) -> "HubServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
