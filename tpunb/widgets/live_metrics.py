"""The live metrics view: per host, a sparkline and the latest value of each metric; user
metrics plotted against their step; hosts that lag or sit idle called out.

Built on the core ``ipywidgets.HTML`` widget with inline SVG rendered here: it needs no
JavaScript of its own, so it renders wherever core widgets do (JupyterLab 4, Notebook 7,
VS Code, and Colab's ipywidgets 7.7.1 without its custom widget manager). The feed thread
redraws it while the kernel runs a cell. Outside a widget front end, a text summary.
"""
from __future__ import annotations

import html
import statistics
import time
from dataclasses import dataclass

from tpunb.display.hosts import HostNames, format_hosts
from tpunb.metrics import MetricsFeed, MetricsStore
from tpunb.units import format_bytes

SYSTEM = ("cpu_percent", "process_cpu_percent", "rss_bytes", "hbm_used_bytes", "duty_cycle_percent")
PER_CHIP_SUM = {"hbm_used_bytes", "hbm_total_bytes"}  # other per-chip metrics are averaged
LABELS = {"cpu_percent": "host CPU", "process_cpu_percent": "process CPU", "rss_bytes": "process memory",
          "hbm_used_bytes": "HBM used", "duty_cycle_percent": "TensorCore duty", "memory_used_bytes": "host memory"}
POINTS = 60  # per sparkline
SCAN_LIMIT = 20_000  # newest samples a redraw reads per host, whatever the ring holds
MAX_HOSTS = 32  # rows drawn; stragglers first, then the rest in order


@dataclass(frozen=True)
class Straggler:
    host: int
    why: str


def host_series(store: MetricsStore, host: int, metrics: list[str]) -> dict[str, list[tuple[float, float]]]:
    """Per metric, the last POINTS (x, value) points from one pass over the host's newest samples:
    x is the step for user metrics that carry one, else the time; per-chip values combined."""
    wanted = set(metrics)
    points: dict[str, dict[float, list[float]]] = {m: {} for m in metrics}
    for t, m, v, _chip, step in store.newest(host, SCAN_LIMIT):
        if m in wanted:
            series = points[m]
            x = step if step is not None else t
            if x in series or len(series) < POINTS:
                series.setdefault(x, []).append(v)
    combined = {}
    for metric, series in points.items():
        combine = sum if metric in PER_CHIP_SUM else statistics.fmean
        combined[metric] = [(x, combine(vs)) for x, vs in sorted(series.items())]
    return combined


def stragglers(store: MetricsStore, num_hosts: int, interval: float, now: float | None = None) -> list[Straggler]:
    """Hosts behind the others: silent for several periods, a user step well behind the leader,
    or a process idle while the others work."""
    now = now or time.time()
    found: dict[int, str] = {}
    last_seen = {h: store.last_seen(h) for h in range(num_hosts)}
    heard = [t for t in last_seen.values() if t is not None]
    if heard:
        for host, t in last_seen.items():
            silent = now - t if t is not None else None
            if silent is None or silent > max(3 * interval, 3.0):
                found[host] = "no samples for a while" if t is None else f"silent for {silent:.0f} s"
    steps = {}
    for (host, metric, _chip), (_v, _t, step) in store.latest_items():
        if step is not None and metric not in SYSTEM:
            steps[host] = max(steps.get(host, step), step)
    if len(steps) > 1:
        leader = max(steps.values())
        for host, step in steps.items():
            if leader - step > max(1, 0.05 * leader) and host not in found:
                found[host] = f"step {step} while the leader is at {leader}"
    busy = {h: store.latest_value(h, "process_cpu_percent") for h in range(num_hosts)}
    values = [v for v in busy.values() if v is not None]
    if len(values) > 1:
        median = statistics.median(values)
        for host, value in busy.items():
            if value is not None and median > 30 and value < 0.2 * median and host not in found:
                found[host] = f"idle ({value:.0f}% CPU while the median host uses {median:.0f}%)"
    return [Straggler(h, why) for h, why in sorted(found.items())]


def chosen_metrics(store: MetricsStore, wanted: list[str] | None) -> list[str]:
    names = store.metric_names()
    if wanted:
        return [m for m in wanted if m in names] or list(wanted)
    system = [m for m in SYSTEM if m in names]
    return system + [m for m in names if m not in SYSTEM and not m.startswith("memory_") and m != "hbm_total_bytes"]


def _format(metric: str, value: float | None) -> str:
    if value is None:
        return "–"
    if metric.endswith("_bytes"):
        return format_bytes(value)
    if metric.endswith("_percent"):
        return f"{value:.0f}%"
    return f"{value:.4g}"


