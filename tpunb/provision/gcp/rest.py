"""The Google APIs tpunb asks besides Cloud TPU: one seam, as ``api`` is for Cloud TPU.

- Compute Engine ``projects.get``: the project's metadata (is OS Login on?).
- Cloud Resource Manager ``projects.testIamPermissions``: which permissions the caller holds.
- OAuth2 ``tokeninfo``: the email of the account behind the credentials.
- OS Login (``google-cloud-os-login``, over REST as the TPU client): import a key, read a profile.

Plain REST through google-auth's ``AuthorizedSession`` for the first three (one call each; no
client library for them). With ``TPUNB_TPU_API_ENDPOINT`` set, every one of them goes to the
emulator's URL instead of Google's hosts, with the same paths; calls there carry no credentials.
"""
from __future__ import annotations

from typing import Any

from tpunb.errors import ProvisionError
from tpunb.provision.gcp import shared
from tpunb.provision.gcp.config import cached, endpoint
from tpunb.provision.gcp import failures as gcp_errors

HOSTS = {"compute": "https://compute.googleapis.com", "crm": "https://cloudresourcemanager.googleapis.com",
         "oauth2": "https://oauth2.googleapis.com", "oslogin": "https://oslogin.googleapis.com",
         "iam": "https://iam.googleapis.com", "quotas": "https://cloudquotas.googleapis.com"}
TIMEOUT = 30.0
ACT_AS = "iam.serviceAccounts.actAs"



def url(service: str, path: str) -> str:
    """The URL of ``path`` on ``service`` (a key of HOSTS), or on the emulator."""
    return (endpoint() or HOSTS[service]) + path


def credentials() -> Any:
    """The credentials every call uses: anonymous against the emulator, else google.auth.default()'s."""
    if endpoint():
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    return shared.default_credentials()


def session() -> Any:
    """An AuthorizedSession (requests) with those credentials, one per endpoint."""
    def make() -> Any:
        from google.auth.transport.requests import AuthorizedSession

        return AuthorizedSession(credentials())

    return cached(("rest session", endpoint() or "google"), make)


class ApiFailure(ProvisionError):
    """A call to one of these APIs failed; ``.status`` is the HTTP status (0: no answer at all)."""

    def __init__(self, message: str, status: int, reason: str = "other") -> None:
        super().__init__(message, reason)
        self.status = status


def call(method: str, service: str, path: str, body: dict | None = None, **params: str) -> dict:
    """One JSON call; an HTTP error or no answer is an ApiFailure whose text is the API's own message."""
    import requests

    try:
        response = session().request(method, url(service, path), json=body, params=params or None, timeout=TIMEOUT)
    except (requests.RequestException, OSError) as exc:
        raise ApiFailure(f"{HOSTS[service].split('//')[1]} did not answer ({gcp_errors.one_line(str(exc), 160)})",
                         0, "unavailable") from None
    if response.status_code >= 400:
        try:
            error = response.json().get("error") or {}
            message = error.get("message") if isinstance(error, dict) else str(error)
        except ValueError:
            message = response.text
        raise ApiFailure(gcp_errors.one_line(message or response.reason, 200), response.status_code,
                         "permission" if response.status_code == 403 else "other")
    return response.json() if response.content else {}


# -- the calls ------------------------------------------------------------------------------


def project_metadata(project: str) -> dict[str, str]:
    """The project's common instance metadata (Compute Engine ``projects.get``)."""
    answer = call("GET", "compute", f"/compute/v1/projects/{project}")
    items = (answer.get("commonInstanceMetadata") or {}).get("items") or []
    return {str(i.get("key")): str(i.get("value", "")) for i in items}


def default_service_account(project: str) -> str | None:
    """The service account a VM runs as when none is named (Compute Engine ``projects.get``)."""
    return call("GET", "compute", f"/compute/v1/projects/{project}").get("defaultServiceAccount") or None


def quota_info(project: str, quota_id: str, service: str = "compute.googleapis.com") -> dict:
    """Cloud Quotas ``quotaInfos.get``: a quota's value per region and dimension (``dimensionsInfos``)."""
    return call("GET", "quotas", f"/v1/projects/{project}/locations/global/services/{service}/quotaInfos/{quota_id}")


def held_permissions(project: str, permissions: list[str]) -> set[str]:
    """Which of ``permissions`` the caller holds in ``project`` (Cloud Resource Manager)."""
    answer = call("POST", "crm", f"/v1/projects/{project}:testIamPermissions", {"permissions": permissions})
    return set(answer.get("permissions") or [])


