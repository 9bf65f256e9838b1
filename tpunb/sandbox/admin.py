"""A small client for the emulator's admin endpoints, for tests, benchmarks and notebooks.

It talks HTTP (urllib, stdlib) so it drives an emulator in this process and one started as
``python -m tpunb.sandbox`` in exactly the same way.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any


class AdminError(RuntimeError):
    """The emulator answered an admin call with an error."""


class AdminClient:
    """Fault injection, preemption, state and reset of one emulator at ``url``."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def admin(self, method: str, path: str, body: dict | None = None) -> Any:
        """One admin call, e.g. ``admin("POST", "/_emulator/faults", {"quota": "http"})``."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as e:
            raise AdminError(f"{method} {path}: {e.code} {e.read().decode(errors='replace')}") from None

    def state(self) -> dict:
        return self.admin("GET", "/_emulator/state")

    def nodes(self) -> list[dict]:
        return self.state()["nodes"]

    def queued_resources(self) -> list[dict]:
        return self.state()["queuedResources"]

    def faults(self, **changes: Any) -> dict:
        """Turn faults on or off: quota="operation"|"http" (quota_regions=[regions]: only there),
        no_capacity=True|[zones], permission_denied=True|[zones], delete_denied=True, api_disabled=True, os_login=True (enable-oslogin=TRUE in every project: VMs ignore metadata
        ssh-keys), slow_create=seconds, preempt_after=seconds."""
        return self.admin("POST", "/_emulator/faults", changes)

    def accounts(self, user: str | None = None, permissions: dict | None = None,
                 project_metadata: dict | None = None, org_policies: dict | None = None) -> dict:
        """Who the kernel is (``user``), what each principal may do (``{principal: [role or
        permission pattern, ...]}``, None: everything again), each project's metadata
        (``{project: {"enable-oslogin": "TRUE"}}``) and the organisation's boolean policies
        (``{"constraints/compute.requireOsLogin": True}``); the current settings without arguments."""
        changes = {k: v for k, v in (("user", user), ("permissions", permissions),
                                     ("project_metadata", project_metadata), ("org_policies", org_policies))
                   if v is not None}
        return self.admin("POST", "/_emulator/accounts", changes) if changes else self.admin("GET", "/_emulator/accounts")

    def clear_faults(self) -> dict:
        return self.admin("DELETE", "/_emulator/faults")

    def timings(self, **changes: float) -> dict:
        return self.admin("POST", "/_emulator/timings", changes)

    def preempt(self, node: str, after: float | None = None, state: str | None = None,
                notice: float | None = None) -> dict:
        """Preempt ``node`` (its id or full name) now, or ``after`` seconds from now; ``notice``: its
        VMs get the preemption notice first (metadata, SIGTERM) and die that many seconds later."""
        body: dict[str, Any] = {}
        if notice is not None:
            body["notice"] = notice
        if after is not None:
            body["after"] = after
        if state is not None:
            body["state"] = state
        return self.admin("POST", f"/_emulator/nodes/{node}:preempt", body)

    def compute_faults(self, **changes: Any) -> dict:
        """Compute Engine faults: unstable=True|[zones] (MIGs never fill; unstable_code and
        unstable_message say what listErrors shows), allowlisted=True (TPU7x Spot/Flex-start allowed),
        reservations={name: {"zone", "mode", "project", "shared_with"}}, quotas={id: {region: chips}},
        and the VPC: subnets, routers (Cloud NAT), routers_denied (compute_project.py)."""
        return self.admin("POST", "/_emulator/compute/faults", changes)

    def recreate(self, instance: str) -> dict:
        """The MIG holding ``instance`` recreates it: a new VM (id, host) of the same name and worker."""
        return self.admin("POST", f"/_emulator/compute/instances/{instance}:recreate", {})

    def reset(self) -> dict:
        return self.admin("POST", "/_emulator/reset")

    def wait_for(
        self, predicate: Callable[[dict], bool], timeout: float = 10.0, interval: float = 0.01
    ) -> dict:
        """Poll the state until ``predicate(state)`` holds; returns that state or raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.state()
            if predicate(state):
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"emulator state did not reach the condition in {timeout} s: {state}")
            time.sleep(interval)
