"""How a Cloud TPU launch is configured: its options (one dataclass, which the magic, the API,
the launch flow and the node spec all use), and the project and zone when the user did not say.

Order, first hit wins for each of the two: explicit arguments (the magic's --project/--zone),
the environment (GOOGLE_CLOUD_PROJECT or CLOUDSDK_CORE_PROJECT, CLOUDSDK_COMPUTE_ZONE), then
gcloud's own configuration files, read directly (no gcloud subprocess: it takes a second and
may not be installed). $CLOUDSDK_CONFIG moves gcloud's directory, as it does for gcloud.
"""

from __future__ import annotations

import configparser
import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from tpunb.errors import ProvisionError, UsageError
from tpunb.machine.cache import cached  # noqa: F401 (imported from here by gcp/)
from tpunb.units import format_duration, parse_duration  # noqa: F401 (imported from here by gcp/)


IDLE_DELETE_ENV = "TPUNB_IDLE_DELETE"
#: the two APIs that make TPU slices: the Cloud TPU API (tpu_v2, bug fixes only) and Compute Engine
APIS = ("tpu", "compute")
ENDPOINT_ENV = "TPUNB_TPU_API_ENDPOINT"


def endpoint() -> str | None:
    """The API endpoint override (the emulator's URL), or None for the real API."""
    value = os.environ.get(ENDPOINT_ENV, "").strip()
    if not value:
        return None
    return value if "://" in value else f"http://{value}"


def _option(help: str | None = None, flag: bool = True, **kw):
    """A dataclass field with the help text %tpu_launch shows (``flag=False``: API only)."""
    return field(metadata={"help": help, "flag": flag}, **kw)


