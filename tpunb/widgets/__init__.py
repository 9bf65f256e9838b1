"""ipywidgets views of tpunb's models. They render; they never fetch or own state."""


def in_widget_frontend() -> bool:
    """True inside a Jupyter kernel whose front end can show widgets (JupyterLab, Notebook, VS Code, Colab)."""
    try:
        from IPython import get_ipython
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None
