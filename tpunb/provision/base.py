"""The backend contract: what local, ssh and gcp each offer, the one launch request record, and
the one record of what a backend made (``Made``), which the SliceManager starts the same way for all.

Callers pick a backend module by a slice's backend name (``provision.backend(name)``) and call
these members only, so nothing outside a backend branches on its name. What only some backends
can do is an optional capability (``OPTIONAL``), which a backend declares in ``CAPABILITIES`` and
callers ask for with ``provision.supports`` (as SkyPilot's provisioners answer ``supports()``).
tests/test_backends.py calls every member on each backend, and checks each declared capability.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from tpunb.catalog import Accelerator
    from tpunb.registry import Registry, SliceRecord
    from tpunb.slice import Node, Slice
    from tpunb.status import SliceStatus
    from tpunb.transport.seam import Transport

#: what a cloud survey found: {(project, zone): {node name: the backend's record of the node}};
#: places not listed are absent
Nodes = dict[tuple[str, str], dict[str, Any]]

#: optional capabilities: name -> the members a backend that declares it has
OPTIONAL = {
    # survey(records, reg) -> Survey: its slices' nodes seen in one look, and nodes no record holds
    "survey": ("survey",),
    # delete_orphan(name, reg) -> bool: delete a node of its own that no record holds
    "orphans": ("delete_orphan",),
    # adopt(name, reg) -> SliceRecord | None: a slice of its own that no record here holds (a wiped
    # notebook machine), found in the cloud and its record rebuilt and saved
    "adopt": ("adopt",),
    # recover(record, reg) -> (accelerator, options, env keys, slices): a lost slice deleted, to launch again
    "recover": ("recover",),
    # cloud_place(record) -> (project, zone): where a slice of it lives in the cloud (%tpu_doctor's checks);
    # default_place(project, zone) -> (project, zone): where a launch goes when not told (config, gcloud)
    "cloud": ("cloud_place", "default_place"),
    # doctor_checks() -> [(label, fn)]: %tpu_doctor's checks of its own (credentials, API, quota), run first
    "doctor": ("doctor_checks",),
    # option_flags() -> [dataclasses.Field]: its launch options, which %tpu_launch offers as --flags
    "flags": ("option_flags",),
    # local_transports(record) -> transports reaching its hosts on this machine, from any process
    "hosts_here": ("local_transports",),
}


class Survey(Protocol):
    """What a surveying backend saw in one look (one list call per place)."""

    nodes: Nodes

    def refresh(self, record: "SliceRecord", node: Any) -> None:
        """Give an attached slice's node what the survey saw of it."""

    def orphans(self, known: set[str]) -> list:
        """Its nodes that no record in ``known`` holds (``status.OrphanStatus``), still billed."""


@dataclass
class LaunchRequest:
    """One slice to make: the same record for every backend."""

    name: str
    accelerator: "Accelerator | None"  # None: SSH hosts whose accelerator was not given
    registry: "Registry"
    env: dict[str, str] = field(default_factory=dict)  # --env values: memory only, never stored
    options: Any = None  # the backend's own options record, from its ``options(**given)``
    slices: int = 1  # a multislice: this many slices of ``accelerator`` in one JAX job


@dataclass
class Made:
    """What a backend made (``create``) or found again (``attach``) for a slice: its record with its
    hosts, a transport to each (agents not started), what each host's agent is told at start, how
    JAX's coordinator port is picked, and the cloud node if there is one. The SliceManager makes
    the Slice of it and starts every slice the same way; the hooks are the backend's part in that."""

    record: "SliceRecord"
    transports: "list[Transport]"
    #: (host index, coordinator port) -> the agent's init settings (environment, JAX, cwd)
    host_init: Callable[[int, int], dict]
    coordinator_port: Callable[[], int]
    node: "Node | None" = None
    #: once every host is up, before the slice is recorded as running: a launch's last checks
    check: "Callable[[Slice], None] | None" = None
    #: the start failed or was interrupted (hosts already closed): undo what the backend made and
    #: say so; it may raise an error of its own in place of the one it was given
    failed: Callable[[BaseException], None] | None = None
    #: say the slice is ready (None: the manager's one line)
    ready: Callable[[], None] | None = None


@runtime_checkable
class Backend(Protocol):
    """A way to make hosts. Modules satisfy it (provision.local, provision.ssh, provision.gcp)."""

    NAME: str
    #: the optional capabilities it has (keys of OPTIONAL)
    CAPABILITIES: frozenset[str]

    def options(self, **given: Any) -> Any:
        """The backend's options record from keyword options; a one-line UsageError for unknown ones."""

    def default_name(self, accelerator: "Accelerator | None") -> str:
        """The name a new slice gets when none is given (before -2, -3 ... for uniqueness)."""

    def create(self, request: LaunchRequest) -> Made:
        """Make the hosts (a cloud node, host processes, or hosts you bring checked) and reach them;
        the SliceManager starts their agents and records the slice (owned by this kernel)."""

    def attach(self, record: "SliceRecord", reg: "Registry", env: dict[str, str]) -> Made:
        """A recorded slice's hosts again, reached, agents not started."""

    def delete(self, record: "SliceRecord", force: bool = False) -> None:
        """Delete what outlives the host processes (a cloud node); idempotent. ``force``: also
        what another live kernel holds (the sidebar's delete), where the backend can."""

    def record_transports(self, record: "SliceRecord", reg: "Registry", indices: list[int]) -> dict[int, Any]:
        """{host: a transport to it, or one line saying why none could be made}, from the record
        alone (another process's slice: its stacks from a terminal); hosts are reached in parallel."""

    def name_reusable(self, record: "SliceRecord") -> bool:
        """A new slice may take this recorded slice's name."""

    def slice_status(self, record: "SliceRecord", nodes: Nodes) -> "SliceStatus":
        """The recorded slice's state, hosts and price, as every view shows it."""
