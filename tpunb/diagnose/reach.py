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
    """The one command that opens ``port`` between a network's VMs."""
    return (f"Open it: gcloud compute firewall-rules create tpunb-jax-{port} --network {network or 'NETWORK'} "
            f"--allow tcp:{port} --source-ranges SUBNET_RANGE (or pick an open port with --coordinator-port)")


def probe_settings(port: int, network: str | None = None, seconds: float = PROBE_SECONDS) -> dict:
    """What the agents' JAX start is told: how long to probe, and the fix to name."""
    return {"seconds": seconds, "fix": firewall_fix(port, network)}
