"""The agent: one long-lived process per host session that runs cells for tpunb.

STANDARD LIBRARY ONLY. This file is shipped over the transport to hosts that may not have
tpunb installed (Python >= 3.10 is all a host needs), so it must not import tpunb or any
third-party package at module level. IPython, matplotlib and jax are used only when the host
has them, inside functions.

How it works: the session sends frames on our stdin (fd 0) and reads frames from a copy of our
original stdout. Fds 0/1/2 are then rewired, so user code, C libraries and subprocesses write
into pipes that a pump thread turns into ``stream`` frames. Cells run on the main thread; a
reader thread answers pings and delivers interrupts (SIGINT to the main thread) while a cell
runs, and starts JAX in the background when another host of the slice started it.
"""
from __future__ import annotations

import ast
import base64
import codecs
import importlib.abc
import importlib.machinery
import io
import linecache
import os
import pickle
import queue
import re
import select
import signal
import socket
import sys
import threading
import time
import traceback

try:  # on hosts the session ships the protocol module next to this one
    import tpunb_protocol as protocol
except ImportError:  # in the source tree (tests, linters)
    from tpunb import protocol

_SIGNAL_THREAD_MASK = {signal.SIGINT, signal.SIGTERM}


def _quiet_thread(target, name: str, *args) -> threading.Thread:
    """A daemon thread that never receives SIGINT, so interrupts always reach the main thread."""

    def run() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNAL_THREAD_MASK)
        target(*args)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


class Channel:
    """Frames in on one fd, frames out on another; sends are atomic across threads."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        self.in_fd, self.out_fd = in_fd, out_fd
        self._lock = threading.Lock()
        self._buf = bytearray()

    def send(self, message: dict, blob: bytes = b"") -> None:
        data = memoryview(protocol.encode(message, blob))
        with self._lock:
            while data:
                data = data[os.write(self.out_fd, data):]

    def read_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = os.read(self.in_fd, max(65536, n - len(self._buf)))
            if not chunk:
                break
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def recv(self):
        return protocol.read_frame(self.read_exact)


class OutputPump:
    """Turns everything written to fds 1 and 2 into stream frames tagged with the running cell."""

    def __init__(self, channel: Channel, drop: str | None = None) -> None:
        self.channel = channel
        self.cell_id = None
        self.drop = re.compile(drop) if drop else None  # noise the host runtime prints (simulated slices)
        self._held: dict = {}
        self._lock = threading.Lock()
        self._streams = {}
        for fd, name in ((1, "stdout"), (2, "stderr")):
            read_fd, write_fd = os.pipe()
            os.dup2(write_fd, fd)
            os.close(write_fd)
            os.set_blocking(read_fd, False)
            self._streams[read_fd] = (name, codecs.getincrementaldecoder("utf-8")("replace"))
        _quiet_thread(self._run, "tpunb-pump")

    def _run(self) -> None:
        poller = select.poll()
        for fd in self._streams:
            poller.register(fd, select.POLLIN)
        while True:
            for fd, _ in poller.poll():
                with self._lock:
                    self._read(fd)

    def _filter(self, fd: int, text: str, final: bool) -> str:
        """Drop whole lines matching ``drop``; hold back a partial line that may become one."""
        text = self._held.pop(fd, "") + text
        lines = text.split("\n")
        tail = lines.pop()
        if tail and not final and self.drop.search(tail + " Rank peer ranks"):
            self._held[fd] = tail
            tail = ""
        kept = [line + "\n" for line in lines if not self.drop.search(line)]
        if tail and not self.drop.search(tail):
            kept.append(tail)
        return "".join(kept)

    def _read(self, fd: int, final: bool = False) -> None:
        name, decoder = self._streams[fd]
        parts = []
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            if not data:
                break
            parts.append(decoder.decode(data))
        text = "".join(parts)
        if self.drop is not None:
            text = self._filter(fd, text, final)
        if text:
            self.channel.send({"op": "stream", "id": self.cell_id, "name": name, "text": text})

    def drain(self) -> None:
        """Send whatever is already written; called when a cell ends, before its ``done``."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        with self._lock:
            for fd in self._streams:
                self._read(fd, final=True)


class NoStdin(io.TextIOBase):
    """Hosts have no terminal: reading stdin explains what to do instead of hanging."""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> str:
        raise OSError("tpunb hosts have no stdin: send values with %tpu_push or Slice.push")

    readline = read


