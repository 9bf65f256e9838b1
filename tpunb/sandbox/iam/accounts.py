"""Who calls the emulated APIs and what each may do: principals, permissions, project metadata
and OS Login profiles.

Principals. A call without credentials comes from the project's user (``user``, by default
user@example.com): that is how tpunb's kernel talks to the emulator. A bearer token that a VM got
from its metadata server belongs to its node's service account (the one named at create, else
the project's Compute Engine default account). Each principal holds IAM permissions, given as
names or ``*`` patterns (``tpu.nodes.*``) or as one of the predefined roles below; a principal
that was never set holds every permission, as a project owner does. Every API call needs its
permission, else 403 ``IAM_PERMISSION_DENIED``; Cloud Resource Manager's
``projects.testIamPermissions`` answers which of a list the caller holds.

OS Login. Projects have metadata, as Compute Engine's ``commonInstanceMetadata`` (the
``os_login`` fault sets ``enable-oslogin=TRUE`` in every project). A user imports an SSH key into
their login profile (``users/{email}:importSshPublicKey``) and gets a POSIX account named from
the email (alice@example.com: ``alice_example_com``). A VM under OS Login accepts a profile's keys
for its POSIX user while the account holds ``compute.instances.osLogin`` (roles/compute.osLogin)
or ``compute.instances.osAdminLogin``; it ignores metadata ``ssh-keys``.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import re
import time
from dataclasses import dataclass, field
from typing import Any

from tpunb.sandbox.tpu.resources import ApiError, error_info

USER = "user@example.com"
#: role -> the permissions it grants (what the tests name; a subset of Google's predefined roles)
ROLES = {
    "roles/owner": ["*"],
    "roles/editor": ["*"],
    "roles/tpu.admin": ["tpu.*"],
    "roles/tpu.viewer": ["tpu.*.get", "tpu.*.list"],
    "roles/compute.osLogin": ["compute.instances.osLogin"],
    "roles/compute.osAdminLogin": ["compute.instances.osLogin", "compute.instances.osAdminLogin"],
    "roles/compute.instanceAdmin.v1": ["compute.instances.*", "compute.instanceGroupManagers.*",
                                       "compute.instanceTemplates.*", "compute.zoneOperations.*"],
    "roles/iam.serviceAccountUser": ["iam.serviceAccounts.actAs"],
    "roles/orgpolicy.policyViewer": ["orgpolicy.policy.get"],
}
LOGIN_PERMISSIONS = ("compute.instances.osLogin", "compute.instances.osAdminLogin")
REQUIRE_OS_LOGIN = "constraints/compute.requireOsLogin"
#: what each Cloud TPU v2 call needs (IAM permission names as Google spells them)
API_PERMISSIONS = {
    "list_nodes": "tpu.nodes.list", "create_node": "tpu.nodes.create", "get_node": "tpu.nodes.get",
    "delete_node": "tpu.nodes.delete", "update_node": "tpu.nodes.update", "get_guest_attributes": "tpu.nodes.get",
    "list_queued": "tpu.queuedResources.list", "create_queued": "tpu.queuedResources.create",
    "get_queued": "tpu.queuedResources.get", "delete_queued": "tpu.queuedResources.delete",
    "get_operation": "tpu.operations.get",
    "list_accelerator_types": "tpu.acceleratortypes.list", "get_accelerator_type": "tpu.acceleratortypes.get",
    "list_runtime_versions": "tpu.runtimeversions.list", "get_runtime_version": "tpu.runtimeversions.get",
}


def default_service_account(project: str) -> str:
    """The Compute Engine default service account a VM runs as when none is named."""
    return f"{project}-compute@developer.gserviceaccount.com"


def posix_username(email: str) -> str:
    """The POSIX user OS Login makes for an account: the email with every character that is not a
    letter or digit as ``_``, lowercase, at most 32 characters (alice@example.com: alice_example_com)."""
    return re.sub(r"[^a-z0-9]", "_", email.lower())[:32]


def fingerprint(key: str) -> str:
    """OS Login's id of a key: the SHA-256 of its blob, hex (what sshPublicKeys/{fingerprint} names)."""
    parts = key.split()
    blob = base64.b64decode(parts[1]) if len(parts) > 1 else key.encode()
    return hashlib.sha256(blob).hexdigest()


