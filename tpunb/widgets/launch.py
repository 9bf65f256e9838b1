"""Launch progress: state transitions, elapsed time and the hourly cost, as a widget or text."""
from __future__ import annotations

import html

from tpunb import report
from tpunb.widgets import in_widget_frontend


class LaunchProgress:
    """``state(name, elapsed)`` on each transition; ``done(text)`` or ``failed(text)`` at the end."""

    def __init__(self, title: str, price_per_hour: float | None, unpriced: str = "price unknown") -> None:
        """``unpriced``: what the cost says without a price (flex-start: "flex-start price not known")."""
        self.title = title
        self.cost = f"${price_per_hour:,.2f}/hour" if price_per_hour is not None else unpriced
        self.steps: list[tuple[str, float]] = []
        self._widget = None
        if in_widget_frontend():
            import ipywidgets as widgets
            from IPython.display import display

            self._widget = widgets.HTML(self._html("starting"))
            display(self._widget)
        else:
            report.info(f"{title} ({self.cost}) ...")

    def _html(self, status: str) -> str:
        steps = " &rarr; ".join(f"{html.escape(s)} <small>({t:.0f} s)</small>" for s, t in self.steps)
        return (f"<b>{html.escape(self.title)}</b> &middot; {self.cost}<br>{steps or ''}"
                f"<br><i>{html.escape(status)}</i>")

    def state(self, name: str, elapsed: float) -> None:
        self.steps.append((name, elapsed))
        if self._widget is not None:
            self._widget.value = self._html(f"{name} after {elapsed:.0f} s")
        else:
            report.info(f"  {elapsed:6.1f} s  {name}")

    def done(self, text: str) -> None:
        if self._widget is not None:
            self._widget.value = self._html(text)
        else:
            report.info(text)

    def failed(self, text: str) -> None:
        if self._widget is not None:
            self._widget.value = self._html(text)
        else:
            report.warn(text)