@dataclass(kw_only=True)
class CloudOptions:
    """Everything a Cloud TPU launch can be told besides the accelerator, its name and --env."""

    project: str | None = _option("Google Cloud project (default: GOOGLE_CLOUD_PROJECT, then gcloud's config)",
                                  default=None)
    zone: str | None = _option("zone, or Z1,Z2,... tried in that order, or any: every zone offering the type, "
                               "nearest first (default: CLOUDSDK_COMPUTE_ZONE, then gcloud's config)", default=None)
    race: int | None = _option("with several zones: wait for capacity in N zones at once (queued resources); "
                               "the first granted wins, the others are deleted", default=None)
    alternatives: str | None = _option("T1,T2: other accelerator types with the same host count to try after "
                                       "ACCELERATOR, in the same zones", default=None)
    api: str | None = _option("tpu or compute: the API that makes the slice (default by type: Compute Engine for "
                              "TPU7x, v6e and v5p, the Cloud TPU API for the others)", default=None)
    spot: bool = _option("spot capacity: cheaper, may be preempted", default=False)
    runtime: str | None = _option("TPU runtime version (default: the generation's usual one)", default=None)
    queued: bool = _option("create through a queued resource (waits for capacity)", default=False)
    flex: float | None = _option("Compute Engine flex-start: wait for capacity (up to --timeout, else 2 h), then run "
                                 "at most HOURS (10 minutes to 7 days); deleted after", default=None)
    reservation: str | None = _option("Compute Engine: use the capacity of reservation NAME, or of a shared one, "
                                      "projects/OWNER/reservations/NAME (its zone is found)", default=None)
    reservation_bound: bool = _option("with --reservation: consume it as RESERVATION_BOUND VMs (a future reservation "
                                      "in calendar mode); default: asked of Compute Engine", default=False)
    no_reservation_bound: bool = _option("with --reservation: consume it as standard VMs, without asking",
                                         default=False)
    disk_size: float | None = _option("Compute Engine: each VM's boot disk in GB (default 200)", default=None)
    network: str | None = _option("VPC network", default=None)
    subnetwork: str | None = _option("VPC subnetwork", default=None)
    service_account: str | None = _option("service account email for the TPU VMs", default=None)
    labels: dict[str, str] = _option("k=v,k=v added to the node's labels", default_factory=dict)
    internal_ip: bool = _option("no external IPs: connect to the internal ones", default=False)
    timeout: float | None = _option("give up (and delete the node) if not READY after S seconds", default=None)
    user: str | None = _option("SSH user on the TPU VMs (default: yours)", default=None)
    python: str | None = _option("the hosts' Python, X.Y, in the environment tpunb makes on each (default: this "
                                 "notebook's); with --no-setup, the interpreter on the VMs (default: python3)",
                                 default=None)
    jax: str | None = _option("jax version in the hosts' environment (default: this notebook's, when the hosts' "
                              "Python can have it; else the newest)", default=None)
    pip: str | None = _option("\"PKG PKG==V ...\" more packages for the hosts' environment", default=None)
    requirements: str | None = _option("a requirements file on this machine, installed into the hosts' environment",
                                       default=None)
    no_setup: bool = _option("make no environment: use the VMs' Python as it is (an image with your framework)",
                             default=False)
    keep: bool = _option("keep the node when its hosts cannot be prepared or reached, to look at it (it bills "
                         "until it is deleted)", default=False)
    idle_delete: str | float | None = _option(
        "delete the node after this long without a cell or an attached kernel, e.g. 30m, 2h, 90s; a "
        "watchdog on the slice does it, even if this kernel dies (0 or off: never; default: "
        f"${IDLE_DELETE_ENV} or off)", default=None)
    connect_wait: float = _option(flag=False, default=180.0)  # how long new VMs may take to start sshd
    idle_delete_given: bool = _option(flag=False, default=False)  # said by --idle-delete or $TPUNB_IDLE_DELETE

    def __post_init__(self) -> None:
        self.labels = parse_labels(self.labels)
        if self.api is not None and self.api not in APIS:
            raise UsageError(f"--api {self.api}: give tpu (the Cloud TPU API) or compute (Compute Engine)")
        if isinstance(self.zone, (list, tuple)):  # the Python API: zone=["us-east5-a", "us-central1-a"]
            self.zone = ",".join(self.zone)
        if isinstance(self.alternatives, (list, tuple)):
            self.alternatives = ",".join(self.alternatives)
        if self.race is not None:
            given = self.race
            try:
                self.race = int(given)
            except (TypeError, ValueError):
                self.race = 0
            if self.race < 1 or isinstance(given, bool):
                raise UsageError(f"--race takes how many zones to wait in at once, e.g. --race 3, not {given!r}")
        if self.flex is not None:
            try:
                hours = float(self.flex)
            except (TypeError, ValueError):
                hours = 0.0
            if not 1 / 6 <= hours <= 168 or isinstance(self.flex, bool):
                raise UsageError(f"--flex {self.flex}: give the hours a flex-start slice may run, from 0.17 (10 "
                                 "minutes) to 168 (7 days)")
            self.flex = hours
        if self.flex is not None and (self.spot or self.reservation):
            raise UsageError(f"--flex is its own capacity: launch it without --{'spot' if self.spot else 'reservation'}")
        if self.spot and self.reservation:  # compute/docs/instances/reservations-consume, "Limitations"
            raise UsageError("--spot with --reservation: Compute Engine cannot consume a reservation with Spot VMs; drop "
                             "--spot (the reservation's capacity is yours) or --reservation")
        if (self.reservation_bound or self.no_reservation_bound) and not self.reservation:
            raise UsageError(f"--{'no-' if self.no_reservation_bound else ''}reservation-bound goes with --reservation "
                             "NAME: it says how to consume that reservation")
        if self.reservation_bound and self.no_reservation_bound:
            raise UsageError("--reservation-bound or --no-reservation-bound, not both")
        if self.disk_size is not None:
            try:
                size = float(self.disk_size)
            except (TypeError, ValueError):
                size = 0.0
            if not 10 <= size <= 65536 or isinstance(self.disk_size, bool) or size != int(size):
                raise UsageError(f"--disk-size {self.disk_size}: give the boot disk's size in GB, a whole number from 10 "
                                 "to 65536 (default 200)")
            self.disk_size = int(size)
        if self.idle_delete is not None or os.environ.get(IDLE_DELETE_ENV, "").strip():
            self.idle_delete_given = True
        if self.idle_delete is None:
            self.idle_delete = parse_duration(os.environ.get(IDLE_DELETE_ENV), f"${IDLE_DELETE_ENV}", off=True)
        else:
            self.idle_delete = parse_duration(self.idle_delete, "--idle-delete", off=True)

    @classmethod
    def from_kwargs(cls, given: dict) -> "CloudOptions":
        """Options from keyword arguments; an unknown name is a one-line error naming close ones."""
        names = [f.name for f in dataclasses.fields(CloudOptions)]
        unknown = sorted(set(given) - set(names))
        if unknown:
            close = difflib.get_close_matches(unknown[0], names, n=2)
            hint = f" (did you mean {' or '.join(close)}?)" if close else f"; options: {', '.join(names)}"
            raise UsageError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for backend "
                             f"gcp{hint}")
        return cls(**{k: v for k, v in given.items() if v is not None})

    @classmethod
    def flags(cls) -> list[dataclasses.Field]:
        """The fields %tpu_launch offers as --flags."""
        return [f for f in dataclasses.fields(CloudOptions) if f.metadata.get("flag")]


