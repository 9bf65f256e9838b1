"""The kernel's half of snapshots on preemption: arm every host (``tpunb_host.preempt`` watches for
the notice and saves by itself, kernel or no kernel), and after ``%tpu_launch --recover`` restore
the last complete snapshot and say which one it was, and why.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tpunb import provision, report
from tpunb.errors import TpunbError, UsageError
from tpunb.host.preempt import WINDOW
from tpunb.snapshot import remote, places as store
from tpunb.snapshot.places import Snapshot

if TYPE_CHECKING:
    from tpunb.slice import Slice


def armed() -> dict[str, dict]:
    """{slice name: {"names", "uri", "time"}} of the slices armed from this machine."""
    return store.read_table("armed.json")


def arm(sl: "Slice", names: list[str], to: str | None = None, bucket: str | None = None,
        window: float = WINDOW) -> str:
    """Arm every host of ``sl`` to snapshot ``names`` on its VM's preemption notice; the URI it will use."""
    from tpunb.snapshot import check_names, template

    names = check_names(names)
    if bucket:
        store.bucket(bucket)
    uri = store.new_uri(provision.snapshots_in_cloud(sl.record), sl.name, to, reason="preempt")
    replies = remote.call(sl, "arm", {"names": names, "uri": uri, "hosts": sl.num_hosts, "manifest": template(sl),
                                      "window": window})
    watching = sorted({w for r in replies.values() for w in r.get("watching", [])})
    lacking = sorted(h for h, r in replies.items() if r.get("missing"))
    if lacking:
        report.warn(f"[tpunb] orbax-checkpoint is not installed on host{'s' if len(lacking) > 1 else ''} "
                    f"{sl.layout.names(lacking)}: its jax.Arrays cannot be saved there (pip install orbax-checkpoint)")
    store.write_entry("armed.json", sl.name, {"names": names, "uri": uri, "to": to, "time": time.time()})
    report.info(f"[tpunb] armed: on a preemption notice every host of {sl.name!r} snapshots {', '.join(names)} to {uri} "
                + (f"(watching {', '.join(watching)})" if watching else
                   "(but these hosts have no metadata server: only Compute Engine and Cloud TPU VMs get a notice)"))
    return uri


def recover(sl: "Slice", name: str) -> Snapshot | None:
    """After a relaunch: restore the newest complete snapshot of ``name`` and say where it came from
    (the notice's own, or an earlier one because the notice's did not finish or never came)."""
    from tpunb.snapshot import restore

    entry = armed().get(name)
    try:
        known = store.snapshots(name)
    except TpunbError as exc:
        report.warn(f"[tpunb] recovered {name!r}, but its snapshots could not be listed ({exc}): nothing restored")
        return None
    complete = [s for s in known if s.complete]
    notice = next((s for s in known if entry and s.uri == entry["uri"]), None)
    if notice is not None and notice.complete:
        why = "the snapshot its hosts took at the preemption notice"
    elif notice is not None:
        why = ("the snapshot taken at the preemption notice did not finish within the window, so the last complete "
               "one")
    elif entry:
        why = "no snapshot was taken at the preemption (no notice reached the hosts), so the last complete one"
    else:
        why = "the last complete snapshot"
    if not complete:
        report.warn(f"[tpunb] no complete snapshot of {name!r} to restore ({why.split(',')[0]}): its hosts start empty")
        _rearm(sl, entry)
        return None
    chosen = complete[-1]
    taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(chosen.time)) if chosen.time else "?"
    report.info(f"[tpunb] restoring {why} ({taken}, {chosen.uri})")
    restore(sl, chosen.uri)
    _rearm(sl, entry)
    return chosen


def _rearm(sl: "Slice", entry: dict | None) -> None:
    """The recovered slice is armed as the lost one was, to a new place (the old one holds a snapshot)."""
    if not entry:
        return
    try:
        arm(sl, entry["names"], to=None)
    except TpunbError as exc:
        report.warn(f"[tpunb] the recovered slice is not armed again ({exc}): %tpu_snapshot --on-preempt "
                    f"{','.join(entry['names'])} --to URI arms it")


def names_list(text: str | None, flag: str = "--snapshot-on-preempt") -> list[str] | None:
    """NAME[,NAME] as a flag gives it: the names, checked before anything launches."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or not all(n.isidentifier() for n in names):
        raise UsageError(f"{flag} takes host variable names separated by commas, e.g. params,step, not {text!r}")
    return names


def after_launch(sl: "Slice", recovered: str | None, names: list[str] | None) -> None:
    """%tpu_launch's hook: a recovered slice gets its last snapshot back; an armed one is armed."""
    if recovered:
        recover(sl, recovered)
    if names:
        arm(sl, names)

