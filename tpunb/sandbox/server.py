"""HTTP front of the emulator: the Cloud TPU v2 REST paths plus a small admin API.

API (what google-cloud-tpu's REST transport calls; every path starts with /v2/):
  GET|POST   projects/P/locations/Z/nodes             list (Z may be "-") | create (?nodeId=)
  GET|DELETE projects/P/locations/Z/nodes/N
  POST       projects/P/locations/Z/nodes/N:getGuestAttributes   what the workers wrote (metadata.py)
  GET|POST   projects/P/locations/Z/queuedResources   list | create (?queuedResourceId=)
  GET|DELETE projects/P/locations/Z/queuedResources/Q (?force=true deletes its node too)
  GET        projects/P/locations/Z/operations/O
  GET        projects/P/locations/Z/acceleratorTypes[/T]  |  runtimeVersions[/V]   (from tpunb's catalog)
Beside it, what tpunb asks other Google APIs (the same base URL stands for each of their hosts):
  POST /v1/users/U:importSshPublicKey (?projectId=)   OS Login: add a key, get the login profile
  GET  /v1/users/U/loginProfile (?projectId=)          OS Login: the profile (its POSIX user)
  POST /v1/projects/P:testIamPermissions               Cloud Resource Manager: which permissions the caller has
  POST /v1/projects/P:getEffectiveOrgPolicy            Cloud Resource Manager: a boolean org policy in force (accounts.py)
  POST /v1/projects/P/serviceAccounts/SA:testIamPermissions   IAM: the same, on a service account (actAs)
  GET  /compute/v1/projects/P                          Compute Engine: the project's commonInstanceMetadata
  GET  /v1/projects/P/locations/global/services/S/quotaInfos/Q   Cloud Quotas: a TPU quota's values (quotas.py)
  GET  /tokeninfo                                      OAuth2: the caller's email
Admin (JSON in and out):
  GET  /_emulator/health               {"ok": true}
  GET  /_emulator/state                every node, queued resource, pending operation, fault, timing
  POST /_emulator/reset                forget everything; back to the faults/timings it started with
  GET|POST|DELETE /_emulator/faults    read | merge (e.g. {"quota": "operation"}) | clear
  POST /_emulator/timings              e.g. {"create_seconds": 2}
  GET|POST /_emulator/accounts         read | change the user, permissions per principal, project metadata
  POST /_emulator/nodes/{id}:preempt   {"after": seconds, "state": "PREEMPTED"|"TERMINATED", "notice": seconds}
                                       (all optional; with notice: metadata and SIGTERM first, the node dies after;
                                       a Compute Engine instance's name: its 30 s Spot notice, then TERMINATED)
  POST /_emulator/compute/faults       merge Compute Engine faults: {"unstable": true|[zones], "unstable_code",
                                       "unstable_message"} (MIGs never fill, listErrors says why), {"allowlisted": true}
                                       (the project may make TPU7x Spot and Flex-start VMs)
  POST /_emulator/compute/instances/{name}:recreate   a MIG recreates that VM (new id, new host)
The Compute Engine API (compute v1, /compute/v1/projects/P/...) is compute_routes.py's.
Calls without an Authorization header come from the project's user (tpunb's kernel); a bearer
token must be one the metadata server gave a node's VM (metadata.py), for that node's project,
and acts as that node's service account. Each call needs its IAM permission (accounts.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

from tpunb.sandbox.tpu import catalog_api
from tpunb.sandbox.compute import compute_routes
from tpunb.sandbox import quotas
from tpunb.sandbox.iam.accounts import API_PERMISSIONS
from tpunb.sandbox.admin import AdminClient
from tpunb.sandbox.hosts.pool import HostPool
from tpunb.sandbox.metadata.metadata_server import MetadataServer
from tpunb.sandbox.tpu.resources import ApiError
from tpunb.sandbox.state import Emulator, Faults, Timings

_LOC = r"/v2/projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)"
_ROUTES: list[tuple[str, re.Pattern, str]] = [
    ("GET", re.compile(_LOC + r"/nodes$"), "list_nodes"),
    ("POST", re.compile(_LOC + r"/nodes$"), "create_node"),
    ("GET", re.compile(_LOC + r"/nodes/(?P<id>[^/:]+)$"), "get_node"),
    ("DELETE", re.compile(_LOC + r"/nodes/(?P<id>[^/:]+)$"), "delete_node"),
    ("PATCH", re.compile(_LOC + r"/nodes/(?P<id>[^/:]+)$"), "update_node"),
    ("POST", re.compile(_LOC + r"/nodes/(?P<id>[^/:]+):getGuestAttributes$"), "get_guest_attributes"),
    ("GET", re.compile(_LOC + r"/queuedResources$"), "list_queued"),
    ("POST", re.compile(_LOC + r"/queuedResources$"), "create_queued"),
    ("GET", re.compile(_LOC + r"/queuedResources/(?P<id>[^/:]+)$"), "get_queued"),
    ("DELETE", re.compile(_LOC + r"/queuedResources/(?P<id>[^/:]+)$"), "delete_queued"),
    ("GET", re.compile(r"/v2/(?P<name>projects/[^/]+/locations/[^/]+/operations/[^/:]+)$"), "get_operation"),
    ("GET", re.compile(_LOC + r"/acceleratorTypes$"), "list_accelerator_types"),
    ("GET", re.compile(_LOC + r"/acceleratorTypes/(?P<id>[^/:]+)$"), "get_accelerator_type"),
    ("GET", re.compile(_LOC + r"/runtimeVersions$"), "list_runtime_versions"),
    ("GET", re.compile(_LOC + r"/runtimeVersions/(?P<id>[^/:]+)$"), "get_runtime_version"),
    ("POST", re.compile(r"/v1/users/(?P<user>[^/:]+):importSshPublicKey$"), "import_ssh_key"),
    ("GET", re.compile(r"/v1/users/(?P<user>[^/:]+)/loginProfile$"), "login_profile"),
    ("POST", re.compile(r"/v1/projects/(?P<project>[^/:]+):testIamPermissions$"), "test_iam_permissions"),
    ("POST", re.compile(r"/v1/projects/(?P<project>[^/:]+):getEffectiveOrgPolicy$"), "effective_org_policy"),
    ("POST", re.compile(r"/v1/projects/(?P<project>[^/:]+)/serviceAccounts/(?P<account>[^/:]+):testIamPermissions$"),
     "test_iam_permissions"),
    ("GET", re.compile(r"/compute/v1/projects/(?P<project>[^/:]+)$"), "compute_project"),
    ("GET", re.compile(r"/v1/projects/(?P<project>[^/:]+)/locations/global/services/(?P<service>[^/]+)/quotaInfos/"
                       r"(?P<quota>[^/]+)$"), "quota_info"),
    ("GET", re.compile(r"/tokeninfo$"), "tokeninfo"),
    ("GET", re.compile(r"/_emulator/health$"), "admin_health"),
    ("GET", re.compile(r"/_emulator/accounts$"), "admin_accounts"),
    ("POST", re.compile(r"/_emulator/accounts$"), "admin_set_accounts"),
    ("GET", re.compile(r"/_emulator/state$"), "admin_state"),
    ("POST", re.compile(r"/_emulator/reset$"), "admin_reset"),
    ("GET", re.compile(r"/_emulator/faults$"), "admin_faults"),
    ("POST", re.compile(r"/_emulator/faults$"), "admin_set_faults"),
    ("DELETE", re.compile(r"/_emulator/faults$"), "admin_clear_faults"),
    ("POST", re.compile(r"/_emulator/timings$"), "admin_set_timings"),
    ("POST", re.compile(r"/_emulator/nodes/(?P<ref>.+):preempt$"), "admin_preempt"),
    ("POST", re.compile(r"/_emulator/compute/faults$"), "admin_compute_faults"),
    ("POST", re.compile(r"/_emulator/compute/instances/(?P<ref>[^/:]+):recreate$"), "admin_recreate"),
]


_KINDS = {"node": "nodes", "guest_attribute": "nodes", "queued": "queuedResources",
          "accelerator_type": "acceleratorTypes", "runtime_version": "runtimeVersions"}


def _resource(action: str, m: dict[str, str]) -> str:
    """What a Cloud TPU call acts on, as IAM names it: the location for list and create, else the item."""
    if "name" in m:
        return m["name"]
    parent = f"projects/{m.get('project', '')}/locations/{m.get('zone', '')}"
    what = action.split("_", 1)[1].removesuffix("s")
    return f"{parent}/{_KINDS.get(what, what)}/{m['id']}" if m.get("id") else parent


def _api(emu: Emulator, action: str, m: dict[str, str], q: dict[str, str], body: dict, caller: str = "") -> Any:
    """Dispatch one matched route to the emulator (under its lock), once the caller may make it."""
    p, z = m.get("project", ""), m.get("zone", "")
    size, token = int(q.get("pageSize") or 0), q.get("pageToken", "")
    if action in API_PERMISSIONS:
        emu.call(emu.accounts.require, caller, API_PERMISSIONS[action], _resource(action, m))

    def located(fn: Callable[..., Any], *args: str) -> Any:
        """A catalog call, after the same location (and API enabled) checks every call gets."""
        emu.call(emu._check_location, p, z)
        return fn(p, z, *args, offered=emu.faults.offered)

    calls: dict[str, Callable[[], Any]] = {
        "list_nodes": lambda: emu.call(emu.list_nodes, p, z, size, token),
        "create_node": lambda: emu.call(emu.create_node, p, z, q.get("nodeId", ""), body),
        "get_node": lambda: emu.call(emu.get_node, p, z, m["id"]),
        "delete_node": lambda: emu.call(emu.delete_node, p, z, m["id"]),
        "update_node": lambda: emu.call(emu.update_node, p, z, m["id"], body, q.get("updateMask", "")),
        "import_ssh_key": lambda: emu.call(emu.import_ssh_key, caller, m["user"], body, q.get("projectId", "")),
        "login_profile": lambda: emu.call(emu.accounts.login_profile, caller, m["user"], q.get("projectId", "")),
        "test_iam_permissions": lambda: emu.call(emu.accounts.test_permissions, caller, p, body),
        "effective_org_policy": lambda: emu.call(emu.accounts.effective_policy, caller, p, body),
        "compute_project": lambda: emu.call(emu.accounts.compute_project, caller, p),
        "quota_info": lambda: emu.call(lambda: quotas.quota_info(p, m["service"], m["quota"], emu.compute.faults,
                                                                 emu.faults.quota_regions, bool(emu.faults.quota))),
        "tokeninfo": lambda: emu.call(emu.accounts.tokeninfo, caller),
        "admin_accounts": lambda: emu.call(emu.accounts.snapshot),
        "admin_set_accounts": lambda: emu.call(emu.set_accounts, body),
        "get_guest_attributes": lambda: emu.call(emu.get_guest_attributes, p, z, m["id"], body),
        "list_queued": lambda: emu.call(emu.list_queued, p, z, size, token),
        "create_queued": lambda: emu.call(emu.create_queued, p, z, q.get("queuedResourceId", ""), body),
        "get_queued": lambda: emu.call(emu.get_queued, p, z, m["id"]),
        "delete_queued": lambda: emu.call(
            emu.delete_queued, p, z, m["id"], q.get("force", "").lower() == "true"
        ),
        "get_operation": lambda: emu.call(emu.get_operation, m["name"]),
        "list_accelerator_types": lambda: located(catalog_api.list_accelerator_types),
        "get_accelerator_type": lambda: located(catalog_api.get_accelerator_type, m["id"]),
        "list_runtime_versions": lambda: located(catalog_api.list_runtime_versions),
        "get_runtime_version": lambda: located(catalog_api.get_runtime_version, m["id"]),
        "admin_health": lambda: {"ok": True},
        "admin_state": lambda: emu.call(emu.snapshot),
        "admin_reset": lambda: emu.call(emu.reset),
        "admin_faults": lambda: emu.call(lambda: emu.snapshot()["faults"]),
        "admin_set_faults": lambda: emu.call(emu.set_faults, body),
        "admin_clear_faults": lambda: emu.call(emu.clear_faults),
        "admin_set_timings": lambda: emu.call(emu.set_timings, body),
        "admin_compute_faults": lambda: emu.call(emu.compute.set_faults, body),
        "admin_recreate": lambda: emu.call(emu.compute.recreate, m["ref"]),
        "admin_preempt": lambda: emu.call(
            emu.preempt, m["ref"], float(body.get("after") or 0), body.get("state"),
            float(body["notice"]) if body.get("notice") is not None else None
        ),
    }
    return calls[action]()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client's session reuses one connection
    disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms delayed-ACK stall
    server: _Server

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        # the client appends "$alt=json;enum-encoding=int": split on ";" too
        query = {k: v[-1] for k, v in parse_qs(url.query.replace(";", "&")).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        self._request = (self.command, url.path, query, raw)
        try:
            body = json.loads(raw) if raw.strip() else {}
            compute = compute_routes.PREFIX.match(url.path)
            if compute is not None:
                emu = self.server.emulator
                caller = emu.call(emu.caller, self.headers.get("Authorization"), unquote(compute["project"]))
                self._send(200, emu.call(compute_routes.dispatch, emu.compute, self.command, url.path, query, body,
                                         caller, emu.accounts))
                return
            for method, pattern, action in _ROUTES:
                m = pattern.match(url.path)
                if m and method == self.command:
                    groups = {k: unquote(v) for k, v in m.groupdict().items()}
                    caller = ""
                    if not url.path.startswith("/_emulator/"):
                        emu = self.server.emulator
                        project = groups.get("project") or groups.get("name", "/").split("/")[1] or query.get("projectId", "")
                        caller = emu.call(emu.caller, self.headers.get("Authorization"), project)
                    self._send(200, _api(self.server.emulator, action, groups, query, body, caller))
                    return
            raise ApiError(404, "NOT_FOUND", f"The emulator does not serve {self.command} {url.path}")
        except ApiError as e:
            self._send(e.http, e.body())
        except (ValueError, KeyError, TypeError) as e:
            self._send(400, ApiError(400, "INVALID_ARGUMENT", f"Bad request: {e}").body())

    do_GET = do_POST = do_DELETE = do_PATCH = _dispatch

    def _send(self, code: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        exchanges = self.server.exchanges
        method, path, query, raw = self._request
        if exchanges is not None and path.startswith("/v2/"):
            exchanges.append(Exchange(method, path, query, raw, code, data))
        if self.server.compute_exchanges is not None and compute_routes.PREFIX.match(path):
            self.server.compute_exchanges.append(Exchange(method, path, query, raw, code, data))
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)


class Exchange(NamedTuple):
    """One API call as it crossed the wire: what tests check against Google's own messages."""

    method: str
    path: str
    query: dict[str, str]
    request: bytes
    status: int
    response: bytes


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], emulator: Emulator, verbose: bool = False) -> None:
        super().__init__(address, _Handler)
        self.emulator = emulator
        self.verbose = verbose
        self.exchanges: list[Exchange] | None = None  # set by EmulatorHandle.record()
        self.compute_exchanges: list[Exchange] | None = None  # set by EmulatorHandle.record_compute()

    def handle_error(self, request, client_address) -> None:
        """A client that hung up mid-answer (an interrupted launch) is normal, not worth a traceback."""
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


