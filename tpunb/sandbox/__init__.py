"""A local Cloud TPU v2 REST API, so tpunb's cloud path runs without a cloud.

``python -m tpunb.sandbox --port 8470`` serves what google-cloud-tpu's REST transport calls
(nodes, queued resources, operations) with the real JSON shapes, a timed state machine and
fault injection; point tpunb at it with ``TPUNB_TPU_API_ENDPOINT=http://127.0.0.1:8470``.
With ``--ssh-hosts`` and ``--authorized-keys`` an emulated node's workers are real SSH hosts
(loopback addresses of one local sshd); the sshd's port, when not 22, is reported in the node
label ``tpunb-ssh-port`` (networkEndpoints[].port is 8470, as in the real API). With
``--metadata-port`` each host also has a GCE metadata server at its address (a VM token the API
accepts, the node's metadata as instance attributes), and a READY node's ``startup-script`` runs
once per host, as a VM's boot runs it (``Sshd.emulator_options()`` wires all of it to an sshd).

The same server also answers Compute Engine's REST paths (``/compute/v1/...``: TPU VM instances,
instance templates, workload policies, BULK MIGs; ``compute_routes``), for google-cloud-compute
pointed at it with ``client_options={"api_endpoint": url}`` (TPUNB_COMPUTE_API_ENDPOINT).

In tests: ``url, handle = start_emulator(create_seconds=0.1)`` ... ``handle.stop()`` (a thread in
this process), or ``proc, url = start_emulator_process("--create-seconds", "0.1")`` (a subprocess).
Stdlib only, apart from tpunb.catalog (valid accelerator types and zones).
"""

from __future__ import annotations

from tpunb.sandbox.admin import AdminClient, AdminError
from tpunb.sandbox.server import EmulatorHandle, build_emulator, start_emulator, start_emulator_process

__all__ = [
    "AdminClient",
    "AdminError",
    "EmulatorHandle",
    "build_emulator",
    "start_emulator",
    "start_emulator_process",
]
