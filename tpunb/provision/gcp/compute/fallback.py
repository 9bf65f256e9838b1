"""Another way to the same slice when Compute Engine will not grant the first one.

``v6e-8`` is one ``ct6e-standard-8t``, a full-host VM Google calls "optimized for an inference
use case" (tpu-machines). Under flex-start it was never granted in the tries field reports record
(0 of 4, each ``INTERNAL_ERROR`` after minutes in STAGING), and the TPU builders' flex shapes are
``4t`` only; the same 8 chips as 2 x ``ct6e-standard-4t`` under a ``2x4`` workload policy were
granted in minutes. So a flex-start ``v6e-8`` whose 8t is refused is launched again as that MIG:
the same topology and chips, two hosts instead of one."""
from __future__ import annotations

import dataclasses

from tpunb.provision.gcp import apis
from tpunb.errors import ProvisionError
from tpunb.provision.gcp.compute.bodies import VmSpec
from tpunb.provision.gcp.compute.bulk import activation_limit

FULL_HOST, HALF_HOST = "ct6e-standard-8t", "ct6e-standard-4t"
#: how a refusal of the full-host VM shows: no capacity, a wait that ran out, or INTERNAL_ERROR
REFUSED = ("no_capacity", "timeout", "failover")


def flex_alternative(vm: VmSpec, error: BaseException) -> VmSpec | None:
    """The slice as 2 x ct6e-standard-4t when ``vm`` is a flex-start ct6e-standard-8t that ``error``
    refused; None otherwise."""
    if not (vm.flex_hours and vm.shape.machine_type == FULL_HOST and isinstance(error, ProvisionError)):
        return None
    if error.reason not in REFUSED and "INTERNAL_ERROR" not in str(error):
        return None
    half = apis.machine_type(HALF_HOST)
    shape = dataclasses.replace(vm.shape, machine_type=half.name, vms=vm.shape.chips_per_vm // half.chips,
                                chips_per_vm=half.chips, devices_per_vm=half.jax_devices)
    return dataclasses.replace(vm, shape=shape, idle_grace=vm.idle_grace + activation_limit(shape.vms))
