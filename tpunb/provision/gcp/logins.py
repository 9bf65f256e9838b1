"""Who tpunb logs in as on a node's VMs: a metadata key for a fixed user, or OS Login, as gcloud does.

Outside OS Login, tpunb's public key goes into the node's ``ssh-keys`` metadata for the user
``tpunb`` (or ``--user``): never the notebook's own login, which in Colab is root. With OS Login on
(``enable-oslogin=TRUE`` in the node's metadata, which wins, else in the project's), VMs ignore
metadata keys (docs/cloud-facts.md). Then, before any node is made, tpunb checks that the account
may log in (roles/compute.osLogin or osAdminLogin), imports its public key into the account's OS
Login profile and logs in as the profile's POSIX user: what ``gcloud compute tpus tpu-vm ssh``
and SkyPilot do. A refusal is one line naming the role and the command that grants it.
"""
from __future__ import annotations

from dataclasses import dataclass

from tpunb import report
from tpunb.errors import ProvisionError
from tpunb.provision.gcp import rest

DEFAULT_USER = "tpunb"
OS_LOGIN_KEY = "enable-oslogin"
LOGIN_PERMISSIONS = ["compute.instances.osLogin", "compute.instances.osAdminLogin"]
#: how long an imported key stays in the OS Login profile; each launch and attach imports it again
KEY_TTL = 30 * 24 * 3600.0


@dataclass(frozen=True)
class Login:
    """How to log in: ``user``, and whether through OS Login (else the node's ssh-keys metadata)."""

    user: str
    os_login: bool = False
    account: str = ""  # the Google account (OS Login's), when it was looked up


def owner() -> str:
    """Who launches, for the tpunb-owner label, without asking the network: the account gcloud
    or the credentials name, else this machine's user."""
    import getpass

    return rest.known_account() or getpass.getuser()


def os_login_enabled(project: str, node_metadata: dict[str, str] | None = None) -> bool:
    """OS Login is on for a node with this metadata in this project. A project whose metadata
    cannot be read (no compute.projects.get) counts as off: an SSH refusal then says what to do."""
    value = (node_metadata or {}).get(OS_LOGIN_KEY)
    if value is None:
        try:
            value = rest.project_metadata(project).get(OS_LOGIN_KEY, "")
        except rest.ApiFailure:
            return False
    return value.strip().upper() == "TRUE"


def grant_command(project: str, email: str, role: str = "roles/compute.osLogin") -> str:
    member = f"serviceAccount:{email}" if email.endswith(".gserviceaccount.com") else f"user:{email}"
    return f"gcloud projects add-iam-policy-binding {project} --member={member} --role={role}"


def login(project: str, public_key: str, user: str | None = None,
          node_metadata: dict[str, str] | None = None, service_account: str | None = None) -> Login:
    """How tpunb logs in to a node of ``project``: through OS Login when it is on (the key is
    imported now, for KEY_TTL), else as ``user`` or ``tpunb`` with the key in the node's metadata.
    Under OS Login a VM that runs as ``service_account`` also needs actAs on it from whoever logs in."""
    if not os_login_enabled(project, node_metadata):
        return Login(user or DEFAULT_USER)
    email = rest.account_email()
    if not email:
        raise ProvisionError(f"OS Login is on in project {project}, and the account behind your credentials has no "
                             "email tpunb can find: run `gcloud config set account EMAIL`", "os_login")
    try:
        held = rest.held_permissions(project, LOGIN_PERMISSIONS)
    except rest.ApiFailure as exc:
        held = set(LOGIN_PERMISSIONS)  # cannot ask: the import (and the VM) will say if it is refused
        report.warn(f"[tpunb] cannot check your OS Login roles in {project} ({exc}); importing the key anyway")
    if not held:
        raise ProvisionError(f"OS Login is on in project {project} and {email} may not log in to its VMs: it needs "
                             f"roles/compute.osLogin (or roles/compute.osAdminLogin); ask a project owner to run "
                             f"`{grant_command(project, email)}`", "permission")
    _check_act_as(project, email, service_account)
    try:
        name = rest.import_key(email, public_key, project, KEY_TTL)
    except ProvisionError:
        raise
    except Exception as exc:  # google.api_core's errors from the OS Login client
        from tpunb.provision.gcp import failures as gcp_errors

        failure = gcp_errors.from_exception(exc)
        if failure.status == "PERMISSION_DENIED":
            raise ProvisionError(f"OS Login refused tpunb's key for {email} in project {project} ({failure.message}): "
                                 f"it needs roles/compute.osLogin; ask a project owner to run "
                                 f"`{grant_command(project, email)}`", "permission") from None
        raise ProvisionError(f"OS Login could not import tpunb's key for {email} ({failure.status}: "
                             f"{failure.message}): retry, or run `gcloud compute os-login ssh-keys add --key-file "
                             "KEY.pub` yourself", "os_login") from None
    if user and user != name:
        report.warn(f"[tpunb] OS Login is on in {project}: logging in as {name}, your account's POSIX user, not {user}")
    return Login(name, os_login=True, account=email)


def _check_act_as(project: str, email: str, account: str | None) -> None:
    """OS Login lets an account onto a VM that runs as a service account (``account``, else the
    project's default) only with iam.serviceAccounts.actAs on it: refused before any node exists,
    naming the role."""
    try:
        account = account or rest.default_service_account(project)
        if account is None:
            return
        allowed = rest.may_act_as(account)
    except rest.ApiFailure as exc:
        report.warn(f"[tpunb] cannot check that {email} may act as {account or 'the default service account'} "
                    f"({exc}); launching anyway")
        return
    if not allowed:
        member = f"serviceAccount:{email}" if email.endswith(".gserviceaccount.com") else f"user:{email}"
        raise ProvisionError(f"OS Login is on in project {project} and the VMs run as {account}, which {email} may not "
                             f"act as: it needs roles/iam.serviceAccountUser on it; ask an owner to run `gcloud iam "
                             f"service-accounts add-iam-policy-binding {account} --member={member} "
                             f"--role=roles/iam.serviceAccountUser`", "permission")
