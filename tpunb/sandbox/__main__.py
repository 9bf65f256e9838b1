"""``python -m tpunb.sandbox``: serve the emulated Cloud TPU API until interrupted.

Prints one line, ``tpunb emulator listening on http://HOST:PORT``, once it accepts requests
(with ``--port 0`` that line is how a parent process learns the port).
"""

from __future__ import annotations

import argparse
import signal
import sys

from tpunb.sandbox.server import serve


def _zones(value: str) -> list[str] | bool:
    return True if value in ("", "all", "*") else [z for z in value.split(",") if z]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the server the same clean way Ctrl-C does


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tpunb.sandbox",
        description="Serve a local Cloud TPU v2 REST API; point TPUNB_TPU_API_ENDPOINT at the URL it prints.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=8470, help="port to listen on; 0 picks a free one (default 8470)"
    )
    p.add_argument(
        "--create-seconds", type=float, default=0.5, help="CREATING -> READY, PROVISIONING -> ACTIVE"
    )
    p.add_argument("--delete-seconds", type=float, default=0.2, help="DELETING -> gone")
    p.add_argument("--queue-seconds", type=float, default=0.3, help="WAITING_FOR_RESOURCES -> PROVISIONING")
    p.add_argument("--ssh-hosts", default="", help="comma-separated pool of addresses served by one sshd")
    p.add_argument(
        "--ssh-port", type=int, default=22, help="that sshd's port (reported as label tpunb-ssh-port)"
    )
    p.add_argument(
        "--authorized-keys", default=None, help="that sshd's AuthorizedKeysFile (ssh-keys metadata goes here)"
    )
    p.add_argument(
        "--accounts", default=None,
        help="an Sshd's accounts directory: its users (nss_wrapper passwd) and keys/ADDRESS/USER (logins per host)",
    )
    p.add_argument(
        "--metadata-port", type=int, default=None,
        help="serve a GCE metadata server on every --ssh-hosts address at this port (idle autodelete)",
    )
    f = p.add_argument_group("faults (also settable at POST /_emulator/faults)")
    f.add_argument(
        "--fault-quota", choices=["operation", "http"], help="creates fail with RESOURCE_EXHAUSTED"
    )
    f.add_argument(
        "--fault-no-capacity",
        nargs="?",
        const="all",
        metavar="ZONES",
        type=_zones,
        help="stockout everywhere, or in these comma-separated zones",
    )
    f.add_argument("--fault-permission-denied", action="store_true", help="creates answer 403")
    f.add_argument("--fault-delete-denied", action="store_true", help="deletes answer 403 (clean-up fails)")
    f.add_argument(
        "--fault-api-disabled", action="store_true", help="every call answers 403 SERVICE_DISABLED"
    )
    f.add_argument(
        "--fault-os-login", action="store_true",
        help="enable-oslogin=TRUE in every project: VMs take OS Login keys, not metadata ssh-keys",
    )
    f.add_argument(
        "--fault-slow-create", type=float, default=0.0, metavar="S", help="nodes stay CREATING S more seconds"
    )
    f.add_argument(
        "--preempt-after",
        type=float,
        default=None,
        metavar="S",
        help="spot nodes are preempted S s after READY",
    )
    p.add_argument("--verbose", action="store_true", help="log every request to stderr")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    faults = {
        "quota": args.fault_quota,
        "no_capacity": args.fault_no_capacity or False,
        "permission_denied": args.fault_permission_denied,
        "delete_denied": args.fault_delete_denied,
        "api_disabled": args.fault_api_disabled,
        "os_login": args.fault_os_login,
        "slow_create": args.fault_slow_create,
        "preempt_after": args.preempt_after,
    }
    server = serve(
        args.host,
        args.port,
        verbose=args.verbose,
        create_seconds=args.create_seconds,
        delete_seconds=args.delete_seconds,
        queue_seconds=args.queue_seconds,
        ssh_hosts=[h for h in args.ssh_hosts.split(",") if h],
        ssh_port=args.ssh_port,
        authorized_keys=args.authorized_keys,
        accounts=args.accounts,
        metadata_port=args.metadata_port,
        faults=faults,
    )
    signal.signal(signal.SIGTERM, _interrupt)
    host, port = server.server_address[:2]
    print(f"tpunb emulator listening on http://{host}:{port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.emulator.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