class EmulatorHandle(AdminClient):
    """A running emulator in this process: its URL, the admin helpers and how to stop it."""

    def __init__(self, server: _Server, thread: threading.Thread) -> None:
        host, port = server.server_address[:2]
        super().__init__(f"http://{host}:{port}")
        self._server = server
        self._thread = thread
        self.emulator = server.emulator

    def record(self) -> list[Exchange]:
        """Keep every /v2/ request and its answer, raw, in the returned list (appended as served;
        a second call returns the same list)."""
        if self._server.exchanges is None:
            self._server.exchanges = []
        return self._server.exchanges

    def record_compute(self) -> list[Exchange]:
        """Keep every Compute Engine call (/compute/v1/projects/P/...) and its answer, as ``record`` does."""
        if self._server.compute_exchanges is None:
            self._server.compute_exchanges = []
        return self._server.compute_exchanges

    def stop(self) -> None:
        """Stop serving, stop the clock and remove the keys this emulator installed."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self.emulator.close()

    def __enter__(self) -> EmulatorHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def build_emulator(
    create_seconds: float = 0.5,
    delete_seconds: float = 0.2,
    queue_seconds: float = 0.3,
    ssh_hosts: list[str] | None = None,
    ssh_port: int = 22,
    authorized_keys: str | None = None,
    faults: dict | None = None,
    metadata_port: int | None = None,
    host_environment: dict[str, dict[str, str]] | None = None,
    accounts: str | None = None,
    vm_image: dict | None = None,
    host_keys: dict[str, dict[str, str]] | None = None,
    shared_host_key: str | None = None,
) -> Emulator:
    """An Emulator from the same options the command line takes. With ``metadata_port``, a
    metadata server answers on every host address at that port; ``host_environment`` (address ->
    variables, as the sshd gives its sessions) is what the hosts' boot runs with (by default
    ``GCE_METADATA_HOST`` and a ``TPUNB_HOST_DIR`` per host under a temp dir); ``vm_image`` is what
    a Compute Engine instance's host is made of (``HostPool.configure``); ``host_keys`` (address ->
    its sshd's key file and pid file) gives each new VM on an address a host key of its own;
    without it, ``shared_host_key`` is the one every address shows (and each VM publishes)."""
    emu_faults = Faults()
    emu_faults.update(faults or {})
    hosts = list(ssh_hosts or [])
    disks = None
    if metadata_port and host_environment is None:  # each host its own metadata server and state dir
        disks = tempfile.mkdtemp(prefix="tpunb-emulator-hosts-")
        host_environment = {a: {"GCE_METADATA_HOST": f"{a}:{metadata_port}", "TPUNB_HOST_DIR": f"{disks}/{a}"}
                            for a in hosts}
    emu = Emulator(
        Timings(create_seconds, delete_seconds, queue_seconds),
        emu_faults,
        HostPool(hosts, ssh_port, authorized_keys, host_environment, accounts, vm_image, host_keys, shared_host_key),
    )
    if disks:
        emu.closers.append(lambda: shutil.rmtree(disks, ignore_errors=True))
    if metadata_port and hosts:
        try:
            emu.closers.append(MetadataServer(emu, hosts, metadata_port).stop)
        except BaseException:
            emu.close()
            raise
    return emu


def serve(host: str = "127.0.0.1", port: int = 0, verbose: bool = False, **options: Any) -> _Server:
    """A bound (not yet serving) HTTP server around a new emulator."""
    return _Server((host, port), build_emulator(**options), verbose=verbose)


def start_emulator(port: int = 0, host: str = "127.0.0.1", **options: Any) -> tuple[str, EmulatorHandle]:
    """Run an emulator in a background thread; returns its URL (for TPUNB_TPU_API_ENDPOINT) and a handle.

    ``options`` are build_emulator's: create_seconds, delete_seconds, queue_seconds, ssh_hosts,
    ssh_port, authorized_keys, accounts, metadata_port, host_environment, faults (a dict like {"no_capacity": ["us-central2-b"]}), plus verbose.
    """
    server = serve(host, port, **options)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="tpu-emulator-http", daemon=True
    )
    thread.start()
    handle = EmulatorHandle(server, thread)
    return handle.url, handle


def start_emulator_process(*flags: str, **popen_kwargs: Any) -> tuple[subprocess.Popen, str]:
    """Run ``python -m tpunb.sandbox --port 0 FLAGS...``; returns the process and its URL.

    Reads the one line the emulator prints once it accepts requests. Stop it with
    ``proc.terminate()`` (SIGTERM ends it cleanly, exit status 0).
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpunb.sandbox", "--port", "0", *flags],
        stdout=subprocess.PIPE,
        text=True,
        **popen_kwargs,
    )
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("tpunb emulator listening on "):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the emulator did not start (exit status {proc.returncode}): {line!r}")
    return proc, line.split()[-1]
