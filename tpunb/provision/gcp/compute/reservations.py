"""``--reservation``: which reservation a launch consumes, where it is, and how its VMs must say so.

A reservation is zonal, so its zone is read first (``reservations.aggregatedList`` of the project
that owns it, filtered on its name) and only that zone is tried. ``NAME`` is one of the launching
project's; ``projects/OWNER/reservations/NAME`` is a shared one, read in the owner's project and
named that way in the VMs' ``reservationAffinity`` (gcloud's forms).

A reservation that a future reservation in calendar mode delivered takes VMs of the
reservation-bound provisioning model only: ``provisioningModel: RESERVATION_BOUND``,
``instanceTerminationAction: DELETE``, ``automaticRestart: false``, ``onHostMaintenance:
TERMINATE`` (tpu/docs/consume-reservation: "Only required for calendar mode";
compute/docs/instances/about-reservation-bound-vms; field reports of TPU7x launches). It is
recognised in ``futureReservations.aggregatedList``: one whose ``reservationName`` is the
reservation's name (or whose ``namePrefix`` starts it) with ``reservationMode: CALENDAR``. Where
that list is refused, ``--reservation-bound`` / ``--no-reservation-bound`` decide (standard VMs
without either), and Compute Engine's refusal of the wrong model becomes that hint.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from tpunb.errors import ProvisionError, UsageError
from tpunb.provision.gcp.compute import clients

_SHARED = re.compile(r"^projects/(?P<owner>[a-z][-a-z0-9.:]*[a-z0-9])/reservations/(?P<name>[a-z]([-a-z0-9]*[a-z0-9])?)$")
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class Reservation:
    name: str
    owner: str  # the project that holds it
    zone: str | None  # None: not known (its list was refused)
    bound: bool  # consumed by RESERVATION_BOUND VMs
    decided_by: str  # "calendar" (read), "flag", or "default" (standard, not known)

    def affinity_value(self, project: str) -> str:
        """How the VMs name it: its name in its own project, else the shared path."""
        return self.name if self.owner == project else f"projects/{self.owner}/reservations/{self.name}"


def parse(given: str, project: str) -> tuple[str, str]:
    """(owner project, name) of ``--reservation NAME`` or ``projects/OWNER/reservations/NAME``."""
    value = given.strip()
    found = _SHARED.match(value)
    if found:
        return found["owner"], found["name"]
    if _NAME.match(value):
        return project, value
    raise UsageError(f"--reservation {given}: give a reservation's name, or a shared one as "
                     "projects/OWNER_PROJECT/reservations/NAME")


def resolve(project: str, given: str, reservation_bound: bool, no_reservation_bound: bool) -> Reservation:
    """The reservation, its zone and its provisioning model, read before anything is made."""
    owner, name = parse(given, project)
    zone = _zone(owner, name)
    if reservation_bound or no_reservation_bound:
        return Reservation(name, owner, zone, reservation_bound, "flag")
    calendar = _calendar(owner, name)
    return Reservation(name, owner, zone, bool(calendar), "calendar" if calendar is not None else "default")


def zones_for(reservation: Reservation, zones: list[str], named: bool) -> list[str]:
    """The zones to try: the reservation's alone (``named``: the user gave --zone, which must hold it)."""
    if reservation.zone is None:
        return zones
    if named and reservation.zone not in zones:
        raise UsageError(f"reservation {reservation.name} is in zone {reservation.zone}, not "
                         f"{', '.join(zones)}: launch with --zone {reservation.zone} (or without --zone)")
    return [reservation.zone]


def _zone(owner: str, name: str) -> str | None:
    """The zone of reservation ``name`` of project ``owner``; None when the list is refused (the
    launch then tries its zones as given); a reservation nowhere is one line."""
    try:
        found = clients.call(f"list the reservations of {owner}", lambda: [
            scope.split("/", 1)[-1] for scope, scoped in clients.client("ReservationsClient").aggregated_list(
                request={"project": owner, "filter": f"name = {name}"})
            for r in scoped.reservations if r.name == name])
    except ProvisionError:
        return None
    if not found:
        raise ProvisionError(f"project {owner} has no reservation {name}: check its name (gcloud compute reservations "
                             f"list --project {owner})", reason="invalid")
    return found[0]


def _calendar(owner: str, name: str) -> bool | None:
    """Whether a future reservation in calendar mode delivers reservation ``name`` (None: the list
    was refused, so it is not known)."""
    try:
        futures = clients.call(f"list the future reservations of {owner}", lambda: [
            f for _, scoped in clients.client("FutureReservationsClient").aggregated_list(request={"project": owner})
            for f in scoped.future_reservations])
    except ProvisionError:
        return None
    for future in futures:
        named = future.reservation_name == name or bool(future.name_prefix and name.startswith(future.name_prefix))
        if named and future.reservation_mode == "CALENDAR":
            return True
    return False


def refusal_hint(text: str, reservation: Reservation | None) -> str | None:
    """Compute Engine refused the provisioning model the reservation needs: the flag that fixes it."""
    if reservation is None or not re.search(r"RESERVATION_BOUND|provisioning ?model", text, re.IGNORECASE):
        return None
    if reservation.bound:
        return (f"reservation {reservation.name} does not take reservation-bound VMs (no future reservation in calendar "
                "mode delivered it): relaunch with --no-reservation-bound")
    return (f"reservation {reservation.name} takes only reservation-bound VMs (a future reservation in calendar mode "
            "delivered it): relaunch with --reservation-bound")
