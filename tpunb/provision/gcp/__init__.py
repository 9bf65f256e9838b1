"""The ``gcp`` backend: Cloud TPU slices, made through the Cloud TPU API or Compute Engine.

One registry backend, so every record keeps working, with two handlers behind one interface
(choice.py): ``tpu/`` (nodes and queued resources) and ``compute/`` (instances and BULK MIGs,
the API Google builds TPU7x on). The handler is chosen once per launch (``--api`` or the type's
default) and read from the record ever after. What both use is in ``shared`` (launch tokens,
labels, credentials, polling, places, prices), ``config`` (options, project and zone), ``errors``
(failures as one line), ``logins``, ``rest``, ``prepare`` and ``watch``; the launch's order of steps
is the provision layer's one driver (tpunb/provision/launching.py).

``survey`` lists both APIs at once for %tpu_status, which is also how slices this registry does not
know (orphans, still billed) are found.
"""
from __future__ import annotations

import dataclasses
import time

from tpunb import catalog, report
from tpunb.errors import ProvisionError, TpunbError
from tpunb.transport.fanout import fan_out
from tpunb.provision import launching, ssh, warm
from tpunb.provision.base import LaunchRequest, Made, Nodes
from tpunb.provision.common import owner_alive
from tpunb.provision.gcp import choice, logins, shared, tpu
from tpunb.provision.gcp import failures as gcp_errors
from tpunb.provision.gcp.config import CloudOptions, resolve_project_zone
from tpunb.provision.gcp.shared import list_price
from tpunb.registry import Registry, SliceRecord
from tpunb.slice import Node
from tpunb.status import OrphanStatus, SliceStatus

NAME = "gcp"
#: how the sidebar names it, and what deleting a slice of it does
LABEL = "gcp (Cloud TPU)"
ENDS = "its Cloud TPU node is deleted and billing stops"
CAPABILITIES = frozenset({"survey", "orphans", "adopt", "recover", "cloud", "doctor", "flags"})
#: a slice whose launch has not finished (or was cut off): one wording everywhere
CREATING = "being created (or its launch was cut off: %tpu_down deletes it)"
#: a failover's record, while it launches: every zone it may have made something in
TRIED = tpu.TRIED
#: in a survey's nodes, (project, UNREACHED) -> {"tpu" | "compute": why that API could not be listed}
UNREACHED = tpu.UNREACHED


def default_name(accelerator: catalog.Accelerator) -> str:
    """``tpunb-USER-TYPE`` (common.default_name): two people in one project never share one. The
    user is read from the credentials: their modules are imported on the warm-up thread first,
    where a Ctrl-C cannot cut an import half-way (tpunb.provision.warm)."""
    warm.ready()
    return shared.default_name(accelerator.name, logins.owner())


def options(**given) -> CloudOptions:
    return CloudOptions.from_kwargs(given)


def option_flags() -> list[dataclasses.Field]:
    """The launch options %tpu_launch offers as --flags (CloudOptions' fields with help)."""
    return CloudOptions.flags()


def default_place(project: str | None, zone: str | None) -> tuple[str | None, str | None]:
    """The project and zone a launch uses when not told: flags, environment, gcloud's config."""
    return resolve_project_zone(project, zone)


def doctor_checks() -> list:
    """%tpu_doctor's Cloud TPU checks: credentials, project, the API, quota, the zone's types."""
    from tpunb.provision.gcp import doctor

    return list(doctor.CHECKS)


#: the workers are SSH hosts: a transport to each from the record alone, as hosts you bring
record_transports = ssh.record_transports


def configured() -> bool:
    """A Google Cloud project is configured (flag, environment or gcloud): launches go to Cloud TPU."""
    return resolve_project_zone(None, None)[0] is not None


def create(request: LaunchRequest) -> Made:
    """Make the slice through its API's handler, in the launch driver's order: the record first,
    progress, rollback on failure or Ctrl-C, SSH to every host, the ready line (launching.py).

    ``slices``: a multislice, one queued resource for that many nodes (``{name}-0``, ...), ready
    when all are; its workers are one slice here, numbered node by node."""
    opts: CloudOptions = request.options or CloudOptions()
    _replace_gone(request.registry.get_slice(request.name))
    handler = choice.for_launch(request.accelerator, opts)
    return launching.launch(handler.plan(request, opts), request)


def recorded_options(record: SliceRecord) -> CloudOptions:
    """The options a slice was launched with, from its record (for --recover)."""
    names = {f.name for f in dataclasses.fields(CloudOptions)}
    return CloudOptions(**{k: v for k, v in record.spec.items() if k in names and v is not None})


def adopt(name: str, reg: Registry) -> SliceRecord | None:
    """A slice of this project no record here holds (a Colab reset): its record rebuilt and saved by
    the first handler that has it (a Cloud TPU node's, else a Compute Engine slice's); None when
    neither has it. An API that cannot be asked (the Cloud TPU API, not enabled in a project that
    uses only Compute Engine) is said only when no other has such a slice either."""
    refused = None
    for handler in choice.in_order():
        if not handler.listed():
            continue
        try:
            record = handler.adopt(name, reg)
        except ProvisionError as exc:
            if exc.reason == "lost":
                raise
            refused = refused or exc
            continue
        if record is not None:
            return record
    if refused is not None:
        raise refused
    return None


