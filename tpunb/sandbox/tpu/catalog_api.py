"""The emulated API's read-only catalog: acceleratorTypes and runtimeVersions of a zone.

Answers come from tpunb's own catalog (the same one create checks against), in the shapes of
tpu_v2's AcceleratorType and RuntimeVersion, so a client can ask "does this zone offer v5p-8?"
before it creates anything. Types the Cloud TPU API cannot create (no AcceleratorConfig.Type,
e.g. tpu7x) are not listed. All of a zone's entries come in one page. The ``offered`` setting
(a fault: {zone: [type, ...]}) makes a zone list other types than the catalog says, as the real API
may (a new zone, a type withdrawn).
"""

from __future__ import annotations

from tpunb import catalog
from tpunb.sandbox.tpu.resources import ACCELERATOR_CONFIG_TYPES, ApiError


def _offered(zone: str, offered: dict[str, list[str]] | None = None) -> list[catalog.Accelerator]:
    if offered and zone in offered:
        return [catalog.lookup(name) for name in offered[zone]]
    return [a for a in catalog.all_accelerators() if zone in a.zones and a.generation in ACCELERATOR_CONFIG_TYPES]


def _accelerator_json(parent: str, acc: catalog.Accelerator) -> dict:
    return {"name": f"{parent}/acceleratorTypes/{acc.name}", "type": acc.name,
            "acceleratorConfigs": [{"type": ACCELERATOR_CONFIG_TYPES[acc.generation], "topology": acc.topology}]}


def _runtimes(zone: str, offered: dict[str, list[str]] | None = None) -> list[str]:
    return sorted({acc.default_runtime for acc in _offered(zone, offered)})


def list_accelerator_types(project: str, zone: str, offered: dict[str, list[str]] | None = None) -> dict:
    parent = f"projects/{project}/locations/{zone}"
    items = [_accelerator_json(parent, acc) for acc in _offered(zone, offered)]
    return {"acceleratorTypes": items} if items else {}


def get_accelerator_type(project: str, zone: str, name: str, offered: dict[str, list[str]] | None = None) -> dict:
    parent = f"projects/{project}/locations/{zone}"
    for acc in _offered(zone, offered):
        if acc.name == name:
            return _accelerator_json(parent, acc)
    raise ApiError(404, "NOT_FOUND", f"Resource '{parent}/acceleratorTypes/{name}' was not found")


def list_runtime_versions(project: str, zone: str, offered: dict[str, list[str]] | None = None) -> dict:
    parent = f"projects/{project}/locations/{zone}"
    items = [{"name": f"{parent}/runtimeVersions/{v}", "version": v} for v in _runtimes(zone, offered)]
    return {"runtimeVersions": items} if items else {}


def get_runtime_version(project: str, zone: str, version: str, offered: dict[str, list[str]] | None = None) -> dict:
    parent = f"projects/{project}/locations/{zone}"
    if version not in _runtimes(zone, offered):
        raise ApiError(404, "NOT_FOUND", f"Resource '{parent}/runtimeVersions/{version}' was not found")
    return {"name": f"{parent}/runtimeVersions/{version}", "version": version}