# ----------------------------------------------------------------------------------------
# Runners: how a cell's code is executed on this host.


class PlainRunner:
    """exec/eval in one namespace, for hosts without IPython."""

    kind = "plain"

    def __init__(self, agent: "Agent") -> None:
        self.agent = agent
        self.namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        self.count = 0

    def run(self, code: str) -> str:
        self.count += 1
        filename = f"<cell-{self.count}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            tree = ast.parse(code, filename)
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, filename, "exec"), self.namespace)
            if last is not None:
                value = eval(compile(last, filename, "eval"), self.namespace)
                if value is not None:
                    self.namespace["_"] = value
                    self.agent.send_result({"text/plain": repr(value)}, {})
            return "ok"
        except BaseException as exc:  # noqa: B036 - user code may raise anything
            tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # drop this frame
            lines = traceback.format_exception(type(exc), exc, tb)
            self.agent.send_error(type(exc).__name__, str(exc), "".join(lines).splitlines())
            return "interrupted" if isinstance(exc, KeyboardInterrupt) else "error"


#: anything IPython's input transformers could change: magics, shell escapes, help, prompts,
#: indented cells; cells without any of it are plain Python and skip the transformers
_NEEDS_IPYTHON = re.compile(r"[%!?]|\A\s*?^[ \t]+\S|^[ \t]*([,;/]|>>>|\.\.\.|In \[)", re.MULTILINE)


def _make_ipython_runner(agent: "Agent"):
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

        def _showtraceback(self, etype, evalue, stb):
            agent.send_error(getattr(etype, "__name__", str(etype)), str(evalue), list(stb))

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
    shell.system = shell.system_raw  # children share our fds and process group: output and Ctrl-C reach them
    for scheme in ("Linux", "linux"):
        try:
            shell.colors = scheme
            break
        except Exception:
            continue

    class IPythonRunner:
        kind = "ipython"

        def __init__(self) -> None:
            self.shell = shell
            self.namespace = shell.user_ns

        def run(self, code: str) -> str:
            result = shell.run_cell(code, store_history=True)
            error = result.error_in_exec or result.error_before_exec
            if error is None:
                return "ok"
            return "interrupted" if isinstance(error, KeyboardInterrupt) else "error"

    return IPythonRunner()


# ----------------------------------------------------------------------------------------
# JAX: initialize jax.distributed the moment any code imports jax, so the first cell already
# sees the whole slice and users never write set-up code.


class _AfterImportLoader(importlib.abc.Loader):
    def __init__(self, inner, after) -> None:
        self.inner, self.after = inner, after

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        self.after(module)


class JaxStarter(importlib.abc.MetaPathFinder):
    """Runs jax.distributed.initialize right after ``import jax``, once, with the slice's layout."""

    def __init__(self, agent: "Agent", config: dict) -> None:
        self.agent, self.config = agent, config
        self.started = threading.Event()
        self.state = "not started"

    def find_spec(self, name, path=None, target=None):
        if name != "jax" or self.started.is_set():
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _AfterImportLoader(spec.loader, self._initialize)
        return spec

    def _initialize(self, jax_module) -> None:
        if self.started.is_set():
            return
        self.started.set()
        self.state = "initializing"
        self.agent.send_event("jax_starting")
        import inspect
        import jax.distributed as distributed

        kwargs = dict(self.config.get("kwargs") or {})
        accepted = inspect.signature(distributed.initialize).parameters
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
        if self.config.get("initialize", True):
            try:
                distributed.initialize(**kwargs)
            except Exception as exc:
                self.state = f"failed: {exc}"
                self.agent.send_event("jax_failed", error=f"{type(exc).__name__}: {exc}")
                raise
        original = distributed.initialize

        def initialize(*args, **kw):
            """Already initialized by tpunb for this slice; calling it again is harmless."""
            return None

        initialize.__wrapped__ = original
        distributed.initialize = initialize
        self.state = "ready"
        self.agent.send_event("jax_ready")

    def start_in_background(self) -> None:
        """Another host started JAX: join it now, or its initialize() would wait for us."""
        if self.started.is_set() or "jax" in sys.modules:
            return

        def importer() -> None:
            try:
                import jax  # the import hook joins jax.distributed

                jax.devices()  # and the backend: hosts exchange their topologies when it starts
            except Exception:
                pass

        _quiet_thread(importer, "tpunb-jax-start")


# ----------------------------------------------------------------------------------------


