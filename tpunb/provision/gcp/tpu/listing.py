"""What a status view asks the Cloud TPU API: the configured project's nodes in every zone at once
(adoption.everywhere: a node whose registry was wiped, as Colab's is, is found wherever it runs),
and one list call per other project and zone in use; nodes a failed launch could not delete are
re-checked here and forgotten once they are gone."""
from __future__ import annotations

from tpunb import report
from tpunb.errors import TpunbError
from tpunb.provision.gcp.tpu import adoption, api
from tpunb.provision.gcp.tpu.cloud_node import CloudNode
from tpunb.registry import Registry, SliceRecord
from tpunb.status import OrphanStatus

class Seen:
    """The nodes one survey found, by (project, zone); ``unreached``: why the project's own could not
    be listed (None: they were)."""

    surveyed = "nodes"  # what a survey that cannot ask the API says it could not list

    def __init__(self, project: str | None, records: list[SliceRecord], registry: Registry) -> None:
        self.registry, self.unreached = registry, None
        self.recorded = {(p, z, n): why for p, z, n, why in registry.orphans()}
        places = {(r.spec["project"], r.spec["zone"]) for r in records} | {(p, z) for p, z, _ in self.recorded}
        self.nodes: dict[tuple, dict] = {}
        if project:
            try:
                listed = list(adoption.everywhere(project))
            except Exception as exc:  # a status view never fails on an API it cannot ask: it says why
                self.unreached = exc
            else:
                for info in listed:
                    self.nodes.setdefault((project, info.zone), {})[info.name] = info
                for place in [p for p in places if p[0] == project]:  # listed: none there is an answer too
                    self.nodes.setdefault(place, {})
                places = {p for p in places if p[0] != project}
        for place in sorted(places):
            try:
                self.nodes[place] = {info.name: info for info in api.list_nodes(*place)}
            except TpunbError as exc:
                report.warn(f"[tpunb] cannot list nodes in {place[0]}/{place[1]}: {exc}")

    def refresh(self, record: SliceRecord, node) -> None:
        """Give an attached slice's node what the survey saw of it (one list call covers a zone)."""
        place = (record.spec.get("project"), record.spec.get("zone"))
        if isinstance(node, CloudNode) and place in self.nodes:
            node.update(self.nodes[place].get(record.name))

    def orphans(self, known: set[str], backend: str) -> list[OrphanStatus]:
        """tpunb nodes the registry does not hold as slices: still billed, deletable here."""
        found = []
        for (project, zone), nodes in self.nodes.items():
            for node_name, info in sorted(nodes.items()):
                if node_name in known or not info.tpunb_owned:
                    continue
                why = self.recorded.get((project, zone, node_name))
                message = (f"{why}; still billed: delete it here, with %tpu_down {node_name} or "
                           f"{api.delete_command(project, zone, node_name, info.queued_resource is not None)}"
                           if why else
                           f"not in this registry and still billed: %tpu_use {node_name} re-attaches it, "
                           f"%tpu_down {node_name} deletes it")
                found.append(_orphan(project, zone, node_name, info, message, backend))
        for (project, zone, node_name), why in self.recorded.items():
            if (project, zone) not in self.nodes:  # not listed now: say what is known, check again later
                found.append(_orphan(project, zone, node_name, None, f"{why}; %tpu_down {node_name} deletes it", backend))
            elif node_name not in self.nodes[(project, zone)]:
                self.registry.forget_orphan(project, zone, node_name)  # gone since: nothing bills any more
        return found


def _orphan(project: str, zone: str, name: str, info: api.NodeInfo | None, message: str, backend: str) -> OrphanStatus:
    if info is None:
        return OrphanStatus(name=name, accelerator="", num_slices=1, project=project, zone=zone, state="UNKNOWN",
                            spot=False, usd_per_hour=None, uptime_s=None, message=message,
                            cloud={"api": api.API, "cloud_state": "UNKNOWN"}, backend=backend)
    node = CloudNode(name, info.accelerator, project, zone, info.spot, info, watch=False, slices=info.slices)
    cloud = {"api": api.API, **node.status()}
    return OrphanStatus(name=name, accelerator=info.kind, num_slices=info.slices, project=project, zone=zone,
                        state=cloud["cloud_state"], spot=info.spot, usd_per_hour=cloud["usd_per_hour"],
                        uptime_s=cloud["uptime_s"], message=message, cloud=cloud, backend=backend)


def delete_orphan(project: str | None, name: str, reg: Registry) -> bool:
    """A tpunb node the registry does not hold as a slice (in any zone of the configured project, or
    recorded as left by a failed launch): deleted, True; False when there is none."""
    places = [(p, z) for p, z, n, _ in reg.orphans() if n == name]
    found = adoption.find(project, name) if project else None
    if found is not None:
        places.append((project, found.zone))
    for place in dict.fromkeys(places):
        info = api.get(*place, name)
        if info is not None and info.tpunb_owned and api.delete(*place, name, wait=True):
            reg.forget_orphan(*place, name)
            return True
        if info is None:
            reg.forget_orphan(*place, name)
    return False
