"""Coordinator reachability: every host checks that the JAX coordinator's port answers before
jax.distributed starts, so a port a firewall drops fails the cell in seconds with the rule to
add, instead of hanging until JAX's 120 s timeout (jax #35905)."""
from __future__ import annotations

#: the coordinator port on Cloud TPU: GCP's firewall rule for TPU pods opens 8470, 8471, 8474,
#: 8476 and 11211 between its VMs, and 8476 was JAX's own default (docs/cloud-facts.md)
COORDINATOR_PORT = 8476
#: how long a host waits for any answer from the coordinator's address before it gives up
PROBE_SECONDS = 5.0


def firewall_fix(port: int, network: str | None = None) -> str:
    """The one command that lets a slice's VMs talk: all TCP between them, not the coordinator's port
    alone (libtpu's hosts talk on 8471 and others, field reports show TPU_PROCESS_PORT=8471; Compute
    Engine, unlike the Cloud TPU API, makes no firewall rule for TPU VMs)."""
    return (f"Open all TCP between the slice's VMs (JAX's coordinator listens on {port}, libtpu's hosts talk on 8471 "
            f"and others): gcloud compute firewall-rules create tpunb-slice-tcp --network {network or 'NETWORK'} "
            f"--allow tcp --source-ranges SUBNET_RANGE (or pick an open coordinator port with --coordinator-port)")


def probe_settings(port: int, network: str | None = None, seconds: float = PROBE_SECONDS) -> dict:
    """What the agents' JAX start is told: how long to probe, and the fix to name."""
    return {"seconds": seconds, "fix": firewall_fix(port, network)}