def may_act_as(account: str) -> bool:
    """Whether the caller holds iam.serviceAccounts.actAs on the service account ``account`` (granted
    on it or inherited from its project: the resource's own test sees both)."""
    answer = call("POST", "iam", f"/v1/projects/-/serviceAccounts/{account}:testIamPermissions",
                  {"permissions": [ACT_AS]})
    return ACT_AS in (answer.get("permissions") or [])


def known_account() -> str | None:
    """The account's email where it is known without a call: a service account's credentials name
    it; a user's is what gcloud is set to (``core/account``)."""
    from tpunb.provision.gcp.config import active_gcloud_config

    try:
        email = getattr(credentials(), "service_account_email", None)
    except ProvisionError:
        email = None
    if email and "@" in email:
        return email
    config = active_gcloud_config()
    return (config.get("core", "account", fallback=None) if config is not None else None) or None


def account_email() -> str | None:
    """The email of the account tpunb calls as: ``known_account()``, else what Google's tokeninfo
    says of the access token (a user's application-default credentials carry the email scope)."""
    email = known_account()
    if email:
        return email
    creds = credentials()
    params = {}
    if not endpoint():
        import google.auth.transport.requests

        if not creds.valid:
            creds.refresh(google.auth.transport.requests.Request())
        params["access_token"] = creds.token
    return call("GET", "oauth2", "/tokeninfo", **params).get("email") or None


def os_login_client() -> Any:
    """google-cloud-os-login's client over REST (HTTP to the emulator, as the TPU client)."""
    from google.cloud import oslogin_v1

    options = {"api_endpoint": endpoint()} if endpoint() else None
    return oslogin_v1.OsLoginServiceClient(transport="rest", credentials=credentials(), client_options=options)


def import_key(email: str, public_key: str, project: str, ttl: float) -> str:
    """Add ``public_key`` to the account's OS Login profile for ``ttl`` seconds (a profile holds at
    most 32 KiB of keys: keys that never expire would fill it); the primary POSIX user name."""
    import time

    from google.cloud.oslogin_v1 import common

    key = common.SshPublicKey(key=public_key.strip(), expiration_time_usec=int((time.time() + ttl) * 1e6))
    answer = os_login_client().import_ssh_public_key(parent=f"users/{email}", project_id=project, ssh_public_key=key)
    accounts = list(answer.login_profile.posix_accounts)
    primary = [a for a in accounts if a.primary] or accounts
    if not primary or not primary[0].username:
        raise ProvisionError(f"OS Login gave {email} no POSIX account in project {project}: run "
                             f"`gcloud compute os-login describe-profile --project {project}` to see it", "os_login")
    return primary[0].username


def own_network(timeout: float = 1.0) -> str | None:
    """The VPC network this machine is in, from its own metadata server (a Google Cloud VM:
    ``projects/NUMBER/networks/NAME``), or None off Google Cloud (no metadata server answers).
    ``$GCE_METADATA_HOST`` (else ``$GCE_METADATA_IP``) moves the server, as they do for google-auth and
    JAX; else its link-local IP."""
    import os
    import urllib.request

    host = os.environ.get("GCE_METADATA_HOST") or os.environ.get("GCE_METADATA_IP") or "169.254.169.254"
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/instance/network-interfaces/0/network",
                                     headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read().decode().strip() or None
    except OSError:
        return None


def check_reaches_vpc(network: str | None) -> str:
    """--internal-ip: the nodes get no external IP, so this machine must be in their VPC network to
    reach them; say so before any node exists, not after SSH retries (network names only: a
    Shared VPC host project's network of the same name passes). Returns the network's name."""
    wanted = (network or "default").rsplit("/", 1)[-1]
    own = own_network()
    if own is None:
        raise ProvisionError(f"--internal-ip: this machine is not a Google Cloud VM (no metadata server answered), so "
                             f"it cannot reach the nodes' internal IPs: launch without --internal-ip, or run the "
                             f"notebook on a VM in network {wanted}", "network")
    if own.rsplit("/", 1)[-1] != wanted:
        raise ProvisionError(f"--internal-ip: this machine is in network {own.rsplit('/', 1)[-1]}, the nodes would be in "
                             f"{wanted}: pass --network {own.rsplit('/', 1)[-1]}, or launch without --internal-ip",
                             "network")
    return wanted
