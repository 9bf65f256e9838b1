"""A progress bar: an ipywidgets bar in notebooks with widgets, a text line elsewhere."""
from __future__ import annotations

import sys
import time


def _in_widget_frontend() -> bool:
    """True inside a Jupyter kernel whose front end can show widgets (JupyterLab, Notebook, VS Code, Colab)."""
    try:
        from IPython import get_ipython
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class Progress:
    """``update(done, total)`` as work goes, ``close(summary)`` at the end."""

    def __init__(self, description: str, unit: str = "B") -> None:
        self.description = description
        self.unit = unit
        self._widget = None
        self._last_text = 0.0
        if _in_widget_frontend():
            import ipywidgets as widgets
            from IPython.display import display

            self._bar = widgets.FloatProgress(value=0, min=0, max=1, description=description[:20])
            self._label = widgets.Label("")
            self._widget = widgets.HBox([self._bar, self._label])
            display(self._widget)

    def update(self, done: int, total: int) -> None:
        fraction = done / total if total else 1.0
        text = f"{_size(done)} / {_size(total)}" if self.unit == "B" else f"{done} / {total}"
        if self._widget is not None:
            self._bar.value = fraction
            self._label.value = text
        elif time.monotonic() - self._last_text >= 1.0 or done >= total:
            self._last_text = time.monotonic()
            print(f"{self.description}: {fraction:4.0%} ({text})", file=sys.stderr, flush=True)

    def close(self, summary: str) -> None:
        if self._widget is not None:
            self._bar.value = 1
            self._bar.bar_style = "success"
            self._label.value = summary
        else:
            print(summary, file=sys.stderr, flush=True)


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
