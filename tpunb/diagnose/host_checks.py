"""The host checks of %tpu_doctor: clocks that disagree, disks that are nearly full.

One probe runs on every host at once and answers both (its clock and its free bytes), so the
checks cost one round trip however many hosts there are."""
from __future__ import annotations

import ast
import time

from tpunb.diagnose.checks import CHECKS, FAILED, OK, WARNING, Context, check
from tpunb.units import format_bytes

#: one expression, so nothing is left in the hosts' namespaces
PROBE = ("(__import__('time').time(), "
         "__import__('shutil').disk_usage(__import__('os').path.expanduser('~')).free, "
         "__import__('shutil').disk_usage(__import__('tempfile').gettempdir()).free)")
SKEW_WARNING_S = 1.0  # profiles of several hosts no longer line up
SKEW_FAILED_S = 60.0  # signed requests and tokens start to be refused
DISK_WARNING_BYTES = 10 * 2**30  # a checkpoint or a jax cache may not fit
DISK_FAILED_BYTES = 1 * 2**30


def probe(ctx: Context) -> tuple[dict[int, tuple[float, int, int]], dict[int, str], float, float]:
    """Each host's (clock, free bytes in home, free bytes in temp), the hosts that did not
    answer (why), and the kernel's clock before and after; memoised for the other checks."""
    if "probe" not in ctx.memo:
        before = time.time()
        result = ctx.slice.run(PROBE, output=None)
        after = time.time()
        answers, missing = {}, {}
        for host, value in result.reprs.items():
            try:
                answers[host] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                missing[host] = result[host].status
        ctx.memo["probe"] = answers, missing, before, after
    return ctx.memo["probe"]


def skew(times: dict[int, float], before: float, after: float) -> tuple[float, int, int]:
    """The least the hosts' clocks must disagree by (the probe took ``after - before`` to reach
    them all, so a spread within that proves nothing), and the hosts furthest apart."""
    first, last = min(times, key=times.get), max(times, key=times.get)
    return max(0.0, times[last] - times[first] - (after - before)), first, last


@check(CHECKS, "clock skew")
def clock_skew(ctx: Context) -> tuple[str, str] | None:
    if ctx.slice is None:
        return None
    answers, missing, before, after = probe(ctx)
    if missing:  # the disk check says nothing more about them
        hosts = ctx.slice.layout.names(missing)
        return FAILED, f"host {hosts} did not answer ({', '.join(sorted(set(missing.values())))}): %tpu_use revives it"
    if len(answers) == 1:
        return OK, "one host: no other clock to disagree with"
    apart, first, last = skew({h: a[0] for h, a in answers.items()}, before, after)
    name = ctx.slice.layout.name
    if apart >= SKEW_FAILED_S:
        return FAILED, (f"hosts {name(first)} and {name(last)} disagree by {apart:.0f} s: start chrony or "
                        "systemd-timesyncd on them (%tpu_run sudo systemctl restart chrony)")
    if apart >= SKEW_WARNING_S:
        return WARNING, (f"hosts {name(first)} and {name(last)} disagree by {apart:.1f} s: profiles will not "
                         "line up; sync their clocks (chrony)")
    return OK, f"{len(answers)} host clocks agree within {max(after - before, 0.001) * 1000:.0f} ms"


@check(CHECKS, "disk space")
def disk_space(ctx: Context) -> tuple[str, str] | None:
    if ctx.slice is None:
        return None
    answers = probe(ctx)[0]
    if not answers:
        return None  # the clock check named the hosts that did not answer
    low = {h: min(a[1], a[2]) for h, a in answers.items()}
    worst = min(low, key=low.get)
    where = f"host {ctx.slice.layout.name(worst)} has {format_bytes(low[worst])} free in home or temp"
    if low[worst] < DISK_FAILED_BYTES:
        return FAILED, f"{where}: free space (%tpu_run df -h ~ /tmp shows where it went)"
    if low[worst] < DISK_WARNING_BYTES:
        return WARNING, f"{where}: checkpoints or a JAX cache may not fit"
    return OK, f"at least {format_bytes(low[worst])} free on every host"
