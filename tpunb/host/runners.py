"""How a cell's code is executed on a host: IPython's shell where the host has it, else plain exec.

Shipped to hosts: standard library only (see the package docstring); IPython and matplotlib are
imported inside functions, when the host has them.
"""
from __future__ import annotations

import ast
import base64
import io
import linecache
import marshal
import os
import re
import sys
import traceback
import types

#: the most text of one value (one mime type) a host sends; the notebook shows this much at most
VALUE_CHARS = 1_000_000
#: the most data (images, HTML, ...) of one display or value
BUNDLE_CHARS = 16_000_000

_OWN_FILES = os.path.dirname(os.path.abspath(__file__)) if os.path.isfile(__file__) else None


def _is_ours(filename: str) -> bool:
    """A frame of the agent's own modules (shipped as <tpunb:...>, or this folder in a source tree),
    or of the import machinery that ran its import hook (JAX's start)."""
    return filename.startswith(("<tpunb:", "<frozen importlib.")) or (_OWN_FILES is not None and os.path.dirname(filename) == _OWN_FILES)


def user_traceback(tb: types.TracebackType | None, ipython: bool = False) -> types.TracebackType | None:
    """The traceback without the agent's frames: users see their code, and input()'s message alone.

    ``ipython``: the traceback IPython will show (its tb_offset skips the first frame, run_code's,
    or its formatter's when a __repr__ failed); IPython's own frames after that one are dropped too."""
    frames = []
    while tb is not None:
        if not _is_ours(tb.tb_frame.f_code.co_filename):
            frames.append(tb)
        tb = tb.tb_next
    package = sys.modules.get("IPython") if ipython else None
    ipython_dir = os.path.dirname(package.__file__) + os.sep if getattr(package, "__file__", None) else None
    while ipython_dir and len(frames) > 2 and frames[1].tb_frame.f_code.co_filename.startswith(ipython_dir):
        frames.pop(1)
    pruned = None
    for frame in reversed(frames):
        pruned = types.TracebackType(pruned, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return pruned


def cap_text(text: str, limit: int = VALUE_CHARS) -> str:
    """The start of ``text`` and one line saying how much was left out."""
    if not isinstance(text, str) or len(text) <= limit:
        return text
    return (text[:limit] + f"\n[tpunb] {len(text) - limit:,} more characters of {len(text):,} not sent; "
            "fetch the value itself with %tpu_pull NAME")


def cap_exception(exc: BaseException) -> None:
    """Cut a huge exception message (``raise ValueError('e' * 300_000_000)``) before it is
    formatted: traceback printers copy it many times over, holding the GIL for seconds, and the
    host would look frozen; the notebook only ever gets the cut."""
    try:
        args = exc.args
        if not any(isinstance(a, (str, bytes, bytearray)) and len(a) > VALUE_CHARS for a in args):
            return
        exc.args = tuple(a[:VALUE_CHARS] + (f" ... [{len(a) - VALUE_CHARS:,} more characters]"
                                            if isinstance(a, str) else b" ...")
                         if isinstance(a, (str, bytes, bytearray)) and len(a) > VALUE_CHARS else a for a in args)
    except Exception:  # an exception type that will not take new args keeps its own
        pass


def cap_bundle(data: dict, text_limit: int = VALUE_CHARS, total: int = BUNDLE_CHARS) -> dict:
    """A mime bundle a notebook can take: long text cut (with a note), data over ``total`` dropped."""
    out, size = {}, 0
    for mime, value in data.items():
        if isinstance(value, str) and (mime.startswith("text/") and mime != "text/html"):
            value = cap_text(value, text_limit)
        length = len(value) if isinstance(value, str) else len(str(value))
        if size + length > total:
            continue
        out[mime], size = value, size + length
    if len(out) < len(data):
        dropped = ", ".join(m for m in data if m not in out)
        note = f"[tpunb] {dropped} output over {total:,} characters not sent"
        out["text/plain"] = (out["text/plain"] + "\n" + note) if "text/plain" in out else note
    return out


def _short_repr(value) -> str:
    """repr() of a huge str/bytes without building it whole (bytes(200_000_000) has a 800 MB repr)."""
    if isinstance(value, (str, bytes, bytearray)) and len(value) > VALUE_CHARS:
        shown = VALUE_CHARS - 200
        return (repr(value[:shown])[:shown] + f"\n[tpunb] a {type(value).__name__} of length {len(value):,}: "
                f"its repr is cut at {shown:,} characters; fetch the value itself with %tpu_pull NAME")
    return repr(value)


def cell_filename(count: int) -> str:
    return f"<cell-{count}>"


def compile_cell(code: str, filename: str) -> tuple[types.CodeType, types.CodeType | None]:
    """The cell as code to exec, and its last statement apart when it is an expression (its value
    is shown, as in a notebook); no ``__future__`` flags but the cell's own. The kernel compiles
    a cell once for every host that runs this same Python; others compile it here."""
    tree = ast.parse(code, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = compile(ast.Expression(tree.body.pop().value), filename, "eval", dont_inherit=True)
    return compile(tree, filename, "exec", dont_inherit=True), last


class PlainRunner:
    """exec/eval in one namespace, for hosts without IPython."""

    kind = "plain"

    def __init__(self, agent) -> None:
        self.agent = agent
        self.namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        self.count = 0

    def reset(self) -> None:
        """An empty namespace, as the session started with."""
        self.namespace.clear()
        self.namespace.update({"__name__": "__main__", "__builtins__": __builtins__})

    def run(self, code: str, count: int | None = None, colors: str | None = None, compiled: bytes = b"") -> str:
        """``compiled``: the cell as ``compile_cell`` made it in the kernel (marshal), for this
        same Python; compiling it here would cost a host more than the rest of a trivial cell."""
        self.count = count if count is not None else self.count + 1
        filename = cell_filename(self.count)
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            body, last = marshal.loads(compiled) if compiled else compile_cell(code, filename)
            exec(body, self.namespace)
            if last is not None:
                value = eval(last, self.namespace)
                if value is not None:
                    self.namespace["_"] = value
                    self.agent.send_result({"text/plain": _short_repr(value)}, {})
            return "ok"
        except SystemExit as exc:
            if exc.code not in (None, 0):
                print(f"exit({exc.code!r})", file=sys.stderr)
            request_exit(self.agent)
            return "ok"
        except BaseException as exc:  # noqa: B036 - user code may raise anything
            cap_exception(exc)
            lines = traceback.format_exception(type(exc), exc, user_traceback(exc.__traceback__))
            self.agent.send_error(type(exc).__name__, str(exc), "".join(lines).splitlines())
            return "interrupted" if isinstance(exc, KeyboardInterrupt) else "error"


#: anything IPython's input transformers could change: magics, shell escapes, help, prompts,
#: indented cells; cells without any of it are plain Python and skip the transformers
_NEEDS_IPYTHON = re.compile(r"[%!?]|\A\s*?^[ \t]+\S|^[ \t]*([,;/]|>>>|\.\.\.|In \[)", re.MULTILINE)


def make_ipython_runner(agent):
    """An InteractiveShell whose display hooks and tracebacks become frames (like ipykernel)."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets import Type
    from traitlets.config import Config

    class FrameDisplayHook(DisplayHook):
        def start_displayhook(self):
            self._data = None

        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            agent.send_result(format_dict, md_dict or {})

        def finish_displayhook(self):
            pass

    class FramePublisher(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kw):
            agent.send_display(data, metadata or {}, transient or {}, update)

        def clear_output(self, wait=False):
            agent.send_event("clear_output", wait=wait)

    class HostShell(InteractiveShell):
        displayhook_class = Type(FrameDisplayHook)
        display_pub_class = Type(FramePublisher)
        traceback_shown = False  # set when a traceback was sent during the current cell

        def showtraceback(self, exc_tuple=None, *args, **kwargs):
            etype, value, tb = exc_tuple or sys.exc_info()
            if value is not None:
                cap_exception(value)
                value.__traceback__ = user_traceback(tb, ipython=True)
                exc_tuple = (etype, value, value.__traceback__)
            return super().showtraceback(exc_tuple, *args, **kwargs)

        def _showtraceback(self, etype, evalue, stb):
            self.traceback_shown = True
            agent.send_error(getattr(etype, "__name__", str(etype)), str(evalue), list(stb))

        def ask_exit(self):  # exit() / quit(), as in a notebook: the session ends, a fresh one follows
            request_exit(agent)

        def enable_gui(self, gui=None):
            pass

        # IPython transforms every cell (magics, !shell, ?help, prompts, indentation) and checks it
        # for top-level await. Plain Python needs neither, and skipping them makes a trivial cell
        # about twice as cheap, which is what a 64-host slice on one machine is made of.
        def transform_cell(self, raw_cell):
            if _NEEDS_IPYTHON.search(raw_cell):
                return super().transform_cell(raw_cell)
            return raw_cell if raw_cell.endswith("\n") else raw_cell + "\n"

        def should_run_async(self, raw_cell, *args, **kwargs):
            if "await" not in raw_cell and "async" not in raw_cell:
                return False
            return super().should_run_async(raw_cell, *args, **kwargs)

    config = Config()
    config.HistoryManager.enabled = False
    config.HistoryManager.hist_file = ":memory:"
    shell = HostShell.instance(config=config)
    plain = shell.display_formatter.formatters["text/plain"]
    for kind in (str, bytes, bytearray):
        plain.for_type(kind, _pretty_short(plain.for_type(kind, None)))
    shell.system = shell.system_raw  # children share our fds and process group: output and Ctrl-C reach them
    set_colors(shell, None)

    class IPythonRunner:
        kind = "ipython"

        def __init__(self) -> None:
            self.shell = shell
            self.namespace = shell.user_ns
            self.colors: str | None = None

        def reset(self) -> None:
            """An empty namespace, as the session started with (IPython's %reset -f)."""
            shell.reset(new_session=False)

        def run(self, code: str, count: int | None = None, colors: str | None = None, compiled: bytes = b"") -> str:
            if count is not None:  # every host names the cell alike, so equal tracebacks group
                shell.execution_count = count
            if colors and colors != self.colors:  # the kernel's scheme: readable in its front end
                set_colors(shell, colors)
                self.colors = colors
            shell.traceback_shown = False
            result = shell.run_cell(code, store_history=True)
            error = result.error_in_exec or result.error_before_exec
            if error is None:  # a failing __repr__ is caught by IPython's formatters: it still fails the cell
                return "error" if shell.traceback_shown else "ok"
            return "interrupted" if isinstance(error, KeyboardInterrupt) else "error"

    return IPythonRunner()


def request_exit(agent) -> None:
    """exit() in a cell: this host's session ends when the cell is done (the kernel starts a fresh
    one at the next cell), as exit() restarts a notebook's kernel."""
    agent.exit_requested = True
    print("[tpunb] exit(): this host's session ends after this cell; the next cell starts a fresh one",
          file=sys.stderr)


def _pretty_short(default):
    """IPython's pretty printer for str and bytes, cut before a huge repr is built."""

    def pretty(value, printer, cycle) -> None:
        if len(value) > VALUE_CHARS:
            printer.text(_short_repr(value))
        elif default is not None:
            default(value, printer, cycle)
        else:
            printer.text(repr(value))

    return pretty


def set_colors(shell, scheme: str | None) -> None:
    """Colour tracebacks with the kernel's scheme (ipykernel's Neutral reads on light and dark
    themes); the first name this IPython accepts wins. Like %colors, it sets the traceback
    handlers too: on IPython 7 and 8 the trait alone does not reach them."""
    for name in (scheme, "Neutral", "neutral", "NoColor", "nocolor"):
        if not name:
            continue
        try:
            shell.colors = name
        except Exception:
            continue
        for handler in (getattr(shell, "InteractiveTB", None), getattr(shell, "SyntaxTB", None)):
            try:
                handler.set_colors(name)
            except Exception:  # IPython 9 themes follow the trait by themselves
                pass
        return


def prefer_inline_matplotlib() -> None:
    """plt.show() on a host should display in the notebook, never open a window."""
    if "MPLBACKEND" in os.environ and "inline" in os.environ["MPLBACKEND"]:
        return
    import importlib.util

    if importlib.util.find_spec("matplotlib_inline") is not None:
        os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    else:
        os.environ.setdefault("MPLBACKEND", "Agg")


def flush_figures(agent) -> None:
    """Figures drawn but not shown are sent as PNG displays at the end of the cell, as Jupyter does."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        for number in pyplot.get_fignums():
            figure = pyplot.figure(number)
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", bbox_inches="tight")
            agent.send_display({"image/png": base64.b64encode(buffer.getvalue()).decode(),
                                "text/plain": repr(figure)}, {}, {}, False)
    finally:
        pyplot.close("all")  # shown or failed, once: the next cell does not try them again