class Agent:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.requests: queue.Queue = queue.Queue()
        self.current = None
        self.in_user_code = False
        self.main_ident = threading.get_ident()
        self.runner = None
        self.pump = None
        self.jax = None

    # -- frames out ---------------------------------------------------------------------
    def send(self, message: dict, blob: bytes = b"") -> None:
        self.channel.send(message, blob)

    def send_event(self, kind: str, **fields) -> None:
        self.send({"op": "event", "id": self.current, "kind": kind, **fields})

    def send_result(self, data: dict, metadata: dict) -> None:
        self.pump.drain()
        self.send({"op": "result", "id": self.current, "data": _jsonable(data), "metadata": _jsonable(metadata)})

    def send_display(self, data: dict, metadata: dict, transient: dict, update: bool) -> None:
        self.pump.drain()
        self.send({"op": "display", "id": self.current, "data": _jsonable(data),
                   "metadata": _jsonable(metadata), "transient": _jsonable(transient), "update": update})

    def send_error(self, ename: str, evalue: str, traceback_lines: list) -> None:
        self.pump.drain()
        self.send({"op": "error", "id": self.current, "ename": ename, "evalue": evalue,
                   "traceback": [str(line) for line in traceback_lines]})

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        try:
            os.setsid()  # our own process group: escalation can end us and our children together
        except OSError:
            pass
        self.send({"op": "hello", "protocol": protocol.PROTOCOL_VERSION, "pid": os.getpid(),
                   "pgid": os.getpgid(0), "python": sys.version.split()[0], "hostname": socket.gethostname()})
        frame = self.channel.recv()
        if frame is None:
            os._exit(0)
        init = frame[0]
        if init.get("op") != "init":
            os._exit(2)
        os.environ.update({k: str(v) for k, v in (init.get("env") or {}).items()})
        if init.get("cwd"):
            try:
                os.chdir(os.path.expanduser(init["cwd"]))
            except OSError:
                pass
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        self.pump = OutputPump(self.channel, init.get("drop_output"))
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stdin = NoStdin()
        signal.signal(signal.SIGINT, self._on_sigint)
        if init.get("jax"):
            self.jax = JaxStarter(self, init["jax"])
            sys.meta_path.insert(0, self.jax)
        runner_error = ""
        if init.get("ipython", True):
            try:
                _prefer_inline_matplotlib()
                self.runner = _make_ipython_runner(self)
            except Exception as exc:  # no IPython here (or a broken one): plain exec still works
                runner_error = f"{type(exc).__name__}: {exc}"
        if self.runner is None:
            self.runner = PlainRunner(self)
        _quiet_thread(self._read_loop, "tpunb-reader")
        self.send({"op": "ready", "runner": self.runner.kind, "runner_error": runner_error})

    def _on_sigint(self, signum, frame) -> None:
        if self.in_user_code:
            raise KeyboardInterrupt

    def _read_loop(self) -> None:
        while True:
            try:
                frame = self.channel.recv()
            except Exception:
                frame = None
            if frame is None:  # the session is gone: end this host session, children too
                try:
                    os.killpg(os.getpgid(0), signal.SIGTERM)
                finally:
                    os._exit(0)
            message, blob = frame
            op = message.get("op")
            if op == "ping":
                self.send({"op": "pong", "id": message.get("id"), "busy": self.current})
            elif op == "interrupt":
                if message.get("id") is not None and message.get("id") == self.current:
                    self._interrupt()
            elif op == "start_jax":
                if self.jax is not None:
                    self.jax.start_in_background()
            else:
                self.requests.put((message, blob))

    def _interrupt(self) -> None:
        """What Ctrl-C in a terminal does: SIGINT to the running code and to its child processes."""
        signal.pthread_kill(self.main_ident, signal.SIGINT)
        for pid in _children_in_group(os.getpgid(0)):
            try:
                os.kill(pid, signal.SIGINT)
            except OSError:
                pass

    def serve(self) -> None:
        while True:
            try:
                message, blob = self.requests.get()
            except KeyboardInterrupt:  # a late interrupt for a cell that already ended
                continue
            handler = getattr(self, "op_" + str(message.get("op")), None)
            if handler is None:
                self.send({"op": "done", "id": message.get("id"), "status": "error",
                           "error": f"unknown request {message.get('op')!r}"})
                continue
            handler(message, blob)

    # -- requests -------------------------------------------------------------------------
    def _as_user_code(self, message: dict, work, after=None) -> None:
        """Run ``work()`` as the request ``message`` names: interruptible, its output tagged with the
        request, then one ``done`` frame carrying what ``work`` returned (or 'interrupted')."""
        self.current = self.pump.cell_id = message["id"]
        started = time.perf_counter()
        reply = None
        try:
            self.in_user_code = True
            reply = work()
        except KeyboardInterrupt:
            pass
        finally:
            self.in_user_code = False
        if after is not None:
            try:
                after()
            except Exception:
                pass
        self.pump.drain()
        self.send({"op": "done", "id": message["id"], **(reply or {"status": "interrupted"}),
                   "seconds": time.perf_counter() - started})
        self.current = self.pump.cell_id = None

    def op_exec(self, message: dict, blob: bytes) -> None:
        self._as_user_code(message, lambda: {"status": self.runner.run(message["code"])},
                           after=lambda: _flush_figures(self))

    def op_shell(self, message: dict, blob: bytes) -> None:
        """A shell command with the host's environment; output streams, the exit code comes back."""
        import subprocess

        def run() -> dict:
            try:
                code = subprocess.call(message["command"], shell=True,
                                       executable="/bin/sh" if os.path.exists("/bin/sh") else None)
            except OSError as exc:
                print(f"cannot run the command: {exc}", file=sys.stderr)
                code = 127
            return {"status": "ok" if code == 0 else "error", "exit_code": code}

        self._as_user_code(message, run)

    def op_push(self, message: dict, blob: bytes) -> None:
        try:
            values = pickle.loads(blob)
            self.runner.namespace.update(values)
            self.send({"op": "done", "id": message["id"], "status": "ok"})
        except Exception as exc:
            self.send({"op": "done", "id": message["id"], "status": "error", "error": f"{type(exc).__name__}: {exc}"})

    def op_pull(self, message: dict, blob: bytes) -> None:
        namespace = self.runner.namespace
        missing = [name for name in message["names"] if name not in namespace]
        if missing:
            self.send({"op": "done", "id": message["id"], "status": "error",
                       "error": f"NameError: {', '.join(missing)} not defined on this host"})
            return
        try:
            data = _pickler().dumps({name: namespace[name] for name in message["names"]}, protocol=4)
        except Exception as exc:
            self.send({"op": "done", "id": message["id"], "status": "error",
                       "error": f"cannot send {', '.join(message['names'])} back: {type(exc).__name__}: {exc}"})
            return
        self.send({"op": "done", "id": message["id"], "status": "ok"}, data)

    def op_info(self, message: dict, blob: bytes) -> None:
        self.send({"op": "done", "id": message["id"], "status": "ok",
                   "jax": self.jax.state if self.jax else "not managed", "runner": self.runner.kind,
                   "pid": os.getpid(), "cwd": os.getcwd()})

    def op_shutdown(self, message: dict, blob: bytes) -> None:
        self.send({"op": "done", "id": message.get("id"), "status": "ok"})
        os._exit(0)


