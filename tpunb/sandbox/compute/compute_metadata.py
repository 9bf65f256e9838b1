"""The instance attributes a Compute Engine TPU VM's metadata server shows, as field reports
record them (docs/cloud-facts.md, Compute Engine section): ``accelerator-type`` (Google's name,
``v7x-16`` for a 2x2x2 TPU7x slice), ``worker-id``, ``tpu-env`` (``KEY: 'value'`` lines with
``TPU_WORKER_ID``, ``TOPOLOGY``, ``HOST_BOUNDS``...) and ``worker-network-endpoints``: the slice's
instance names, bare, comma-separated, in worker order (JAX's "new format"). No
``agent-worker-number``: no report shows one on a Compute Engine VM."""
from __future__ import annotations

from tpunb.sandbox.compute import machines
from tpunb import catalog
from tpunb.sandbox.compute.compute_records import Vm


def _bounds(topology: str) -> list[int]:
    dims = [int(x) for x in topology.split("x")]
    return dims + [1] * (3 - len(dims))


def google_accelerator_type(generation: str, topology: str) -> str:
    """What Google's tpu-env calls a slice: ``v6e-8``, ``v5p-16``, ``v7x-16`` (TPU7x counts TensorCores)."""
    name = catalog.from_topology(generation, topology).name
    return "v7x-" + name.split("-", 1)[1] if generation == "tpu7x" else name


def instance_attributes(vm: Vm, peers: list[Vm], topology: str) -> dict[str, str]:
    """The TPU attributes of ``vm``, one of ``peers`` (its slice's VMs in worker order)."""
    machine = machines.machine_type(vm.machine_type)
    accelerator = google_accelerator_type(machine.generation, topology)
    per_host = _bounds(machine.topology)
    hosts = [s // h for s, h in zip(_bounds(topology), per_host)]
    model = (vm.properties.get("scheduling") or {}).get("provisioningModel", "STANDARD")
    env = {"ACCELERATOR_TYPE": accelerator, "CHIPS_PER_HOST_BOUNDS": ",".join(map(str, per_host)),
           "CONSUMER_PROJECT_ID": vm.project, "HOST_BOUNDS": ",".join(map(str, hosts)),
           "PREEMPTIBLE": "true" if model in ("SPOT", "FLEX_START") else "false", "TOPOLOGY": topology,
           "TPU_ACCELERATOR_TYPE": accelerator, "TPU_WORKER_ID": str(vm.worker), "TYPE": machine.generation.upper(),
           "WORKER_ID": str(vm.worker), "ZONE": vm.zone}
    return {"accelerator-type": accelerator, "worker-id": str(vm.worker),
            "worker-network-endpoints": ",".join(p.name for p in peers),
            "tpu-env": "".join(f"{key}: '{value}'\n" for key, value in sorted(env.items()))}
