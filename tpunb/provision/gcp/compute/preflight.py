"""What a Compute Engine launch checks and reads before it makes anything, and how it words a
refusal those facts explain: the first-launch traps of real projects (docs/cloud-facts.md).

Before: the network flags' shapes; the reservation (its zone, its provisioning model); with
--internal-ip, that this machine reaches the VPC and that a Cloud NAT (and, for the idle watchdog,
Private Google Access) gives the VMs a way out; how tpunb logs in (OS Login when the project's
metadata or the organisation's requireOsLogin says so); the organisation's requireShieldedVm.
After a refusal: a quota refusal for a type the Cloud TPU API also makes names that other pool, a
refused provisioning model names the reservation flag, an organisation policy says who lifts it.
"""
from __future__ import annotations

from dataclasses import dataclass

from tpunb import report
from tpunb.errors import ProvisionError
from tpunb.provision.gcp import logins
from tpunb.provision.gcp.compute import network, org_policy, reservations
from tpunb.provision.gcp.compute.zones import other_pool
from tpunb.provision.gcp.config import CloudOptions


@dataclass(frozen=True)
class Preflight:
    zones: list[str]  # the zones to try (a reservation's alone)
    access: logins.Login
    reservation: reservations.Reservation | None = None
    egress: network.Egress | None = None  # --internal-ip only
    org_os_login: bool | None = None  # the organisation's requireOsLogin: None when it could not be read
    subnetwork: str | None = None  # --subnetwork, or a custom network's one subnetwork in the zones' region


def run(project: str, opts: CloudOptions, zones: list[str], public_key: str) -> Preflight:
    """Every check and read before the first create; a one-line error for what cannot work."""
    zones = network.check_paths(opts.network, opts.subnetwork, zones)
    subnetwork, zones = network.choose_subnetwork(project, opts.network, opts.subnetwork, zones)
    reservation = None
    if opts.reservation:
        reservation = reservations.resolve(project, opts.reservation, opts.reservation_bound, opts.no_reservation_bound)
        zones = reservations.zones_for(reservation, zones, bool(opts.zone and opts.zone.strip().lower() != "any"))
        if reservation.decided_by == "default":
            report.info(f"[tpunb] cannot read {reservation.owner}'s future reservations: consuming {reservation.name} "
                        "with standard VMs (--reservation-bound if a future reservation in calendar mode delivered it)")
    egress = None
    if opts.internal_ip:
        egress = network.check_internal_ip(project, zones[0], opts.network, subnetwork, bool(opts.idle_delete))
    access = logins.login(project, public_key, opts.user, service_account=opts.service_account)
    org_os_login = None
    if not access.os_login:
        org_os_login = org_policy.enforced(project, org_policy.REQUIRE_OS_LOGIN)
        if org_os_login:  # the VMs would ignore metadata keys: log in as OS Login has it
            access = logins.login(project, public_key, opts.user, node_metadata={logins.OS_LOGIN_KEY: "TRUE"},
                                  service_account=opts.service_account)
    if org_policy.enforced(project, org_policy.REQUIRE_SHIELDED_VM):
        report.warn(f"[tpunb] {org_policy.shielded_vm_message(project)}; Compute Engine will most likely refuse the VMs")
    return Preflight(zones, access, reservation, egress, org_os_login, subnetwork)


def explain(exc: BaseException, pre: Preflight, accelerator: str, project: str, zones: int) -> None:
    """Reword ``exc`` (a refusal of the create) where these facts say what it means."""
    if not isinstance(exc, ProvisionError):
        return
    text = str(exc)
    said = org_policy.explain(text, project) or reservations.refusal_hint(text, pre.reservation)
    if said:
        exc.args = (f"{said} (Compute Engine said: {text.splitlines()[0]})",)
    elif exc.reason == "quota" and zones == 1:  # several zones: everywhere_failed says it
        exc.args = (f"{text}{other_pool(accelerator)}",)
