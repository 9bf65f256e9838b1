"""Backends that make hosts, one module each, satisfying one contract (``base.Backend``), so
callers pick a module by the slice's backend name and never branch on it. ``base.LaunchRequest``
is the one record every ``create`` takes; each backend's ``slice_status`` says its slices' state,
hosts and price for %tpu_status, the widgets and the sidebar alike. What only some backends do
(survey a cloud, find orphans, recover a lost slice, ...) callers ask through ``supports`` and
the helpers below, never by a backend's name.

``local`` simulates a slice with host processes on this machine, ``ssh`` reaches hosts you
bring, ``gcp`` creates Cloud TPU nodes (and lists their zones for status and orphans).
"""
from __future__ import annotations

import dataclasses
import importlib
import os
from importlib import metadata
from typing import TYPE_CHECKING, Any, cast

from tpunb.errors import UsageError
from tpunb.provision import gcp, local, ssh
from tpunb.provision.base import OPTIONAL, Backend, LaunchRequest, Made, Nodes

if TYPE_CHECKING:
    from tpunb.registry import Registry, SliceRecord
    from tpunb.transport.seam import Transport

__all__ = ["Backend", "LaunchRequest", "Made", "BACKEND_NAMES", "BRING_YOUR_OWN", "LAUNCH_BACKENDS", "THIS_MACHINE", "Survey",
           "adopt", "backend", "cloud_place", "default_backend", "default_place", "delete_recorded", "describe", "doctor_checks", "launch_backend", "launch_flags", "launched", "runs_here",
           "local_transports", "record_transports", "snapshots_in_cloud", "supporting", "supports", "LaunchFlag",
           "launch_options", "registered", "ENTRY_POINTS", "ENVIRONMENT"]

#: the entry-point group another package registers a backend in: ``name = "package.module"``
ENTRY_POINTS = "tpunb.backends"
#: ``name=package.module,...``: backends registered for this process (tests, a backend in development)
ENVIRONMENT = "TPUNB_BACKENDS"


def registered(environ: Any = os.environ, entry_points: Any = None) -> dict[str, Backend]:
    """Every backend by name: tpunb's own, then those other packages register in the entry-point
    group ``tpunb.backends``, then ``$TPUNB_BACKENDS`` (``name=module,...``). A name taken already
    is refused: a backend cannot replace another one's records."""
    found: dict[str, Any] = {local.NAME: local, ssh.NAME: ssh, gcp.NAME: gcp}
    given = [(e.name, e.value) for e in (metadata.entry_points(group=ENTRY_POINTS) if entry_points is None
                                         else entry_points)]
    given += [tuple(pair.split("=", 1)) for pair in environ.get(ENVIRONMENT, "").split(",") if "=" in pair]
    for name, where in given:
        name = name.strip()
        if name in found:
            raise UsageError(f"backend {name!r} ({where}) is registered twice: give it another name")
        module = importlib.import_module(where.strip().split(":")[0])
        missing = [m for m in ("NAME", "CAPABILITIES", "create", "attach", "delete") if not hasattr(module, m)]
        if missing or module.NAME != name:
            raise UsageError(f"backend {name!r} ({where}) is not a tpunb backend: "
                             f"{'it lacks ' + ', '.join(missing) if missing else f'its NAME is {module.NAME!r}'}")
        found[name] = module
    return cast(dict[str, Backend], found)


_MODULES = registered()
#: every backend's name, as records and --backend write it: only this package branches on them
BACKEND_NAMES = tuple(_MODULES)
#: the backend %tpu_connect makes slices of hosts you bring with
BRING_YOUR_OWN = ssh.NAME
#: ways %tpu_launch makes hosts: every backend but the one for hosts you bring
LAUNCH_BACKENDS = tuple(name for name in _MODULES if name != BRING_YOUR_OWN)
#: the backend whose hosts are processes on this machine (simulated slices, or its own TPU chips)
THIS_MACHINE = local.NAME


def backend(name: str) -> Backend:
    """The module of a backend, by the name records and --backend use."""
    try:
        return cast(Backend, _MODULES[name])
    except KeyError:
        raise UsageError(f"unknown backend {name!r}: use one of {', '.join(LAUNCH_BACKENDS)}") from None


def describe() -> list[dict[str, Any]]:
    """Every backend as the sidebar shows it, so it branches on no backend's name: its label, whether
    its hosts run here for free, what deleting one of its slices does, whether %tpu_launch makes it."""
    return [{"name": name, "label": getattr(made, "LABEL", name), "free": supports(made, "hosts_here"),
             "ends": getattr(made, "ENDS", "its {hosts} hosts' processes end"), "launch": name in LAUNCH_BACKENDS}
            for name, made in _MODULES.items()]


def launch_backend(name: str) -> Backend:
    """The module of a backend %tpu_launch makes hosts with; hosts you bring are %tpu_connect's."""
    if name not in LAUNCH_BACKENDS:
        raise UsageError(f"unknown backend {name!r}: use one of {', '.join(LAUNCH_BACKENDS)} "
                         "(hosts you bring: %tpu_connect HOST,HOST)")
    return backend(name)


def supports(made: Backend, capability: str) -> bool:
    """The backend has this optional capability (``base.OPTIONAL``)."""
    if capability not in OPTIONAL:
        raise ValueError(f"no backend capability {capability!r}: one of {', '.join(OPTIONAL)}")
    return capability in made.CAPABILITIES


def supporting(capability: str) -> list[Backend]:
    """Every backend with this capability."""
    return [cast(Backend, m) for m in _MODULES.values() if supports(cast(Backend, m), capability)]