def parse_labels(labels: str | dict | None) -> dict[str, str]:
    """'team=ml,run=7' -> {'team': 'ml', 'run': '7'}."""
    if not labels:
        return {}
    if isinstance(labels, dict):
        return {str(k): str(v) for k, v in labels.items()}
    out = {}
    for pair in labels.split(","):
        key, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"[a-z][-_a-z0-9]{0,62}", key.strip()):
            raise UsageError(f"--labels takes k=v,k=v with lowercase keys, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def gcloud_config_dir() -> Path:
    """gcloud's configuration directory: $CLOUDSDK_CONFIG or ~/.config/gcloud."""
    return Path(os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")


def active_gcloud_config() -> configparser.ConfigParser | None:
    """The active gcloud configuration (``configurations/config_NAME``), or None if absent."""
    base = gcloud_config_dir()
    name = os.environ.get("CLOUDSDK_ACTIVE_CONFIG_NAME", "").strip()
    if not name:
        try:
            name = (base / "active_config").read_text(encoding="utf-8").strip()
        except OSError:
            name = ""
    path = base / "configurations" / f"config_{name or 'default'}"
    parser = configparser.ConfigParser(interpolation=None)
    try:
        if not parser.read(path, encoding="utf-8"):
            return None
    except configparser.Error:
        return None
    return parser


def resolve_project_zone(
    project: str | None = None, zone: str | None = None
) -> tuple[str | None, str | None]:
    """(project, zone) from arguments, then environment, then gcloud's config; None where unknown."""
    project = (
        project or os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT") or None
    )
    zone = zone or os.environ.get("CLOUDSDK_COMPUTE_ZONE") or None
    if project is None or zone is None:
        config = active_gcloud_config()
        if config is not None:
            project = project or config.get("core", "project", fallback=None) or None
            zone = zone or config.get("compute", "zone", fallback=None) or None
    return project, zone


def user_region() -> str | None:
    """The region the user works from: CLOUDSDK_COMPUTE_REGION, gcloud's compute/region, or the
    region of their default zone; None when none is known."""
    region = os.environ.get("CLOUDSDK_COMPUTE_REGION") or None
    if region is None:
        config = active_gcloud_config()
        region = config.get("compute", "region", fallback=None) if config is not None else None
    if region is None:
        zone = resolve_project_zone(None, None)[1]
        region = zone.rsplit("-", 1)[0] if zone and "," not in zone and zone != "any" else None
    return region or None


def require_project_zone(project: str | None = None, zone: str | None = None) -> tuple[str, str]:
    """Like resolve_project_zone, but a missing one is a one-line ProvisionError saying how to set it."""
    project, zone = resolve_project_zone(project, zone)
    if project is None:
        from tpunb import colab

        if colab.in_colab():
            raise ProvisionError(f"no Google Cloud project: pass --project, or {colab.SIGN_IN}")
        raise ProvisionError(
            "no Google Cloud project: pass --project, set GOOGLE_CLOUD_PROJECT, "
            "or run `gcloud config set project PROJECT`"
        )
    if zone is None:
        raise ProvisionError(
            "no zone: pass --zone, set CLOUDSDK_COMPUTE_ZONE, or run `gcloud config set compute/zone ZONE`"
        )
    return project, zone


#: in Colab, a slice nobody runs cells on is deleted after this long unless --idle-delete says otherwise
COLAB_IDLE_DEFAULT = 3600.0


def colab_idle_default(opts: CloudOptions, slices: int) -> CloudOptions:
    """In Colab a runtime is recycled with the notebook machine's files: a slice nobody runs cells on
    is deleted after COLAB_IDLE_DEFAULT unless --idle-delete (or $TPUNB_IDLE_DELETE) said otherwise."""
    from tpunb import colab, report

    if opts.idle_delete or opts.idle_delete_given or slices > 1 or not colab.in_colab():
        return opts
    report.info(f"[tpunb] in Colab, idle autodelete is on by default: the node is deleted after "
                f"{format_duration(COLAB_IDLE_DEFAULT)} without a cell (--idle-delete D changes it, --idle-delete off "
                "keeps it)")
    return dataclasses.replace(opts, idle_delete=COLAB_IDLE_DEFAULT, idle_delete_given=True)
