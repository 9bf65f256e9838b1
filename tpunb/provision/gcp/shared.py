"""What both Google APIs tpunb launches through share (Cloud TPU's nodes, Compute Engine's
instances and MIGs), so that neither handler (tpu/, compute/) reaches into the other: the
per-launch token that proves a resource is this launch's, the labels and metadata every slice
carries, the default slice name, credentials, the pause between polls, the places a launch tries
and how each try ended, how long a connect waits for a key, prices, and Google's errors as one
line. (The launch options and default place are config.py's, failures errors.py's, logins
logins.py's: each is its own topic, and both handlers import them as they import this.)

The launch token. Every create carries a fresh token: the ``tpunb-launch`` label on a node or an
instance (a MIG's VMs get it from their template), and ``launch=TOKEN`` in the description of what
has no labels in Compute Engine v1 (MIGs, instance templates, resource policies). A failed or
interrupted launch deletes only what carries its own token, and every look that picks a slice's
resources by name (its hosts, the survey, the idle watchdog) matches the token too: another
notebook's slice of the same name, or one's own orphan, is never touched."""
from __future__ import annotations

import itertools
import re
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tpunb.errors import ProvisionError
from tpunb.provision import interrupts
from tpunb.provision.gcp import failures as gcp_errors
from tpunb.provision.common import list_price, price_per_hour  # noqa: F401 - the handlers' prices
from tpunb.provision.gcp.config import endpoint
from tpunb.registry import SliceRecord

#: how long a launch waits for its slice (per zone) when --timeout does not say
DEFAULT_TIMEOUT = 1200.0

# Labels (what a survey filters on, and what survives a wiped notebook machine), on nodes and
# instances alike; metadata keys every slice's VMs carry.
TPUNB_LABELS: Mapping[str, str] = {"created-by": "tpunb"}
NAME_LABEL, OWNER_LABEL, IDLE_LABEL = "tpunb-name", "tpunb-owner", "tpunb-idle"
SLICE_METADATA = "tpunb-slice"  # what %tpu_use needs to rebuild the slice's record from its VMs
IDLE_ATTRIBUTE = "tpunb-idle"  # the idle watchdog's settings (tpunb/host/standalone/idle.py)
SSH_PORT_LABEL = "tpunb-ssh-port"  # set by the sandbox when its sshd is not on port 22
IAM_ENDPOINT = "https://cloudresourcemanager.googleapis.com"  # where the idle watchdog asks its permissions

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


def label_value(text: str) -> str:
    """``text`` as a label value may be: lowercase letters, digits, - and _, at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]", "_", str(text).lower())[:63]


def default_credentials() -> Any:
    """google.auth.default()'s credentials, or the one-line ProvisionError saying how to get some."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except DefaultCredentialsError:
        raise ProvisionError(gcp_errors.credentials_message(), "credentials") from None
    return credentials


def poll_delays() -> Iterator[float]:
    """Seconds between polls: short against the sandbox, backing off against the real APIs."""
    if endpoint():
        return itertools.repeat(0.02)
    return (min(10.0, 1.0 * 1.5**i) for i in itertools.count())


def pause(seconds: float) -> None:
    """The deliberate wait between polls (a seam the provisioning benchmark measures); a Ctrl-C
    that Python dropped while the last poll ran is raised here."""
    interrupts.check()
    time.sleep(seconds)
    interrupts.check()


#: a --zone that means every zone offering the type, nearest region first
ANY = "any"
#: failures that concern the whole project: trying another zone cannot help
PROJECT_WIDE = frozenset({"credentials", "api_disabled"})
#: what each failure kind is called on the launch line
LABELS = {"no_capacity": "no capacity", "quota": "quota exceeded", "permission": "permission denied",
          "timeout": "timed out", "preempted": "preempted while created", "invalid_zone": "zone unknown",
          "invalid_accelerator": "type not offered", "already_exists": "name taken"}


@dataclass(frozen=True)
class Candidate:
    """One place to try: an accelerator type in a zone."""

    accelerator: str
    zone: str

    def __str__(self) -> str:
        return f"{self.zone} {self.accelerator}"


@dataclass(frozen=True)
class Outcome:
    """How one try ended: ``kind`` is "granted" or a failure kind (no_capacity, quota, ...)."""

    candidate: Candidate
    kind: str
    detail: str = ""

    def __str__(self) -> str:
        label = LABELS.get(self.kind, self.kind.replace("_", " "))
        if self.kind == "timeout" and "WAITING_FOR_RESOURCES" in self.detail:
            label = "no capacity came free before --timeout"
        if self.kind == "cancelled":  # lost the race: what it was doing when it was deleted
            label = f"{self.detail or 'not started'}, deleted"
        if self.kind == "skipped":
            label = f"not tried: {self.detail}"
        known = self.kind in LABELS or self.kind in ("granted", "cancelled", "skipped")
        return f"{self.candidate}: {label}" + ("" if known or not self.detail else f" ({self.detail})")


#: how long a key %tpu_use gave an adopted slice's VMs may take to reach them
KEY_PROPAGATION = 120.0
KEY_ADDED = "key_added_at"  # in a record's spec: when adopt added the key


def connect_wait(record: SliceRecord) -> float:
    """How long a connect retries: while a key adopt added may still be on its way to the VMs."""
    added = float(record.spec.get(KEY_ADDED) or 0)
    return max(0.0, added + KEY_PROPAGATION - time.time())


def unknown(why: str) -> str:
    """The state of a slice its API could not be asked about, with why, on one line."""
    return f"UNKNOWN ({gcp_errors.one_line(why, 160)})"


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
    return _URL_PREFIX.sub("", gcp_errors.from_exception(exc).message)


def gone_record_notice(name: str, where: str) -> str:
    """What a launch says when it takes the name of a recorded slice whose resources are gone."""
    return (f"[tpunb] the record of {name} is replaced: its resources are gone from {where} (deleted elsewhere, "
            "or never made)")