class Survey:
    """What every surveying backend saw, in one look each (no call unless it has slices or a
    place configured): nodes by place for ``slice_status``, attached nodes refreshed, orphans."""

    def __init__(self, records: list[SliceRecord], reg: Registry) -> None:
        self.parts = [made.survey(records, reg) for made in supporting("survey")]
        self.nodes: Nodes = {}
        for part in self.parts:
            self.nodes.update(part.nodes)

    def refresh(self, record: SliceRecord, node: Any) -> None:
        for part in self.parts:
            part.refresh(record, node)

    def orphans(self, known: set[str]) -> list:
        return [orphan for part in self.parts for orphan in part.orphans(known)]


def adopt(name: str, reg: Registry) -> SliceRecord | None:
    """Slice ``name`` when no record here holds it but a backend finds it as its own (a cloud node a
    wiped Colab runtime left running): its record rebuilt and saved. None when none has it."""
    for made in supporting("adopt"):
        record = made.adopt(name, reg)
        if record is not None:
            return record
    return None


def cloud_place(record: SliceRecord) -> tuple[str | None, str | None] | None:
    """Where a slice lives in a cloud (project, zone), or None when its backend is no cloud."""
    made = backend(record.backend)
    return made.cloud_place(record) if supports(made, "cloud") else None


def default_place(project: str | None, zone: str | None) -> tuple[str | None, str | None]:
    """Where a launch goes when not told: the first cloud backend's configured project and zone
    (flags, environment, its own tool's config), else what was given."""
    for made in supporting("cloud"):
        found = made.default_place(project, zone)
        if found[0]:
            return found
    return project, zone


def doctor_checks(record: SliceRecord | None) -> list:
    """%tpu_doctor's checks of a slice's backend (none for one without them), or with no slice,
    those of every backend a launch may go to."""
    made = [backend(record.backend)] if record is not None else supporting("doctor")
    return [check for m in made if supports(m, "doctor") for check in m.doctor_checks()]


@dataclasses.dataclass(frozen=True)
class LaunchFlag:
    """One backend's launch option as a %tpu_launch flag: ``--BACKEND-OPTION`` always, and the bare
    ``--OPTION`` for the first backend that offers it (Cloud TPU's ``--zone``), so two backends'
    options never collide in argparse."""

    backend: str
    option: dataclasses.Field
    flags: tuple[str, ...]

    @property
    def dest(self) -> str:
        return f"{self.backend}__{self.option.name}"


def launch_flags(backends: list[Backend] | None = None) -> list[LaunchFlag]:
    """Every launch option a backend offers as %tpu_launch flags (its dataclass fields with help)."""
    taken: set[str] = set()
    found = []
    for made in supporting("flags") if backends is None else backends:
        for option in made.option_flags():
            bare = "--" + option.name.replace("_", "-")
            flags = (bare,) * (bare not in taken) + (f"--{made.NAME}-{option.name.replace('_', '-')}",)
            taken.add(bare)
            found.append(LaunchFlag(made.NAME, option, flags))
    return found


def launch_options(given: dict[str, Any], backend: str | None) -> tuple[str | None, dict[str, Any]]:
    """The backend a launch's flags are for, and its options: ``given`` by flag ``dest`` (values None
    or False were not given). Flags of two backends, or of another backend than ``--backend``, are
    refused in one line; another backend's flags choose it when ``--backend`` is not given."""
    chosen: dict[str, dict[str, Any]] = {}
    for flag in launch_flags():
        value = given.get(flag.dest)
        if value not in (None, False):
            chosen.setdefault(flag.backend, {})[flag.option.name] = value
    if len(chosen) > 1:
        raise UsageError(f"flags of the {' and the '.join(sorted(chosen))} backends at once: give one backend's")
    if not chosen:
        return backend, {}
    (owner, options), = chosen.items()
    if backend is not None and backend != owner:
        raise UsageError(f"--{next(iter(options)).replace('_', '-')} is a {owner} option, and --backend is {backend}: "
                         f"give --backend {owner}, or leave the {owner} flags out")
    first = supporting("flags")[0].NAME  # its flags leave the default backend to the launch (local without a project)
    return (backend if backend is not None or owner == first else owner), options


def snapshots_in_cloud(record: SliceRecord) -> bool:
    """The slice's snapshots go to Cloud Storage, which its hosts in a cloud reach (not under
    $TPUNB_HOME here): its backend has a cloud place."""
    return supports(backend(record.backend), "cloud")


def record_transports(record: SliceRecord, reg: Registry, indices: list[int]) -> dict:
    """{host: a transport, or why none could be made} for a recorded slice, from any process."""
    return backend(record.backend).record_transports(record, reg, indices)


def local_transports(record: SliceRecord) -> list[Transport] | None:
    """Transports to a recorded slice's hosts when they are on this machine (any process may ask
    them), else None."""
    made = backend(record.backend)
    return made.local_transports(record) if supports(made, "hosts_here") else None


def default_backend(project: str | None = None) -> str:
    """gcp when a Google Cloud project is given or configured (environment, gcloud), else local."""
    return "gcp" if project or gcp.configured() else "local"


def runs_here(name: str | None) -> bool:
    """``--backend`` is none, or the one whose hosts are processes on this machine."""
    return name in (None, THIS_MACHINE)


def launched(record: SliceRecord) -> bool:
    """The slice was made by %tpu_launch (its hosts are ours to give the kernel's defaults, such
    as its HF_TOKEN), not brought with %tpu_connect."""
    return record.backend in LAUNCH_BACKENDS


def delete_recorded(name: str, reg: Registry) -> bool:
    """Delete a slice this process does not hold: through its record's backend (before the registry
    forgets it), else a cloud node of that name no record knows; False when there is neither."""
    record = reg.get_slice(name)
    if record is None:
        return any(made.delete_orphan(name, reg) for made in supporting("orphans"))
    backend(record.backend).delete(record)
    reg.delete_slice(name)
    return True
