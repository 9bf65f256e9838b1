"""Ending the services of a slice no kernel here attached (``%tpu_down NAME``, the sidebar's delete).

Services outlive their kernel by design, so deleting a recorded slice must reach its hosts itself:
each backend's ``delete`` calls ``stop_recorded`` with a way to make the hosts' transports (no
agent is started: the control process is all a stop needs).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from tpunb import report
from tpunb.errors import TpunbError
from tpunb.services import seen
from tpunb.services.control import ask_hosts, may_have_services
from tpunb.transport.seam import Transport

if TYPE_CHECKING:
    from tpunb.registry import SliceRecord


def stop_recorded(record: "SliceRecord", transports: Callable[[], list[Transport]]) -> None:
    """Stop every service on the recorded slice's hosts and forget them; a host that cannot be
    reached is named in one warning (its machine may be gone with the slice)."""
    seen.forget_services(record.name)
    seen.forget_forwards(record.name, everyone=True)
    try:
        made = transports()
    except TpunbError as exc:
        report.warn(f"[tpunb] {record.name!r}: its hosts could not be reached to stop its services ({exc})")
        return
    try:
        asked = {h: {"op": "stop", "all": True, "slice": record.name}
                 for h, transport in enumerate(made) if may_have_services(transport, record.name, h)}
        replies = ask_hosts(made, asked)
    finally:
        for transport in made:
            transport.close()
    failed = sorted(h for h, r in replies.items() if "error" in r)
    if failed:
        report.warn(f"[tpunb] {record.name!r}: services on host{'s' if len(failed) > 1 else ''} "
                    f"{', '.join(map(str, failed))} could not be stopped ({replies[failed[0]]['error']})")