def _pickler():
    """cloudpickle when the host has it (functions and classes defined in cells), else pickle."""
    try:
        import cloudpickle

        return cloudpickle
    except ImportError:
        return pickle


def _children_in_group(pgid: int) -> list:
    """Processes of our group other than us (Linux /proc); elsewhere, none."""
    me, found = os.getpid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) == pgid:
                found.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _prefer_inline_matplotlib() -> None:
    """plt.show() on a host should display in the notebook, never open a window."""
    if "MPLBACKEND" in os.environ and "inline" in os.environ["MPLBACKEND"]:
        return
    import importlib.util

    if importlib.util.find_spec("matplotlib_inline") is not None:
        os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    else:
        os.environ.setdefault("MPLBACKEND", "Agg")


def _flush_figures(agent: Agent) -> None:
    """Figures drawn but not shown are sent as PNG displays at the end of the cell, as Jupyter does."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    for number in pyplot.get_fignums():
        figure = pyplot.figure(number)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", bbox_inches="tight")
        agent.send_display({"image/png": base64.b64encode(buffer.getvalue()).decode(),
                            "text/plain": repr(figure)}, {}, {}, False)
    pyplot.close("all")


def _jsonable(value):
    """Display data as JSON: bytes become base64 (as Jupyter does), unknown objects their repr."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def main() -> None:
    in_fd, out_fd = os.dup(0), os.dup(1)
    channel = Channel(in_fd, out_fd)
    agent = Agent(channel)
    agent.start()
    agent.serve()


if __name__ == "__main__":
    main()