@dataclass
class Profile:
    """One account's OS Login profile: its POSIX account and imported keys (fingerprint -> key)."""

    email: str
    uid: int
    keys: dict[str, str] = field(default_factory=dict)
    expiry: dict[str, int] = field(default_factory=dict)  # fingerprint -> expirationTimeUsec, where given

    def live_keys(self) -> dict[str, str]:
        """The keys not expired now (OS Login drops an expired key from what VMs accept)."""
        now = time.time() * 1e6
        return {fp: key for fp, key in self.keys.items() if self.expiry.get(fp, now + 1) > now}

    @property
    def username(self) -> str:
        return posix_username(self.email)

    def to_json(self, project: str = "") -> dict:
        account: dict[str, Any] = {"primary": True, "username": self.username, "uid": str(self.uid),
                                   "gid": str(self.uid), "homeDirectory": f"/home/{self.username}",
                                   "operatingSystemType": "LINUX", "accountId": project or "",
                                   "name": f"users/{self.email}/projects/{project}" if project else ""}
        profile: dict[str, Any] = {"name": self.email, "posixAccounts": [{k: v for k, v in account.items() if v}]}
        if self.keys:
            profile["sshPublicKeys"] = {fp: {"key": key, "fingerprint": fp, "name": f"users/{self.email}/sshPublicKeys/{fp}",
                                             **({"expirationTimeUsec": str(self.expiry[fp])} if fp in self.expiry else {})}
                                        for fp, key in self.keys.items()}
        return profile