def attach(record: SliceRecord, reg: Registry, env: dict[str, str]) -> Made:
    """The slice's hosts over SSH (agents not started); a lost slice is said before any SSH error."""
    return choice.of(record).attach(record, reg, env)


def delete(record: SliceRecord, force: bool = False) -> None:
    """Delete the slice's resources and wait until they are gone (before the registry forgets it),
    whoever attached it (``force`` changes nothing: a cloud slice is deleted from anywhere)."""
    choice.of(record).delete(record)


def name_reusable(record: SliceRecord) -> bool:
    """A recorded slice keeps its name while its resources may exist (and bill), until %tpu_down;
    one whose resources are gone, as its API answers now, does not block a launch of its name."""
    if record.state == "creating" and owner_alive(record):
        return False  # its launch is under way
    try:
        return choice.of(record).gone(record)
    except Exception:  # cannot tell: the name stays taken
        return False


def _replace_gone(old: SliceRecord | None) -> None:
    """A launch takes the name of a recorded slice whose resources are gone (name_reusable): what
    its own launch left (a template, a policy) goes, and the launch says so."""
    if old is None or old.backend != NAME:
        return
    choice.of(old).replace_gone(old)
    report.info(shared.gone_record_notice(old.name, f"{old.spec.get('project')}/{old.spec.get('zone')}"))


def slice_status(record: SliceRecord, nodes: Nodes) -> SliceStatus:
    """The slice's cloud state as the survey found it (its own state while not surveyed); hosts
    connected while the kernel that attached them runs; billed since it was created."""
    cloud, uptime = {}, None
    if record.state == "creating":
        state = CREATING
    else:
        state, cloud, uptime = choice.of(record).state(record, nodes)
    price = list_price(record)
    return SliceStatus(state=state, host_states=ssh.slice_status(record, nodes).host_states, usd_per_hour=price,
                       list_usd_per_hour=price, running_s=uptime if uptime is not None else time.time() - record.created,
                       cloud=cloud)


def recover(record: SliceRecord, reg: Registry) -> tuple[catalog.Accelerator, CloudOptions, list[str], int]:
    """Delete a lost (preempted, terminated) slice's resources and forget it; what to launch again:
    its accelerator, its options, the names of its --env values (never stored) and its slices."""
    report.info(f"Recovering {record.name!r}: deleting its lost node, then launching {record.kind} again")
    choice.of(record).recover(record)
    reg.delete_slice(record.name)
    return (catalog.lookup(record.accelerator), recorded_options(record), record.spec.get("env_keys", []),
            record.num_slices)


def cloud_place(record: SliceRecord) -> tuple[str | None, str | None]:
    """The project and zone the slice's node is in."""
    return record.spec.get("project"), record.spec.get("zone")


class Survey:
    """What a status view asks Google: each handler's survey (tpu/listing.py: nodes in every zone of
    the configured project and in each other place in use; compute/found.py: instances and MIGs,
    deleting leftovers), both APIs asked at once, so a view waits for the slower, not for both in
    turn. An API that cannot be asked is said once and its slices' state is UNKNOWN with why."""

    def __init__(self, records: list[SliceRecord], reg: Registry | None = None) -> None:
        self.registry = reg or Registry()
        project, _ = resolve_project_zone(None, None)
        mine = [r for r in records if r.backend == NAME]
        asked = [h for h in choice.in_order() if h.surveyed(project)]
        seen = fan_out(asked, lambda h: h.survey(project, [r for r in mine if choice.of(r) is h], self.registry),
                       deadline=None, name="tpunb-survey")
        for exc in seen.failed.values():
            raise exc  # each handler says what it could not list; what escapes is a bug or a Ctrl-C
        self.nodes: Nodes = {}
        self.parts = [seen.succeeded[h] for h in asked]
        for handler, part in zip(asked, self.parts):
            if part.unreached is not None:
                exc = part.unreached
                why = str(exc) if isinstance(exc, TpunbError) else f"{type(exc).__name__}: {exc}"
                self.nodes.setdefault((project, UNREACHED), {})[handler.API] = gcp_errors.one_line(why, 160)
                report.warn(f"[tpunb] cannot list the {part.surveyed} of {project}: {why}")
            self.nodes.update(part.nodes)

    def refresh(self, record: SliceRecord, node: Node | None) -> None:
        """Give an attached slice's node what the survey saw of it (one list call covers a zone)."""
        for part in self.parts:
            part.refresh(record, node)

    def orphans(self, known: set[str]) -> list[OrphanStatus]:
        """Slices of tpunb's that no record here holds: still billed, deletable here."""
        return [row for part in self.parts for row in part.orphans(known, NAME)]


survey = Survey  # the capability's member: survey(records, reg)


def delete_orphan(name: str, reg: Registry | None = None) -> bool:
    """A slice of tpunb's no record holds (in any zone of the configured project, or recorded as
    left by a failed launch): deleted by the first handler that has it."""
    reg = reg or Registry()
    project, _ = resolve_project_zone(None, None)
    return any(handler.delete_orphan(project, name, reg) for handler in choice.in_order())