def sparkline(points: list[tuple[float, float]], width: int = 120, height: int = 26, colour: str = "#1a73e8") -> str:
    if len(points) < 2:
        return f'<svg width="{width}" height="{height}"></svg>'
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    dx, dy = (x1 - x0) or 1.0, (y1 - y0) or 1.0
    path = " ".join(f"{2 + (x - x0) / dx * (width - 4):.1f},{height - 2 - (y - y0) / dy * (height - 4):.1f}"
                    for x, y in points)
    return (f'<svg width="{width}" height="{height}" style="vertical-align:middle">'
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{path}"/></svg>')


def render_html(title: str, store: MetricsStore, num_hosts: int, metrics: list[str] | None,
                interval: float, names: HostNames = format_hosts) -> str:
    chosen = chosen_metrics(store, metrics)
    late = {s.host: s.why for s in stragglers(store, num_hosts, interval)}
    order = sorted(range(num_hosts), key=lambda h: (h not in late, h))[:MAX_HOSTS]
    head = "".join(f'<th style="padding:2px 8px;text-align:left" title="{html.escape(m)}">'
                   f'{html.escape(LABELS.get(m, m))}</th>' for m in chosen)
    rows = []
    for host in sorted(order):
        cells = []
        series = host_series(store, host, chosen)
        for metric in chosen:
            points = series[metric]
            value = points[-1][1] if points else None
            colour = "#d93025" if host in late else "#1a73e8"
            cells.append(f'<td style="padding:2px 8px;white-space:nowrap">{sparkline(points, colour=colour)} '
                         f'<span style="font-variant-numeric:tabular-nums">{html.escape(_format(metric, value))}</span></td>')
        label = f"<b>host {html.escape(names([host]))}</b>"
        style = "background:rgba(217,48,37,0.10)" if host in late else ""
        if host in late:
            label += f'<br><small style="color:#d93025">{html.escape(late[host])}</small>'
        rows.append(f'<tr class="tpunb-host{" tpunb-straggler" if host in late else ""}" style="{style}">'
                    f'<td style="padding:2px 8px">{label}</td>{"".join(cells)}</tr>')
    more = (f"<div><small>{num_hosts - len(order)} more hosts not drawn: Slice.metrics() has them all</small></div>"
            if num_hosts > len(order) else "")
    dropped = sum(store.dropped)
    note = (f"<div><small>{dropped} logged values were dropped on the hosts (logged faster than they are sent)"
            "</small></div>" if dropped else "")
    summary = (f'<span style="color:#d93025">stragglers: {html.escape(", ".join(names([h]) for h in sorted(late)))}</span>'
               if late else "every host keeping up")
    return (f'<div class="tpunb-metrics"><div><b>{html.escape(title)}</b> &middot; {summary} &middot; '
            f"<small>every {interval:g} s</small></div>"
            f'<table style="border-collapse:collapse"><thead><tr><th></th>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>{more}{note}</div>')


def render_text(title: str, store: MetricsStore, num_hosts: int, metrics: list[str] | None, interval: float,
                names: HostNames = format_hosts) -> str:
    chosen = chosen_metrics(store, metrics)
    late = {s.host: s.why for s in stragglers(store, num_hosts, interval)}
    lines = [title, "host  " + "  ".join(f"{m:>20}" for m in chosen)]
    for host in range(num_hosts):
        values = []
        series = host_series(store, host, chosen)
        for metric in chosen:
            points = series[metric]
            values.append(f"{_format(metric, points[-1][1] if points else None):>20}")
        lines.append(f"{names([host]):>4}  " + "  ".join(values) + (f"   <- {late[host]}" if host in late else ""))
    return "\n".join(lines)


class MetricsView:
    """``%tpu_metrics``: a widget redrawn by the slice's metrics feed; closing it unsubscribes."""

    def __init__(self, title: str, store: MetricsStore, feed: MetricsFeed, num_hosts: int,
                 metrics: list[str] | None = None, interval: float = 1.0, names: HostNames = format_hosts) -> None:
        import ipywidgets

        self.title, self.store, self.num_hosts, self.metrics, self.interval = title, store, num_hosts, metrics, interval
        self.names = names  # host labels: '3', or 's1/1' in a multislice
        self.widget = ipywidgets.HTML(value=self.render())
        self._unsubscribe = feed.subscribe(self.update)

    def render(self) -> str:
        return render_html(self.title, self.store, self.num_hosts, self.metrics, self.interval, self.names)

    def update(self, store: MetricsStore) -> None:
        self.widget.value = self.render()

    def close(self) -> None:
        self._unsubscribe()
        self.widget.close()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)
