"""What the IPython kernel this runs in says and shows: its colours and cell number, and raw
output (new or updated in place). Outside IPython the facts are None."""
from __future__ import annotations


def kernel_colors() -> str | None:
    """The kernel's traceback colour scheme, for hosts to use too (ipykernel's Neutral reads on
    light and dark themes, where a terminal's Linux scheme turns grey on JupyterLab's pink)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return str(getattr(shell, "colors", None) or "Neutral")


def kernel_cell_number() -> int | None:
    """The number of the notebook cell running now, so a host's traceback says ``Cell In[5]``
    for the cell the user sees as [5]; None outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return getattr(shell, "execution_count", None) if shell is not None else None


def ipython_display(data: dict, metadata: dict | None = None) -> None:
    from IPython.display import display

    display(data, raw=True, metadata=metadata or None)


def ipython_live(data: dict, display_id: str | None) -> str:
    """Show ``data`` as a new output (``display_id`` None) or update that output in place."""
    from IPython.display import display, update_display

    if display_id is None:
        return display(data, raw=True, display_id=True).display_id
    update_display(data, raw=True, display_id=display_id)
    return display_id
