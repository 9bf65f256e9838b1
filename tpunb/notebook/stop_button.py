"""The notebook's stop button between cells. In a Jupyter kernel SIGINT is ignored while no cell
runs; once background cells exist it should stop them. ipykernel puts its own handler in place
while it runs a cell and, after, restores the one it saved (SIG_IGN): ours becomes the one it
restores. Outside a kernel (a terminal, where Ctrl-C belongs to the prompt) nothing changes."""
from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

Handler = Callable[[int | None, Any], None]


def take(handler: Handler) -> Handler | None:
    """Make ``handler`` the stop button's between cells, if this is a Jupyter kernel whose saved
    handler is still SIG_IGN; returns it when it did, else None (call again later)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    kernel = getattr(get_ipython(), "kernel", None)
    if getattr(kernel, "saved_sigint_handler", None) is signal.SIG_IGN:
        kernel.saved_sigint_handler = handler
        return handler
    return None
