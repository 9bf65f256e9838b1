"""The hosts a user brings to %tpu_connect, read from what they typed: where each is, who logs
in, and how many slices they make; every mistake refused in one line before anything connects."""
from __future__ import annotations

from dataclasses import dataclass

from tpunb import catalog
from tpunb.errors import UsageError
from tpunb.notebook.launch_args import slice_count


@dataclass(frozen=True)
class Brought:
    places: list[tuple[str, int]]  # (host, port) per host, in the order given
    addresses: list[str]  # host, or host:port where the port is not 22
    user: str | None
    accelerator: catalog.Accelerator | None  # when one was given
    count: int  # slices
    python: str  # one interpreter for all hosts, or one per host: 'a,b,...'


def brought_hosts(hosts: list[str] | str, user: str | None, port: int, slices: int | None,
                  accelerator: str | None, python: str | list[str] = "python3",
                  coordinator_port: int | None = None) -> Brought:
    """``hosts`` ('a,b' or a list of [user@]host[:port]) as places to connect to, checked against
    ``slices`` and ``accelerator`` (its host count); ``coordinator_port`` must be a TCP port."""
    if coordinator_port is not None and not 0 < int(coordinator_port) < 65536:
        raise UsageError(f"--coordinator-port {coordinator_port}: give a TCP port, 1-65535 (8476 passes GCP's TPU "
                         "firewall rule)")
    from tpunb.transport.ssh_hosts import parse_host

    specs = [h.strip() for h in (hosts.split(",") if isinstance(hosts, str) else hosts) if h.strip()]
    if not specs:
        raise UsageError("give at least one host, e.g. %tpu_connect 10.0.0.2,10.0.0.3")
    count = slice_count(slices)
    accel = None
    if len(specs) % count and not accelerator:
        raise UsageError(f"--slices {count}: {len(specs)} hosts do not make {count} equal slices; "
                         f"give {count} x (hosts per slice) hosts, slice by slice")
    if accelerator:
        accel = catalog.lookup(accelerator)
        if accel.hosts * count != len(specs):
            what = f"{count} x {accel.name} have {accel.hosts * count}" if count > 1 else f"{accel.name} has {accel.hosts}"
            raise UsageError(f"{what} host{'s' if accel.hosts * count > 1 else ''}, but {len(specs)} were given")
    places, addresses = [], []
    for spec in specs:
        spec_user, host, spec_port = parse_host(spec, user, port)
        places.append((host, spec_port))
        addresses.append(host if spec_port == 22 else f"{host}:{spec_port}")
        if spec_user != (user or spec_user):
            raise UsageError(f"{spec}: give the user once with --user, or as user@host on every host")
        user = spec_user
    return Brought(places, addresses, user, accel, count, python if isinstance(python, str) else ",".join(python))
