"""Each host's last-expression value, shown once for the hosts that agree (``Out[0-3]:``)."""
from __future__ import annotations

from typing import Callable

from tpunb.display.hosts import HostNames, format_hosts
from tpunb.display.kernel import ipython_display


def render_values(results: dict, mode: str, num_hosts: int,
                  show: Callable[[dict, dict], None] = ipython_display, names: HostNames = format_hosts) -> None:
    """Show each host's last-expression value; identical values once, rich ones from host 0."""
    valued = {h: r.value for h, r in sorted(results.items()) if r.value}
    if not valued:
        return
    labelled = num_hosts > 1
    first = min(results)
    if mode == "all":
        for host, bundle in valued.items():
            _show_value([host], bundle, labelled, show, names)
        return
    if mode == "first":
        valued = {h: b for h, b in valued.items() if h == first}
    groups: dict[str, list[int]] = {}
    for host, bundle in valued.items():
        groups.setdefault(bundle.get("text/plain", ""), []).append(host)
    for text, hosts in groups.items():
        bundle = valued[first] if first in hosts else valued[hosts[0]]
        rich = first in hosts and any(k != "text/plain" for k in bundle)
        _show_value(hosts, bundle if rich else {"text/plain": text}, labelled, show, names)


def _show_value(hosts: list[int], bundle: dict, labelled: bool, show: Callable[[dict, dict], None],
                names: HostNames) -> None:
    if not labelled:
        show(bundle, {})
        return
    label = f"Out[{names(hosts)}]:"
    if set(bundle) == {"text/plain"}:
        text = bundle["text/plain"]
        show({"text/plain": f"{label}\n{text}" if "\n" in text else f"{label} {text}"}, {})
    else:
        show({"text/plain": label}, {})
        show(bundle, {})
