"""Organisation policies that break a first Compute Engine TPU launch, read where the caller may
read them (Cloud Resource Manager v1 ``projects.getEffectiveOrgPolicy``: the policy in force on the
project, inherited from its folders and organisation), else recognised in the refusal they cause:

- ``constraints/compute.requireOsLogin``: the VMs take logins only through OS Login and ignore
  metadata ``ssh-keys``, even where the project's metadata says nothing of ``enable-oslogin``.
  Enforced: tpunb logs in through OS Login. Unreadable: an SSH refusal of the key the VMs' metadata
  holds is worded "OS Login is probably enforced by your organisation".
- ``constraints/compute.requireShieldedVm``: every new VM must boot with Secure Boot, which Google's
  TPU images do not support (TPU7x guides launch with ``--no-shielded-secure-boot``): one warning
  before anything is made, and Compute Engine's refusal ("Constraint ... violated") said as what
  it means and who can lift it.
"""
from __future__ import annotations

from tpunb.provision.gcp import rest

REQUIRE_OS_LOGIN = "constraints/compute.requireOsLogin"
REQUIRE_SHIELDED_VM = "constraints/compute.requireShieldedVm"


def enforced(project: str, constraint: str) -> bool | None:
    """Whether boolean ``constraint`` is enforced on ``project``; None when it cannot be read (the
    caller lacks orgpolicy.policy.get, or the API is off)."""
    try:
        policy = rest.call("POST", "crm", f"/v1/projects/{project}:getEffectiveOrgPolicy", {"constraint": constraint})
    except rest.ApiFailure:
        return None
    return bool((policy.get("booleanPolicy") or {}).get("enforced"))


def shielded_vm_message(project: str) -> str:
    """What a requireShieldedVm refusal (or the policy read before launching) means, and the fix."""
    return (f"your organisation requires Shielded VM with Secure Boot ({REQUIRE_SHIELDED_VM}) in project {project}, "
            f"and Google's TPU images do not boot with Secure Boot: ask an organisation policy admin to exempt the "
            f"project (`gcloud resource-manager org-policies disable-enforce compute.requireShieldedVm --project "
            f"{project}`)")


def explain(text: str, project: str) -> str | None:
    """A Compute Engine refusal that an organisation policy caused, said as what to do; None otherwise."""
    if REQUIRE_SHIELDED_VM in text:
        return shielded_vm_message(project)
    return None


def os_login_refusal(name: str, project: str, user: str, key_path: str, org_enforced: bool | None) -> str:
    """SSH refused the key in the VMs' ssh-keys metadata: OS Login ignores metadata keys. The
    project's metadata did not turn it on (tpunb read it), so it is the organisation's policy,
    unless that policy was read and is not enforced."""
    from tpunb.provision.gcp import failures as gcp_errors

    if org_enforced is False:
        return gcp_errors.os_login_message(name, project, user, key_path)
    return (f"the hosts of {name} refused SSH as {user} with tpunb's key, which their ssh-keys metadata holds: OS Login "
            f"is probably enforced by your organisation ({REQUIRE_OS_LOGIN}; tpunb could not read the project's "
            f"effective policy), and it ignores metadata keys; ask an admin for roles/orgpolicy.policyViewer, or run "
            f"`gcloud compute os-login ssh-keys add --key-file {key_path}.pub` and relaunch with --user set to your "
            "OS Login user name")
