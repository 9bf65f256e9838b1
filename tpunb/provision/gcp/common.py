"""What both Google APIs tpunb launches through share (Cloud TPU's nodes, Compute Engine's
instances and MIGs): the per-launch token that proves a resource is this launch's, the default
slice name, Google's errors as one line, and the record of a slice whose resources are gone.

The launch token. Every create carries a fresh token: the ``tpunb-launch`` label on a node or an
instance (a MIG's VMs get it from their template), and ``launch=TOKEN`` in the description of what
has no labels in Compute Engine v1 (MIGs, instance templates, resource policies). A failed or
interrupted launch deletes only what carries its own token, and every look that picks a slice's
resources by name (its hosts, the survey, the idle watchdog) matches the token too: another
notebook's slice of the same name, or one's own orphan, is never touched."""
from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

#: the label (nodes, instances) that carries a launch's token
LAUNCH_LABEL = "tpunb-launch"
#: in the description of every MIG, template and policy tpunb makes (they have no labels)
MARKER = "created-by=tpunb"
#: the longest slice name: a MIG's base instance name is at most 58 characters (compute v1) and its
#: VMs add "-xxxx"; ``NAME-tpunb-wp`` must stay within 63
NAME_LIMIT = 54
_DESCRIPTION = re.compile(re.escape(MARKER) + r" slice=(?P<slice>\S+)(?: launch=(?P<launch>\S+))?"
                          r"(?: deadline=(?P<deadline>\d+))?")
_URL_PREFIX = re.compile(r"^[A-Z]+ https?://\S+: ")


def new_launch() -> str:
    """A fresh launch token (8 hex digits: a valid label value and description word)."""
    return secrets.token_hex(4)


@dataclass(frozen=True)
class Marker:
    """What tpunb's description on a MIG, template or policy says: whose slice, which launch made
    it, and (a MIG) the time after which a survey may delete it while it still waits."""

    slice: str
    launch: str | None = None
    deadline: float | None = None

    def text(self) -> str:
        words = [MARKER, f"slice={self.slice}"]
        if self.launch:
            words.append(f"launch={self.launch}")
        if self.deadline:
            words.append(f"deadline={int(self.deadline)}")
        return " ".join(words)


def read_marker(description: str | None) -> Marker | None:
    """tpunb's marker in a description, or None when it has none (not made by tpunb)."""
    found = _DESCRIPTION.match(description or "")
    if found is None:
        return None
    deadline = found["deadline"]
    return Marker(found["slice"], found["launch"], float(deadline) if deadline else None)


def launch_of(resource: Any) -> str | None:
    """The launch token a resource carries: its label, else its description's marker."""
    labels = getattr(resource, "labels", None) or {}
    if labels.get(LAUNCH_LABEL):
        return labels[LAUNCH_LABEL]
    marker = read_marker(getattr(resource, "description", ""))
    return marker.launch if marker is not None else None


def same_launch(resource: Any, launch: str | None) -> bool:
    """The resource is this launch's: its token equals ``launch``. A record made before tokens
    existed (``launch`` None or "") matches any (its name was all there was)."""
    return not launch or launch_of(resource) == launch


def user_part(account: str) -> str:
    """The local part of an account (``alice@example.com``: ``alice``) as a name may hold it:
    lowercase letters, digits and single dashes."""
    local = (account or "").split("@", 1)[0].lower()
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", local)).strip("-")


def default_name(accelerator: str, account: str) -> str:
    """``tpunb-USER-ACCELERATOR``: two people in one project (or one kernel and the next) never
    take each other's default name; the user part is cut so the name stays within NAME_LIMIT."""
    room = NAME_LIMIT - len(f"tpunb--{accelerator}")
    user = user_part(account)[:max(room, 0)].strip("-")
    return f"tpunb-{user}-{accelerator}" if user else f"tpunb-{accelerator}"


def google_message(exc: BaseException) -> str:
    """A google.api_core error's own message, on one line, without the request's method and URL
    that api_core puts in front of it (``POST https://compute.googleapis.com/...: ``)."""
    from tpunb.provision.gcp import errors as gcp_errors

    return _URL_PREFIX.sub("", gcp_errors.from_exception(exc).message)


def gone_record_notice(name: str, where: str) -> str:
    """What a launch says when it takes the name of a recorded slice whose resources are gone."""
    return (f"[tpunb] the record of {name} is replaced: its resources are gone from {where} (deleted elsewhere, "
            "or never made)")