class Accounts:
    """The principals, their permissions, the projects' metadata and the OS Login profiles."""

    def __init__(self) -> None:
        self.user = USER
        self.permissions: dict[str, list[str]] = {}  # principal -> patterns or roles; absent: everything
        self.project_metadata: dict[str, dict[str, str]] = {}
        self.os_login_everywhere = False  # the os_login fault: every project has enable-oslogin=TRUE
        self.profiles: dict[str, Profile] = {}
        #: the organisation's boolean policies enforced on every project (getEffectiveOrgPolicy)
        self.enforced: set[str] = set()

    # -- settings (the admin endpoint) ---------------------------------------------------------

    def update(self, changes: dict) -> dict:
        """``{"user": EMAIL, "permissions": {principal: [role or pattern, ...] | null},
        "project_metadata": {project: {key: value | null}}, "org_policies": {constraint: bool}}``;
        null forgets (everything / the key)."""
        unknown = set(changes) - {"user", "permissions", "project_metadata", "org_policies"}
        if unknown:
            raise ApiError(400, "INVALID_ARGUMENT", f"unknown account setting {sorted(unknown)[0]!r}; known: "
                           "user, permissions, project_metadata, org_policies")
        for constraint, on in (changes.get("org_policies") or {}).items():
            (self.enforced.add if on else self.enforced.discard)(str(constraint))
        if changes.get("user"):
            self.user = str(changes["user"])
        for principal, granted in (changes.get("permissions") or {}).items():
            if granted is None:
                self.permissions.pop(principal, None)
            else:
                self.permissions[principal] = [str(g) for g in granted]
        for project, items in (changes.get("project_metadata") or {}).items():
            metadata = self.project_metadata.setdefault(project, {})
            for key, value in (items or {}).items():
                if value is None:
                    metadata.pop(key, None)
                else:
                    metadata[key] = str(value)
        return self.snapshot()

    def snapshot(self) -> dict:
        return {"user": self.user, "permissions": dict(self.permissions),
                "project_metadata": {p: dict(m) for p, m in self.metadata_of_all().items()},
                "os_login_profiles": {e: {"username": p.username, "keys": len(p.keys),
                                          "expiry_usec": sorted(p.expiry.values())} for e, p in self.profiles.items()}}

    # -- IAM -----------------------------------------------------------------------------------

    def allowed(self, principal: str, permission: str) -> bool:
        granted = self.permissions.get(principal)
        if granted is None:
            return True
        patterns = [p for g in granted for p in ROLES.get(g, [g])]
        return any(fnmatch.fnmatchcase(permission, p) for p in patterns)

    def require(self, principal: str, permission: str, resource: str, service: str = "tpu.googleapis.com") -> None:
        """403 IAM_PERMISSION_DENIED, as the real API words it, unless ``principal`` holds ``permission``."""
        if not self.allowed(principal, permission):
            raise ApiError(
                403, "PERMISSION_DENIED",
                f"Permission '{permission}' denied on resource '//{service}/{resource}' (or it may not exist).",
                [error_info("IAM_PERMISSION_DENIED", service, permission=permission, resource=resource)])

    def test_permissions(self, principal: str, project: str, body: dict) -> dict:
        """cloudresourcemanager v1 projects.testIamPermissions: the asked permissions the caller holds."""
        asked = [str(p) for p in body.get("permissions") or []]
        held = [p for p in asked if self.allowed(principal, p)]
        return {"permissions": held} if held else {}  # proto3 JSON: no empty list

    # -- project metadata ----------------------------------------------------------------------

    def metadata(self, project: str) -> dict[str, str]:
        found = dict(self.project_metadata.get(project, {}))
        if self.os_login_everywhere:
            found.setdefault("enable-oslogin", "TRUE")
        return found

    def metadata_of_all(self) -> dict[str, dict[str, str]]:
        return {p: self.metadata(p) for p in self.project_metadata}

    def compute_project(self, principal: str, project: str) -> dict:
        """compute v1 projects.get, the parts tpunb reads: commonInstanceMetadata, defaultServiceAccount."""
        self.require(principal, "compute.projects.get", f"projects/{project}", "compute.googleapis.com")
        items = [{"key": k, "value": v} for k, v in sorted(self.metadata(project).items())]
        return {"kind": "compute#project", "name": project, "commonInstanceMetadata": {"items": items} if items else {},
                "defaultServiceAccount": default_service_account(project)}

    def os_login_on(self, project: str, node_metadata: dict[str, str]) -> bool:
        """An instance's value overrides the project's (Google's OS Login page); the organisation's
        requireOsLogin overrides both (its constraint's description: metadata cannot turn it off)."""
        if REQUIRE_OS_LOGIN in self.enforced:
            return True
        value = node_metadata.get("enable-oslogin", self.metadata(project).get("enable-oslogin", ""))
        return value.strip().upper() == "TRUE"

    def effective_policy(self, principal: str, project: str, body: dict) -> dict:
        """cloudresourcemanager v1 projects.getEffectiveOrgPolicy of a boolean constraint (needs
        orgpolicy.policy.get, which roles/orgpolicy.policyViewer grants)."""
        self.require(principal, "orgpolicy.policy.get", f"projects/{project}", "cloudresourcemanager.googleapis.com")
        constraint = str(body.get("constraint") or "")
        if not constraint.startswith("constraints/"):
            raise ApiError(400, "INVALID_ARGUMENT", f"Invalid constraint name {constraint!r}.")
        enforced = {"booleanPolicy": {"enforced": True}} if constraint in self.enforced else {"booleanPolicy": {}}
        return {"version": 1, "constraint": constraint, **enforced}

    # -- OS Login ------------------------------------------------------------------------------

    def _own_profile(self, principal: str, email: str) -> Profile:
        if email != principal:
            raise ApiError(403, "PERMISSION_DENIED", "The caller does not have permission")
        if email not in self.profiles:
            self.profiles[email] = Profile(email, 1000 + len(self.profiles) * 7 + 3)
        return self.profiles[email]

    def import_key(self, principal: str, email: str, body: dict, project: str) -> dict:
        """users.importSshPublicKey: the key joins the caller's own profile. With ``projectId``, the
        account must be allowed to log in there (roles/compute.osLogin or osAdminLogin)."""
        key = str(body.get("key") or "").strip()
        if not key.startswith(("ssh-", "ecdsa-", "sk-")):
            raise ApiError(400, "INVALID_ARGUMENT", "Invalid SSH public key.")
        profile = self._own_profile(principal, email)
        if project and not any(self.allowed(email, p) for p in LOGIN_PERMISSIONS):
            self.require(email, LOGIN_PERMISSIONS[0], f"projects/{project}", "compute.googleapis.com")
        expiry = body.get("expirationTimeUsec")
        if expiry is not None and not re.fullmatch(r"\d+", str(expiry)):  # int64: a string of digits
            raise ApiError(400, "INVALID_ARGUMENT", f"Invalid value at 'ssh_public_key.expiration_time_usec' ({expiry!r})")
        profile.keys[fingerprint(key)] = key
        if expiry is not None:
            profile.expiry[fingerprint(key)] = int(expiry)
        return {"loginProfile": profile.to_json(project)}

    def login_profile(self, principal: str, email: str, project: str) -> dict:
        return self._own_profile(principal, email).to_json(project)

    def login_keys(self, project: str) -> dict[str, list[str]]:
        """POSIX user -> the keys a VM under OS Login in ``project`` accepts for it now."""
        return {p.username: list(p.live_keys().values()) for p in self.profiles.values()
                if p.live_keys() and any(self.allowed(p.email, perm) for perm in LOGIN_PERMISSIONS)}

    def tokeninfo(self, principal: str) -> dict:
        """oauth2 tokeninfo for the caller: its email (what tpunb asks to name the account)."""
        return {"email": principal, "email_verified": "true", "scope": "https://www.googleapis.com/auth/cloud-platform"}
